"""Compiled programs kept on disk, so that a second process decoding the same model starts at once.

Under TensorFlow this is XLA's persistent cache, under JAX its compilation
cache; torch decodes eagerly and compiles nothing. gptlite's own traced
decoding programs go beside them (see `gptlite.decode.compiled`). The
folder is, in order: what `use(folder)` names, the environment variable
GPTLITE_COMPILE_CACHE (`off` turns the cache off), a folder already given to
the backend itself (TF_XLA_FLAGS, JAX_COMPILATION_CACHE_DIR, JAX's
configuration), or `gptlite/compiled` in the user's cache folder
(XDG_CACHE_HOME, or ~/.cache). Entries go in a subfolder per backend,
version and kind of CPU, so that an upgrade never reads another version's
programs, nor a machine another CPU's.

It is on by default, for a Python program as for the commands. Importing
gptlite sets nothing, and building a model touches neither the disk nor the
process; a process starts the cache (`start`) where it loads a saved model to
use it (`GPT.from_config`, which `gptlite.load` and `keras.saving.load_model`
call), starts a training run, or makes its first decode program. Under
TensorFlow, which reads where its programs go once, as its runtime starts,
`start` starts that runtime then with the folder named, and the process's
environment as it was; where the program had started TensorFlow's runtime
before (a model it built itself), XLA's programs are not kept, gptlite's own
still are. The commands call
`use()` at their start, before Keras. To keep nothing,
`gptlite.compile_cache.use(None)` first, or GPTLITE_COMPILE_CACHE=off.

The folders gptlite makes hold a file MARK; gptlite removes files (a
damaged entry, the oldest entries past LIMIT_MEGABYTES, or
GPTLITE_COMPILE_CACHE_MEGABYTES) only in folders that hold it, never in one
a user made and named.
"""

import json
import os
import pathlib
import sys

ENVIRONMENT_VARIABLE = "GPTLITE_COMPILE_CACHE"
LIMIT_VARIABLE = "GPTLITE_COMPILE_CACHE_MEGABYTES"
# How large the cache grows, in all, before its oldest entries go (a first generate of GPT-2 small's shape keeps 2.8
# MB, a server of the `cpu` preset's shape 8.7 MB; see docs/generation.md).
LIMIT_MEGABYTES = 2048
# The file that marks a folder gptlite made: the only folders where it removes files.
MARK = "MADE-BY-GPTLITE"
_TF_FLAG = "--tf_xla_persistent_cache_directory="
_chosen = None  # what use() was given: a folder, or False for off; None: not called, or the default
_DEFAULT = object()
CHECKED = "checked.json"  # the TensorFlow entries found whole, by size and time (see drop_damaged_entries)
_checked = False
_started = None  # after `start`: the folder this process keeps its programs in, or False for none


def default_folder():
    """The cache's folder when nothing names one; None when GPTLITE_COMPILE_CACHE is `off`."""
    named = os.environ.get(ENVIRONMENT_VARIABLE)
    if named is not None and named.strip().lower() in ("off", "0", "none", ""):
        return None
    if named:
        return pathlib.Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "gptlite" / "compiled"


def folder():
    """The folder compiled programs go to now, or None when the cache is off."""
    if _chosen is False:
        return None
    return _chosen if _chosen is not None else default_folder()


def use(where=_DEFAULT, backend=None):
    """Keep compiled programs in `where` (a folder), in the default folder when it is left out (see
    `default_folder`), or, with None, nowhere.

    Under TensorFlow it must come before TensorFlow's first operation; under
    JAX, at any time. `backend` defaults to Keras's, read from KERAS_BACKEND
    without importing Keras.
    """
    global _chosen
    _chosen = None if where is _DEFAULT else False if where is None else pathlib.Path(where).expanduser()
    _apply(backend)


def _apply(backend=None):
    """Tell the backend where its compiled programs go, through the environment it reads at its start: TensorFlow's
    TF_XLA_FLAGS, JAX's JAX_COMPILATION_CACHE_DIR. A folder the user gave the backend directly stands, unless
    `use` or GPTLITE_COMPILE_CACHE names another."""
    backend = backend or os.environ.get("KERAS_BACKEND", "tensorflow")
    named = _chosen is not None or ENVIRONMENT_VARIABLE in os.environ
    target = folder()
    if backend == "tensorflow":
        if not named and tensorflow_folder() is not None:
            return
        flags = [flag for flag in os.environ.get("TF_XLA_FLAGS", "").split() if not flag.startswith(_TF_FLAG)]
        made = None if target is None else _made(_versioned(target, "tensorflow"))
        if made is not None:
            flags.append(_TF_FLAG + str(made))
        if flags:
            os.environ["TF_XLA_FLAGS"] = " ".join(flags)
        else:
            os.environ.pop("TF_XLA_FLAGS", None)
    elif backend == "jax":
        if not named and "JAX_COMPILATION_CACHE_DIR" in os.environ:
            return
        made = None if target is None else _made(_versioned(target, "jax"))
        if made is None:
            os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
        else:
            os.environ["JAX_COMPILATION_CACHE_DIR"] = str(made)
            # JAX keeps only programs that took a second to compile unless told otherwise; ours take less.
            os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
            os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
        if "jax" in sys.modules:  # imported already: its configuration, not the environment, decides
            start_jax()


