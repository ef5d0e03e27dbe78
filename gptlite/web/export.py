"""A static web page that writes with a GPT in the reader's browser, and shows inside it: the model as ONNX
(`onnx_graph`: its decoding step, and every step of a forward pass), run by ONNX Runtime Web's
WebAssembly build; the tokenizer, the sampler and the decoding loop in JavaScript (`page/gptlite.js`), as
gptlite's own, so the page writes the text Python writes; the Inside view (`page/inside.js`), which shows a
trace, the inside graph's or Python's (`gptlite.trace`).

    gptlite export --model runs/mine/model.keras --format web --out site/
    python -m http.server -d site     # or any static host: no code runs on the server

The folder holds index.html, page.js, page_models.js, tokenizers.js, gptlite.js, the Inside view's scripts and
inside.css, model.onnx, inside.onnx and the weights both read (weights.bin), tokenizer.json, config.json, ONNX
Runtime Web's files (ort/, its licence beside them) and a README. Nothing is fetched from elsewhere at run time.
"""

import dataclasses
import hashlib
import json
import pathlib
import shutil

from gptlite.decode.settings import sampling_settings
from gptlite.errors import ConfigError, InputError, RunExistsError
from gptlite.files import atomic_directory
from gptlite.inside import FILM_FOLDER
from gptlite.inside.views import page_declarations
from gptlite.inside.notebook import VIEW_SCRIPTS
from gptlite.text import templates
from gptlite.web import onnx_graph, tokenizer_form

OUTTYPES = onnx_graph.OUTTYPES
DEFAULT_OUTTYPE = "f32"
PAGE_FILES = ("index.html", "page.js", "page_models.js", "tokenizers.js", *VIEW_SCRIPTS, "film.js", "inside.css",
              "server.js")
# ONNX Runtime Web 1.30.0 (npm onnxruntime-web), its WebAssembly build with SIMD: the files the page loads.
RUNTIME_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm", "LICENSE")
# The weights both graphs read, each array once: a graph's own file holds where they lie in it (ONNX's external
# data), which the page hands ONNX Runtime Web as the file it names.
WEIGHTS_FILE = "weights.bin"
# What a page with a film shows of each frame (`Film.to_json`, each frame naming its inside graph beside it).
FILM_DATA = f"{FILM_FOLDER}/film.json"
# Arrays smaller than this stay inside their graph (constants, norms' scales): one fetch, not one lookup each.
LEAST_SHARED_BYTES = 4096
# One ONNX file holds at most 2 GiB (protobuf's limit); a page's WebAssembly memory is 4 GiB.
MOST_WEIGHT_BYTES = 2**31 - 2**26
_HERE = pathlib.Path(__file__).parent / "page"


