"""Chat templates: a conversation as the text a model reads, and back.

A conversation is a list of messages, each {"role": "system" | "user" |
"assistant", "content": text}, in OpenAI's shape. A chat template is a Jinja
template, the kind Hugging Face models carry in tokenizer_config.json, that
renders one into text; it is rendered here as transformers renders it (a
sandboxed Jinja environment, trim_blocks and lstrip_blocks, `raise_exception`
and `tojson`), so the same template gives the same text.

A model without a template gets `DEFAULT_TEMPLATE`, whose turn markers
(`TURN_MARKERS`) are tokens of their own, added to its tokenizer:

    <|system|>Be brief.<|end|><|user|>What is 2 + 3?<|end|><|assistant|>5<|end|>

An answer ends at its end-of-turn text (`turn_end`): the token the template
writes after an answer (the default template's "<|end|>", ChatML's
"<|im_end|>"), or else the end-of-text token.
"""

import datetime
import functools
import json

from gptlite.errors import InputError

ROLES = ("system", "user", "assistant")
TURN_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
END_OF_TURN = "<|end|>"
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def check_messages(messages, where="the conversation"):
    """The messages as plain {"role", "content"} dicts, or an InputError naming what is wrong and `where`."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InputError(f"{where}: `messages` must be a non-empty list of messages")
    checked = []
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            raise InputError(f"{where}: message {number} is not an object with a role and a content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise InputError(f"{where}: message {number} has role {role!r}; the roles are {', '.join(ROLES)}")
        if isinstance(content, list):  # OpenAI's content parts: the text ones, joined
            if not all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                       for part in content):
                raise InputError(f"{where}: message {number} has content parts other than text")
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise InputError(f"{where}: message {number} has no text `content`")
        checked.append({"role": role, "content": content})
    if any(message["role"] == "system" for message in checked[1:]):
        raise InputError(f"{where}: a system message may only come first")
    return checked


def render(template, messages, add_generation_prompt=False, **special_tokens):
    """The text of `messages` under `template`; with `add_generation_prompt`, followed by what opens an
    answer. `special_tokens` (bos_token="<s>", eos_token="</s>", ...) are given to the template by name."""
    try:
        return _compiled(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          **special_tokens)
    except InputError:
        raise
    except Exception as error:  # the template's own error (raise_exception) or a broken template
        raise InputError(f"the chat template could not render the conversation: {error}") from None


@functools.lru_cache(maxsize=16)
def _compiled(template):
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise InputError(f"the chat template refuses the conversation: {message}")

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.datetime.now().strftime(format)
    try:
        return environment.from_string(template)
    except TemplateError as error:
        raise InputError(f"the chat template is not valid Jinja: {error}") from None


def parse_default(text):
    """The messages of a text the default template rendered (the inverse of rendering them with it)."""
    messages = []
    rest = text
    while rest:
        role = next((role for role in ROLES if rest.startswith(f"<|{role}|>")), None)
        end = rest.find(END_OF_TURN)
        if role is None or end < 0:
            raise InputError(f"not a conversation in the default template's form: {rest[:40]!r}")
        messages.append({"role": role, "content": rest[len(role) + 4:end]})
        rest = rest[end + len(END_OF_TURN):]
    return messages


def template_of(tokenizer):
    """The tokenizer's chat template, or None."""
    return getattr(tokenizer, "chat_template", None)


def special_tokens_of(tokenizer):
    """What a template may name: bos_token and eos_token, where the tokenizer has them."""
    tokens = {}
    for name, attribute in (("bos_token", "begin_token"), ("eos_token", "end_token")):
        if getattr(tokenizer, attribute, None) is not None:
            tokens[name] = getattr(tokenizer, attribute)
    return tokens


def render_for(tokenizer, messages, add_generation_prompt=False):
    """`messages` under the tokenizer's template; an InputError for a tokenizer with none."""
    template = template_of(tokenizer)
    if template is None:
        raise InputError("the model has no chat template: it continues text and cannot hold a conversation; "
                         "fine-tune it on conversations first (task 'chat')")
    return render(template, check_messages(messages), add_generation_prompt, **special_tokens_of(tokenizer))


def answer_prompt_ids(tokenizer, messages):
    """The ids a model reads before its answer to `messages`: the conversation and what opens an answer."""
    return rendered_ids(tokenizer, render_for(tokenizer, messages, add_generation_prompt=True))


def rendered_ids(tokenizer, text):
    """The ids of a conversation's rendered text, as the model reads it."""
    return [*start_ids(tokenizer, text), *(int(token) for token in tokenizer.encode(text))]


def start_ids(tokenizer, text):
    """The beginning-of-text ids a conversation's text needs, unless its template writes them itself."""
    begin = getattr(tokenizer, "begin_token", None)
    return [] if begin is not None and text.startswith(begin) else list(tokenizer.text_start_ids)


def turn_end(tokenizer):
    """The text that ends an answer: the first of the tokenizer's added tokens that its template writes after an
    answer ("<|end|>" for the default template, "<|im_end|>" for ChatML's), else its end-of-text token's text
    (None without either)."""
    template = template_of(tokenizer)
    added = [token for token in getattr(tokenizer, "added_tokens", ()) if token]
    if template is not None and added:
        sentinel = "gptlite-answer-sentinel"
        conversation = [{"role": "user", "content": "question"}, {"role": "assistant", "content": sentinel}]
        try:
            text = render(template, conversation, **special_tokens_of(tokenizer))
        except InputError:
            text = ""
        after = text[text.find(sentinel) + len(sentinel):] if sentinel in text else ""
        written = [token for token in added if token in after]
        if written:
            return min(written, key=after.find)
    end = getattr(tokenizer, "end_token", None)
    if end is None and getattr(tokenizer, "end_token_id", None) is not None:
        end = tokenizer.decode([tokenizer.end_token_id])
    return end or None