def start_jax():
    """Point JAX's compilation cache where the environment now says (JAX reads it at its import); for a JAX
    imported before gptlite. JAX sets up its cache at its first compile: later changes do not apply."""
    import jax

    where = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    jax.config.update("jax_compilation_cache_dir", where)
    if where is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def start(backend=None):
    """Keep this process's compiled programs on disk unless it has been told not to (see the module's docstring):
    called where a model is loaded to be used, a run starts or a first program is made, for `backend` (None: the
    one Keras runs on). Once a process; it changes no environment variable."""
    global _started
    if _started is not None:
        return
    _started = False
    backend = backend or _running_backend()
    target = folder()
    if backend == "tensorflow":
        named = tensorflow_folder()
        if named is not None:  # by `use` (a command) or by the user, before TensorFlow started: it reads it
            _started = named
        elif target is not None and _made(_versioned(target, "tensorflow")) is not None:
            _started = _versioned(target, "tensorflow")
            _start_tensorflow(_started)
    elif backend == "jax":
        import jax

        named = jax.config.jax_compilation_cache_dir
        if named:
            _started = pathlib.Path(named)
        elif target is not None and _made(_versioned(target, "jax")) is not None:
            _started = _versioned(target, "jax")
            jax.config.update("jax_compilation_cache_dir", str(_started))
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _start_tensorflow(where):
    """Start TensorFlow's runtime with XLA's cache in `where`, unless it has started: TensorFlow reads TF_XLA_FLAGS
    once, as it first looks for its devices, so the variable holds the folder just until then. A program that
    asked TensorFlow for its devices before the first model keeps XLA's programs nowhere (gptlite's own are
    kept all the same)."""
    import tensorflow as tf

    before = os.environ.get("TF_XLA_FLAGS")
    os.environ["TF_XLA_FLAGS"] = f"{before or ''} {_TF_FLAG}{where}".strip()
    try:
        # Refused once the runtime has started; before, it sets what is set already.
        tf.config.set_visible_devices(tf.config.get_visible_devices())
        tf.config.list_logical_devices()  # starts the runtime
    except RuntimeError:
        pass
    finally:
        if before is None:
            os.environ.pop("TF_XLA_FLAGS", None)
        else:
            os.environ["TF_XLA_FLAGS"] = before


def _made(where):
    """`where`, made if it is missing (and then marked as gptlite's, MARK), where it is a folder this process can
    write to; else None, and nothing is kept there: TensorFlow fails every program whose cache folder it cannot
    write (a home folder that is read-only, or a file)."""
    try:
        if not where.is_dir():
            where.mkdir(parents=True)
            (where / MARK).write_text("gptlite made this folder: it removes old or damaged entries here.\n")
    except OSError:
        return None
    return where if os.access(where, os.W_OK | os.X_OK) else None


def is_ours(where):
    """Whether gptlite made the folder `where` (and so may remove files in it)."""
    return (pathlib.Path(where) / MARK).is_file()


def _versioned(target, backend):
    """The subfolder for this backend's version on this kind of CPU: XLA's programs are machine code for the CPU
    that compiled them, and a home folder may be shared by machines with other CPUs."""
    return target / f"{backend}-{_installed_version(backend)}-{_cpu_fingerprint()}"


def _installed_version(module):
    """The version of the distribution that installed this top-level module, read without importing it: TensorFlow
    comes as `tensorflow`, `tensorflow-cpu` or `tf-nightly`, among others. The distribution named as the module is
    asked first: mapping every installed distribution's modules takes a tenth of a second, at each start."""
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        pass
    for name in metadata.packages_distributions().get(module, []):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def _cpu_fingerprint():
    """A short hash of the CPU's model and instruction-set flags."""
    import hashlib
    import platform

    described = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            lines = info.read().split("\n\n")[0].splitlines()
        described += "".join(line for line in lines if line.split(":")[0].strip() in ("model name", "flags"))
    except OSError:
        pass
    return hashlib.sha256(described.encode()).hexdigest()[:8]