def export_web(model, out, outtype=DEFAULT_OUTTYPE, film=None):
    """Write the page's folder for a GPT or a Seq2Seq at `out`, which must not exist; the folder appears whole or
    not at all. A Seq2Seq's page writes a target for a source.

    outtype: "f32" (the default), "f16" (half the download) or "int8" (about a quarter): the page widens the
    weights to float32 as it loads them. A model the page cannot run (a tokenizer it cannot follow,
    weights past ONNX's 2 GiB) is a ConfigError saying why, before anything is written.

    film: a run's folder (or its `gptlite.film`) whose film the page shows beside the model (its film view): each
    frame's inside graph in `film/` (at `outtype`) and what the film shows of each frame (`film/film.json`).
    """
    import onnx

    if outtype not in OUTTYPES:
        raise ConfigError(f"outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    out = pathlib.Path(out)
    if out.exists():
        raise RunExistsError(f"{out} already exists; choose another `out`")
    weight_bytes = model.count_params() * {"f32": 4, "f16": 2, "int8": 1}[outtype]
    if weight_bytes > MOST_WEIGHT_BYTES:
        raise ConfigError(f"the page's model is one ONNX file, at most 2 GiB; this model's weights take "
                          f"{weight_bytes / 2**30:.1f} GiB as {outtype}" + (" (try outtype f16)" if outtype == "f32"
                                                                           else ""))
    onnx_graph.check_forms(model.config)
    page_tokenizer = tokenizer_form.web_form(model.tokenizer)
    from gptlite.inside.film import Film  # Keras: imported once a page is written

    movie = film if film is None or isinstance(film, Film) else Film(film)
    if movie is not None and reads_a_source(model):
        raise ConfigError("a film follows a GPT; a seq2seq model's page has none")
    if movie is not None:
        _check_film_fits(movie, model)
    config = page_config(model, outtype, out.name)
    config["film"] = FILM_DATA if movie is not None else None
    # A Seq2Seq's page writes a target with its inside graph, run whole at each token; a GPT's with its decoding step.
    graphs = [("inside.onnx", onnx_graph.inside_graph)] + ([] if config["source"] else [
        ("model.onnx", onnx_graph.decoder_graph)])
    with atomic_directory(out) as folder:
        stored = {}
        with open(folder / WEIGHTS_FILE, "wb") as weights:
            for name, make in graphs:
                graph = make(model, outtype)  # one graph's bytes held at a time
                _weights_apart(graph, weights, stored)
                onnx.save_model(graph, str(folder / name))
        if movie is not None:
            _write_film(movie, folder, outtype)
        (folder / "tokenizer.json").write_text(json.dumps(page_tokenizer, ensure_ascii=False))
        (folder / "config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False))
        for name in PAGE_FILES:
            shutil.copyfile(_HERE / name, folder / name)
        (folder / "ort").mkdir()
        for name in RUNTIME_FILES:
            shutil.copyfile(_HERE / "ort" / name, folder / "ort" / name)
        (folder / "README.md").write_text(_README.format(name=config["name"]))


def _check_film_fits(movie, model):
    """Refuse a film of another model's run: its frames must have the exported model's shape and vocabulary."""
    from gptlite.model.config import MODEL_SHAPE_SETTINGS

    filmed = movie.loaded(len(movie) - 1).config
    differ = [name for name in (*MODEL_SHAPE_SETTINGS, "vocab_size")
              if getattr(filmed, name, None) != getattr(model.config, name, None)]
    if differ:
        raise ConfigError(f"the film in {movie.out_dir} is of a model of another shape ({', '.join(differ)} differ): "
                          f"export the model of that run")


def _write_film(movie, folder, outtype):
    """The film's folder of the page: each frame's inside graph, whole (its weights in it), and what the film shows
    (`Film.to_json`), each frame naming its graph."""
    import onnx

    from gptlite.inside.film import frame_file

    (folder / FILM_FOLDER).mkdir()
    shown = movie.to_json()
    for index, frame in enumerate(movie.frames):
        name = f"{FILM_FOLDER}/{frame_file(frame.step, '.onnx')}"
        onnx.save_model(onnx_graph.inside_graph(movie.loaded(index), outtype), str(folder / name))
        shown["frames"][index]["graph"] = name
    (folder / FILM_DATA).write_text(json.dumps(shown, ensure_ascii=False))


def _weights_apart(graph, weights, stored):
    """Move `graph`'s large initializers into the open file `weights` (WEIGHTS_FILE), an array the other graph
    stored already (`stored`: its bytes' digest -> where it lies) not written again; each initializer then names
    its place there, as ONNX's external data does."""
    import onnx

    for tensor in graph.graph.initializer:
        if len(tensor.raw_data) < LEAST_SHARED_BYTES:
            continue
        key = (hashlib.sha256(tensor.raw_data).digest(), tensor.data_type, tuple(tensor.dims))
        if key not in stored:
            weights.write(b"\0" * (-weights.tell() % 64))  # each array at a multiple of 64 bytes
            stored[key] = (weights.tell(), len(tensor.raw_data))
            weights.write(tensor.raw_data)
        offset, length = stored[key]
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for field, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(length))):
            tensor.external_data.add(key=field, value=value)


def reads_a_source(model):
    """Whether the model reads a source through an encoder (a Seq2Seq's): its inside graph takes source_ids too,
    and its page writes a target for a source rather than continuing a prompt."""
    return "encoder_layer" in model.block_stacks


def page_config(model, outtype, name):
    """What the page reads of the model besides its weights and tokenizer: its shape, the ids a text starts with
    and those that end one, a chat model's template as pieces, and the settings' limits."""
    config, tokenizer = model.config, model.tokenizer
    chat = chat_pieces(tokenizer) if templates.template_of(tokenizer) is not None else None
    stops = [tokenizer.end_token_id] if tokenizer.end_token_id is not None else []
    if chat is not None:
        # An answer ends at the template's end of turn: one token (a turn marker) the loop stops at, or a text
        # the page cuts the answer before, as a stop string.
        end_of_turn = templates.turn_end(tokenizer)
        ids = [int(i) for i in tokenizer.encode(end_of_turn)] if end_of_turn else []
        stops += ids if len(ids) == 1 else []
        chat["stop_text"] = end_of_turn if len(ids) > 1 else None
    source = reads_a_source(model)
    if source:
        stops = [tokenizer.end_token_id]
    return dict(
        name=name, about=f"a {config.n_layer}-layer {'encoder-decoder' if source else 'GPT'} of "
                         f"{model.count_params():,} weights, {config.block_size} tokens of context, "
                         f"{tokenizer.tokens_are}; it runs in this page ({outtype})",
        n_layer=config.n_layer, n_head=config.n_head, kv_heads=config.kv_heads, head_size=config.head_size,
        block_size=config.block_size, vocab_size=config.vocab_size,
        shape={**dataclasses.asdict(config), "kv_heads": config.kv_heads, "head_size": config.head_size},
        text_start_ids=[int(i) for i in tokenizer.text_start_ids], stop_ids=sorted(set(stops)), chat=chat,
        source=source, start_id=tokenizer.start_token_id, end_id=tokenizer.end_token_id,
        # A target is written greedily unless asked otherwise, as `generate_target` writes it.
        sampling=sampling_settings(temperature=0.0) if source else sampling_settings(),
        inside=page_declarations(config, None if source else _probe(model)))


