"""`gptlite export`: the forms a model is written in for other programs (`EXPORT_FORMATS`, each written by a
module of `weights/`, or the web page's of `web/`), and `export`, which writes one whole or not at all.

Plain Python: the command line reads the choices below before it starts a backend.
"""

import contextlib
import dataclasses
import importlib
import json
import os
import pathlib
import tempfile

from gptlite.errors import ConfigError, RunExistsError
from gptlite.weights import GGUF_OUTTYPES


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    """A form `gptlite export` writes: the module that writes it (named within gptlite: "weights.gguf_export";
    the web page's is in a room of its own, "web.export") and its function there
    (`function(model, out)`, or `function(model, out, outtype)` where it has `outtypes`), what it is, what the
    command says once it is written (`said`: {out}, {name} the file's or folder's name, {mib} its size, and
    {architecture}, the architecture a Hugging Face config.json names), how it may store its matrices
    (`outtypes`, the function's own default where none is asked; `outtype_help`) and what refuses, before a model
    loads, what cannot work (`check`, a function of its module)."""

    module: str
    function: str
    help: str
    said: str
    outtypes: tuple = ()
    outtype_help: str = None
    check: str = None


# Every form `gptlite export` writes, by its `format`, the default first. A new form is one module and
# one line here: the command's choices, its help and its refusals are made from them.
EXPORT_FORMATS = {
    "saved_model": ExportFormat(
        "weights.saving", "export_saved_model", "a TensorFlow SavedModel, token ids in, next-token logits out (the "
        "default)",
        "wrote {out}: load it with tf.saved_model.load; its 'serve' signature maps token_ids (batch, up to the "
        "model's context, int32) to the next token's logits", check="check_export_backend"),
    "gguf": ExportFormat(
        "weights.gguf_export", "export_gguf", "one GGUF file that llama.cpp, Ollama and LM Studio run",
        "wrote {out} ({mib:.1f} MiB): run it with llama.cpp (llama-cli -m {out}), or in Ollama with a Modelfile of "
        "one line, FROM ./{name}", outtypes=GGUF_OUTTYPES,
        outtype_help="how the weight matrices are stored: f32, f16 (the default: half the size) or q8_0 (8-bit, "
                     "about a quarter)"),
    "hf": ExportFormat(
        "weights.pretrained", "export_hugging_face", "a Hugging Face folder, GPT-2 for GPT-2's layout, Llama, Qwen2 or "
        "Qwen3 for a Llama-family one (transformers' AutoModelForCausalLM and AutoTokenizer load it)",
        "wrote {out}, a {architecture}: load it with transformers.AutoModelForCausalLM.from_pretrained and "
        "AutoTokenizer.from_pretrained"),
    "web": ExportFormat(
        "web.export", "export_web", "a static web page that writes with the model in the reader's browser (ONNX, "
        "ONNX Runtime Web): no server-side code", "wrote {out} ({mib:.1f} MiB): serve it with any static host "
        "(python -m http.server -d {out}) and open it in a browser", outtypes=("f32", "f16", "int8"),
        outtype_help="the model's weights as f32 (the default), f16 (half the download) or int8 (about a quarter), "
                     "widened to f32 as the page loads them"),
    "kerashub": ExportFormat(
        "weights.gpt2", "export_kerashub", "a KerasHub GPT-2 preset (GPT2CausalLM.from_preset)",
        "wrote {out}: load it with keras_hub.models.GPT2CausalLM.from_preset"),
}


def check_export(format, outtype=None, film=False):
    """Refuse, before a model is loaded, an export that cannot be written: an unknown `format`, an `outtype` the
    format does not take, a film where the format shows none, a backend it cannot be written from."""
    if format not in EXPORT_FORMATS:
        raise ConfigError(f"format must be one of {', '.join(EXPORT_FORMATS)}, got {format!r}")
    if film and format != "web":
        raise ConfigError(f"a film is shown by the web page alone; leave out `film` with format {format}")
    chosen = EXPORT_FORMATS[format]
    if outtype is not None and outtype not in chosen.outtypes:
        if chosen.outtypes:
            raise ConfigError(f"outtype must be one of {', '.join(chosen.outtypes)}, got {outtype!r}")
        takers = "|".join(name for name, kind in EXPORT_FORMATS.items() if kind.outtypes)
        raise ConfigError(f"`outtype` is for `format={takers}`: how its weight matrices are stored")
    if chosen.check is not None:
        getattr(importlib.import_module(f"gptlite.{chosen.module}"), chosen.check)()


def export(model, format, out, outtype=None, overwrite=False, film=None):
    """Write `model` in `format` (one of EXPORT_FORMATS) to `out`; what to say of it. `film`: with the web format,
    a run's folder whose film the page shows (`web.export.export_web`).

    An existing `out` is a RunExistsError, unless `overwrite`: then the new export is written whole beside it and
    takes its place only once it is complete, so a failure leaves the earlier one as it was. Even so, a folder
    that holds a model file (.keras), or the working folder or one above it, is never replaced.
    """
    check_export(format, outtype, film is not None)
    chosen, out = EXPORT_FORMATS[format], pathlib.Path(out)
    if out.exists():
        if not overwrite:
            raise RunExistsError(f"{out} already exists; choose another `out`, or set `overwrite`")
        _check_replaceable(out)
    write = getattr(importlib.import_module(f"gptlite.{chosen.module}"), chosen.function)
    with _beside(out) as target:
        options = {**({"outtype": outtype} if outtype is not None else {}),
                   **({"film": film} if film is not None else {})}
        write(model, target, **options)
        said = chosen.said.format(out=out, name=out.name, mib=_size(target) / 2**20,
                                  architecture=_architecture(target))
        _replace(target, out)
    return said


def _check_replaceable(out):
    if out.is_dir():
        here, folder = pathlib.Path.cwd().resolve(), out.resolve()
        if folder == here or folder in here.parents:
            raise ConfigError(f"{out} is the working folder or holds it; `overwrite` replaces an earlier export, "
                              f"not that")
        model_file = next(folder.rglob("*.keras"), None)
        if model_file is not None:
            raise ConfigError(f"{out} holds a model file ({model_file.name}); `overwrite` replaces an earlier "
                              f"export, never a model")


@contextlib.contextmanager
def _beside(out):
    """A path named as `out`, in a new hidden folder beside it (removed afterwards, with whatever is left in it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as folder:
        yield pathlib.Path(folder) / out.name


def _replace(new, out):
    """`new` in `out`'s place: a file in one rename; a folder by setting the old one aside first."""
    if out.exists() and out.is_dir() != new.is_dir():
        raise ConfigError(f"{out} is a {'folder' if out.is_dir() else 'file'}; this format writes a "
                          f"{'folder' if new.is_dir() else 'file'}")
    if not out.is_dir():
        os.replace(new, out)
        return
    aside = new.with_name(new.name + ".earlier")  # in the hidden folder, removed with it
    os.replace(out, aside)
    os.replace(new, out)


def _size(path):
    return path.stat().st_size if path.is_file() else sum(part.stat().st_size for part in path.rglob("*")
                                                          if part.is_file())


def _architecture(folder):
    """The architecture a Hugging Face folder's config.json names, or None."""
    try:
        return json.loads((folder / "config.json").read_text())["architectures"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
