"""A GPT on conversations: one JSON Lines file of them (a tenth held out, or a `val_file`) or a built-in
synthetic task, rendered through the model's chat template and packed into rows, with the loss on the answers'
tokens alone; its score is how many held-out last answers it writes exactly."""

import dataclasses

from gptlite.data import CHAT_SYNTHETIC_TASKS, chat_tasks, conversations, lm
from gptlite.decode import chat
from gptlite.errors import ConfigError
from gptlite.evaluation import scores
from gptlite.model.config import lora_targets
from gptlite.tasks import chat_sizing
from gptlite.tasks.language import fitted_tokenizer, LanguageModel
from gptlite.tasks.task import Sizing, Training, VAL_FILE_REFUSAL
from gptlite.text import templates
from gptlite.weights import pretrained


@dataclasses.dataclass
class Conversations:
    """A chat run's conversations, and the text a new tokenizer learns (their messages')."""

    conversations: list  # the ones to train on
    held_out: list  # questions to check the answers of: [(messages, answer)]
    name: str
    validation: list = None  # a file's conversations held out, whose loss validates; a synthetic task has none
    tokenizer: object = None  # a new model's BPE tokenizer, where sizing the run learned it

    def corpus(self):
        return lm.Corpus.from_text("".join(message["content"] for conversation in self.conversations
                                           for message in conversation), self.name)