def _probe(model):
    """The ids the page scores induction on, as `gptlite.heads` does; None for a context too short to hold one."""
    from gptlite.inside.heads import probe_ids

    try:
        return probe_ids(model)
    except InputError:
        return None


def server_config(model, name, chats, film=False):
    """What the page reads of a model that `gptlite serve` runs (`server`: it writes through the server's API and
    explains with the traces the server computes): its shape, whether it reads a source or holds a conversation
    (`chats`, the server's answer), and the settings' limits. No template is read off: the server renders it."""
    config = model.config
    source = reads_a_source(model)
    return dict(
        name=name, server=True, chat=bool(chats), source=source,
        about=f"a {config.n_layer}-layer {'encoder-decoder' if source else 'GPT'} of {model.count_params():,} weights, "
              f"{config.block_size} tokens of context, {model.tokenizer.tokens_are}; served by gptlite serve",
        n_layer=config.n_layer, n_head=config.n_head, block_size=config.block_size, vocab_size=config.vocab_size,
        shape={**dataclasses.asdict(config), "kv_heads": config.kv_heads, "head_size": config.head_size},
        sampling=sampling_settings(temperature=0.0) if source else sampling_settings(),
        inside=page_declarations(config), film="/v1/film" if film else None)


def chat_pieces(tokenizer):
    """A chat template as the texts between a conversation's messages, which the page joins (`chatText` in
    gptlite.js): before the first message, after each question, after each answer, and what opens an answer.
    Read off the template by rendering conversations of sentinel messages; a template that renders a turn
    otherwise the further into the conversation it is cannot be read so, and is a ConfigError."""
    sentinels = [f"gptlite-message-{index}" for index in range(5)]

    def rendered(count):
        messages = [{"role": "user" if index % 2 == 0 else "assistant", "content": sentinels[index]}
                    for index in range(count)]
        return templates.render_for(tokenizer, messages, add_generation_prompt=True)

    three = rendered(3)
    positions = [three.index(sentinel) for sentinel in sentinels[:3]]
    before = three[:positions[0]]
    after_user = three[positions[0] + len(sentinels[0]):positions[1]]
    after_answer = three[positions[1] + len(sentinels[1]):positions[2]]
    answer_opens = three[positions[2] + len(sentinels[2]):]
    pieces = dict(before=before, after_user=after_user, after_answer=after_answer, answer_opens=answer_opens,
                  start_ids=[int(i) for i in templates.start_ids(tokenizer, three)])
    for count in (1, 5):
        joined = before + "".join((after_user if index % 2 else after_answer) * (index > 0) + sentinels[index]
                                  for index in range(count)) + answer_opens
        if joined != rendered(count):
            raise ConfigError("the web page joins a chat template's turns as texts between messages; this model's "
                              "template writes a turn otherwise the further into a conversation it is")
    return pieces


_README = """# {name}, in a web page

This folder is a static web site: a page that writes with the model `{name}` in the reader's browser, with no
server-side code and nothing fetched from elsewhere. Serve it with any static host, for example

    python -m http.server -d .

and open http://localhost:8000/. A link can carry the prompt and the settings, and `run=1` writes at once:

    http://localhost:8000/?prompt=ROMEO%3A&max_new_tokens=200&temperature=0&seed=1&run=1

and one can open the Inside view at a token, a layer, a head and a step:

    http://localhost:8000/?prompt=ROMEO%3A&token=3&layer=1&head=0&step=softmax

Files: index.html, page.js, page_models.js, tokenizers.js, gptlite.js, inside*.js, steps_*.js and inside.css (the
page, the tokenizer, the sampler, the decoding loop and the Inside view), model.onnx (the model's decoding step),
inside.onnx (its every step over a text, for the Inside view), weights.bin (the weights both graphs read),
tokenizer.json, config.json, and ort/ (ONNX Runtime Web 1.30.0's WebAssembly build, MIT licence in ort/LICENSE).
Written by gptlite's `gptlite export --format web`.
"""
