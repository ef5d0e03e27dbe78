"""Files: writing any file so that a crash cannot break it, and reading text and JSON files.

Nothing here imports Keras, so every other module may use it.
"""

import contextlib
import json
import os
import pathlib
import tempfile
import zipfile

from gptlite.errors import InputError, MissingFileError, RunExistsError


@contextlib.contextmanager
def atomic_path(path, sync=True):
    """Yield a temporary path beside `path`; on success it replaces `path` in one rename.

    A crash part-way leaves the earlier file untouched, never a half-written one.
    With `sync`, the file is on disk before the rename, so that a power cut
    cannot leave it empty either. The temporary name keeps the final
    suffixes (".weights.h5"), since Keras checks them.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffixes = "".join(path.suffixes)
    stem = path.name[: len(path.name) - len(suffixes)]
    handle, temporary = tempfile.mkstemp(prefix=f".{stem}.", suffix=suffixes, dir=path.parent)
    os.close(handle)
    os.chmod(temporary, 0o666 & ~_current_umask())  # mkstemp makes it owner-only
    try:
        yield pathlib.Path(temporary)
        if sync:
            sync_file(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def sync_file(path):
    """Have the file at `path` on disk (its contents: what a rename after it points to)."""
    with open(path, "rb") as written:
        os.fsync(written.fileno())


@contextlib.contextmanager
def atomic_directory(path):
    """Yield a temporary folder beside `path`; on success it becomes `path` in one rename.

    The folder appears whole or not at all. An existing `path` is never
    replaced: it is a `RunExistsError`, raised before anything is written.
    """
    path = pathlib.Path(path)
    if path.exists():
        raise RunExistsError(f"{path} already exists; choose another folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as temporary:
        written = pathlib.Path(temporary) / "written"
        written.mkdir()
        yield written
        os.replace(written, path)


def _current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def not_decodable(path, encoding, raw, offset, line):
    """The InputError for a byte at `offset` (line `line`) of `path` that `encoding` cannot decode."""
    return InputError(
        f"{path} is not valid {encoding}: byte {offset} (line {line}) is {raw!r}; convert the file to "
        f"{encoding}, name its encoding in `encoding`, or set `errors='replace'`"
    )


def check_exists(paths):
    """Refuse, in one line, the first of `paths` that is not there."""
    for path in map(pathlib.Path, paths):
        if not path.exists():
            raise MissingFileError(f"no such file: {path}")


def read_text(path, encoding="utf-8", errors="strict"):
    """The whole file as a string, or a `GPTLiteError` that says what is wrong with it.

    `errors="replace"` decodes bad bytes as U+FFFD instead of refusing the file.
    """
    path = pathlib.Path(path)
    check_exists([path])
    if path.is_dir():
        raise InputError(f"{path} is a folder; give a text file")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from None
    try:
        text = raw.decode(encoding, errors)
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise not_decodable(path, encoding, raw[error.start:error.start + 1], error.start, line) from None
    except LookupError:
        raise InputError(f"unknown text encoding {encoding!r}") from None
    if not text.strip():
        raise InputError(f"{path} has no text in it")
    return text


def read_json(path):
    """A JSON file's contents, or an `InputError` naming the file where it is not JSON (or not UTF-8)."""
    try:
        return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise InputError(f"{path} is not valid JSON: {error}") from None


def saved_dtype_policy(path):
    """The name of the dtype policy a .keras file's model computes in ("float32", "mixed_bfloat16", ...), read
    from its config.json without Keras; None where the file cannot be read so (loading it says why)."""
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
        return config["config"]["dtype"]["config"]["name"]
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile):
        return None


def check_model_file(path):
    """Refuse a path that is not a model file: missing, a folder, or not a zip archive (as a .keras file is)."""
    path = pathlib.Path(path)
    if not path.exists():
        raise MissingFileError(f"no such model file: {path}")
    if path.is_dir():
        raise InputError(f"{path} is a folder; give the model.keras file inside it")
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path} is not a .keras model file (not a zip archive)")