def tensorflow_folder():
    """The folder TensorFlow was told to keep programs in, or None."""
    for flag in os.environ.get("TF_XLA_FLAGS", "").split():
        if flag.startswith(_TF_FLAG):
            return pathlib.Path(flag[len(_TF_FLAG):])
    return None


def programs_folder(backend):
    """Where gptlite keeps its traced decoding programs (see `gptlite.decode.compiled`) for `backend`, beside the
    backend's own compiled ones; None when the cache is off. Torch keeps none."""
    if backend == "tensorflow":
        where = tensorflow_folder() or _started
    elif backend == "jax":
        import jax

        where = jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    else:
        return None
    return None if not where else _made(pathlib.Path(where) / "gptlite-programs")


def tidy(backend=None):
    """Once a process, before its first program compiles, in the folders gptlite made: TensorFlow's damaged entries
    removed (`drop_damaged_entries`), and the oldest entries of every version's folder beside this one's while the
    cache holds more than its limit (`drop_oldest_entries`); for `backend` (None: the one Keras runs on)."""
    global _checked
    if _checked:
        return
    _checked = True
    backend = backend or _running_backend()
    where = programs_folder(backend)
    if where is None:
        return
    if backend == "tensorflow":
        drop_damaged_entries(where.parent)
    drop_oldest_entries(where.parent.parent, limit_bytes())


def limit_bytes():
    """How many bytes the cache holds at most: GPTLITE_COMPILE_CACHE_MEGABYTES, or LIMIT_MEGABYTES."""
    named = os.environ.get(LIMIT_VARIABLE, "").strip()
    try:
        return int(float(named) * 2**20) if named else LIMIT_MEGABYTES * 2**20
    except ValueError:
        return LIMIT_MEGABYTES * 2**20


def drop_oldest_entries(root, limit):
    """Remove the oldest files (by the time each was written, or read from by gptlite) of the folders gptlite made in
    `root` (one per backend, version and CPU, and their own folders) until they hold at most `limit` bytes."""
    files = []
    try:
        folders = [folder for folder in pathlib.Path(root).iterdir() if folder.is_dir() and is_ours(folder)]
        for folder in folders:
            for path in folder.rglob("*"):
                if path.is_file() and path.name != MARK and is_ours(path.parent):
                    stat = path.stat()
                    files.append((stat.st_mtime_ns, stat.st_size, path))
    except OSError:
        return  # unreadable, or changed meanwhile by another process: tidied another time
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files, key=lambda entry: entry[0]):
        if total <= limit:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size


def drop_damaged_entries(where):
    """Remove TensorFlow cache entries in `where` that are not whole, where gptlite made that folder: XLA fails,
    rather than recompiles, a program whose entry it cannot read (a write cut short, a full disk). Each entry is
    one protocol buffer: one that does not parse to its end is damaged. An entry checked before (CHECKED lists
    its size and time) is not read again."""
    where = pathlib.Path(where)
    if not where.is_dir() or not is_ours(where):
        return
    index = where / CHECKED
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    seen = {}
    for entry in where.glob("*.pb"):
        try:
            stat = entry.stat()
            mark = [stat.st_size, stat.st_mtime_ns]
            whole = known.get(entry.name) == mark or _is_whole_message(entry.read_bytes())
        except OSError:
            continue  # gone meanwhile, or unreadable: TensorFlow will say
        if whole:
            seen[entry.name] = mark
        else:
            entry.unlink(missing_ok=True)
    try:
        temporary = where / f"{CHECKED}.{os.getpid()}"
        temporary.write_text(json.dumps(seen))
        temporary.replace(index)
    except OSError:
        pass  # a read-only folder: check again next time


def _is_whole_message(data):
    """Whether `data` is a sequence of protocol buffer fields that ends exactly at its end."""
    position, end = 0, len(data)

    def varint():
        nonlocal position
        value, shift = 0, 0
        while True:
            if position >= end or shift > 63:
                raise ValueError
            byte = data[position]
            position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    try:
        while position < end:
            key = varint()
            wire_type = key & 7
            if key >> 3 == 0:
                return False
            if wire_type == 0:
                varint()
            elif wire_type == 1:
                position += 8
            elif wire_type == 2:
                length = varint()  # read before `position` is: varint moves it
                position += length
            elif wire_type == 5:
                position += 4
            else:
                return False
    except ValueError:
        return False
    return position == end and end > 0


def _running_backend():
    """The backend Keras runs on: the callers above are reached once Keras has started."""
    import keras

    return keras.backend.backend()