class Chat(LanguageModel):
    """A GPT that learns to answer in conversations."""

    name = "chat"
    called = "a chat model"
    synthetic = CHAT_SYNTHETIC_TASKS

    def owns(self, model):
        return not model.writes_targets and model.chats

    def check(self, asked):
        if len(asked.sources) != 1 if not asked.synthetic else asked.sources:
            raise ConfigError("a chat model trains on one JSON Lines file of conversations, or on a `synthetic` "
                              "task (and then on no file)")
        if asked.val_file is not None and asked.synthetic:  # a synthetic task holds out its own questions
            raise ConfigError(VAL_FILE_REFUSAL)

    def read(self, asked, seed, new_model, say):
        """The conversations: a synthetic task's, or a file's with a tenth held out (or `val_file`'s); a new model
        that names no preset is sized from them (`chat_sizing`), its tokenizer chosen by their answers' words
        unless given."""
        if asked.synthetic:
            made = chat_tasks.synthetic(asked.synthetic, seed)
            data = Conversations(made.conversations, made.held_out, f"the synthetic {asked.synthetic} conversations")
        else:
            read = conversations.read_conversations(asked.sources[0], asked.encoding)
            if asked.val_file is not None:
                train, validation = read, conversations.read_conversations(asked.val_file, asked.encoding)
            else:
                train, validation = conversations.hold_out(read, seed=seed)
            data = Conversations(train, conversations.last_answers(validation), str(asked.sources[0]), validation)
        if not new_model or asked.preset is not None:
            return data, None
        tokenizer, reading = asked.tokenizer, None
        if tokenizer is None:
            tokenizer, reading = chat_sizing.chat_tokenizer(
                conversations.repeated_answer_words(data.conversations, chat_sizing.CHAT_REPEATED))
        # Sized by the tokens the model will read: the tokenizer is fitted first (a BPE vocabulary learned), then
        # counted with.
        data.tokenizer = fitted_tokenizer(data.corpus(), tokenizer, asked.vocab_size, True, say)
        sized, line = chat_sizing.chat_settings(
            conversations.default_template_lengths(data.conversations, data.tokenizer), reading)
        return data, Sizing(sized, chat_sizing.CHAT_PRESET, line)

    def tokenizer(self, plan, data, say):
        """A new model's tokenizer: the one sizing learned, else fitted to the messages' text (a BPE keeps each
        digit a token of its own); the template's markers are added after."""
        if data.tokenizer is not None:
            return data.tokenizer
        return fitted_tokenizer(data.corpus(), plan.tokenizer, plan.asked.vocab_size, True, say)

    def adapted(self, model, plan, say):
        """A model without a chat template gets the default one, its turn markers new tokens (a resumed run's
        has it already)."""
        if plan.checkpoint:
            return model
        had_template = model.tokenizer is not None and model.tokenizer.chat_template is not None
        model = pretrained.chat_ready(model, plan.seed)
        if not had_template:
            config = plan.training_config
            frozen = config.lora_rank and "embedding" not in lora_targets(config.lora_targets)
            say("the model gets gptlite's chat template; its turn markers are new tokens: "
                + " ".join(templates.TURN_MARKERS)
                # benchmarks/journal.md, "Chat tasks": a small base's adapters learned nothing of a task in 750 steps
                # with the embedding frozen (the markers' rows as made, digits it never read), and learned
                # with it trained.
                + ("\nLoRA leaves the embedding frozen, the new markers' rows too: add embedding to "
                   "lora_targets to train it whole beside the adapters" if frozen else ""))
        return model

    def training(self, plan, model, data, say, make_folder):
        """The conversations packed into train and validation rows, before the folder is made (a refusal leaves
        an earlier run as it is), and the held-out questions each evaluation answers."""
        tokenizer, block_size = model.tokenizer, model.config.block_size
        long = plan.asked.long_conversations
        if data.validation is None:  # a synthetic task: its validation rows come from its training conversations
            rows = conversations.pack(tokenizer, data.conversations, block_size, long)
            train_rows, validation_rows = conversations.split(rows, seed=plan.seed)
            packed = f"packed into {len(rows):,} rows"
        else:
            train_rows, validation_rows = (conversations.pack(tokenizer, chosen, block_size, long)
                                           for chosen in (data.conversations, data.validation))
            rows = train_rows
            packed = (f"and {len(data.validation):,} held out, packed into "
                      f"{len(train_rows) + len(validation_rows):,} rows")
        make_folder()
        answers = int(train_rows.trained[:, 1:].sum())
        cut = train_rows.cut + (validation_rows.cut if data.validation is not None else 0)
        line = (f"training on {data.name}: {rows.conversations:,} conversations ({tokenizer.tokens_are}, "
                f"{tokenizer.vocabulary_size:,} in the vocabulary) {packed} of {block_size + 1} tokens, "
                f"{answers:,} of the training tokens answers' (the loss counts those); "
                f"{len(train_rows):,} rows train / {len(validation_rows):,} validation"
                + (f"; {cut:,} conversations longer than the context were cut" if cut else ""))
        metrics = {}
        if data.held_out:
            checked = data.held_out[:chat.EVALUATED_QUESTIONS]
            metrics["exact_answers"] = lambda trained: chat.exact_answers(trained, checked)
        return Training(train_rows, validation_rows, line, metrics, self.sampler(plan),
                        held_out=data.held_out)

    def closing_words(self, run, shown=8):
        """How many held-out questions the final model answers exactly (greedy), a few of its answers, and how to
        talk with it."""
        questions = run.held_out
        if questions:
            answered, exact = chat.greedy_answers(run.model, questions)
            yield (f"the final model answers {sum(exact):,} of {len(questions):,} held-out questions exactly "
                   f"({sum(exact) / len(questions):.0%}, greedy); a few:\n")
            for (messages, want), got, right in list(zip(questions, answered, exact))[:shown]:
                yield f"  {messages[-1]['content']!r} -> {got!r}" + ("" if right else f"   (expected {want!r})") + "\n"
        yield f"talk with it: gptlite chat {run.out_dir / 'model.keras'}\n"

    def request_refusal(self, field):
        return None  # a conversation, a completion's extras and the attention view: a chat model takes each

    def batches(self, data, block_size, batch_size, count, **kwargs):
        return conversations.ConversationBatches(data, batch_size, count, **kwargs)

    def ignored_class(self, model):
        return conversations.IGNORED  # every token but the answers'

    def characters_per_token(self, tokenizer, validation):
        if tokenizer is None:
            return None
        answers = validation.ids[:, 1:][validation.trained[:, 1:]]  # the answers' tokens, the ones predicted
        characters = tokenizer.character_count(answers)
        return characters / len(answers) if characters and len(answers) else None

    def evaluate(self, model, sources, encoding, errors, unknown, verbose):
        """Conversations files (.jsonl) are scored as conversations; text files as a language model's text."""
        if not all(str(source).endswith(".jsonl") for source in sources):
            return super().evaluate(model, sources, encoding, errors, unknown, verbose)
        sets = [(str(source), conversations.read_conversations(source, encoding)) for source in sources]
        return scores.evaluate_conversations(model, sets, verbose)
