"""One decode function compiled for the backend: traced once per shape of its inputs, kept on disk, and loaded,
not traced again, by every later process that decodes a model of the same architecture.

    compiled = Compiled("sample", function, model, xla=True)
    outputs = compiled(*args)     # args: arrays or tensors, None, and tuples, lists or namedtuples of them

The first call with inputs of a new shape runs `function` to trace it (`traces` counts these), turns the
traced program into bytes and loads it back from them; with a compile cache folder
(`compile_cache.programs_folder`) the bytes are written there, and a later process with inputs of the same
shape reads them instead of tracing. Under TensorFlow a program is a GraphDef whose functions keep their
compile settings (XLA or not); under JAX it is `jax.export`'s serialized StableHLO. The backend's own compile
cache (`gptlite.compile_cache`) then finds the machine code for it, so that a warm start neither traces nor
compiles. torch decodes eagerly: nothing is traced or kept, and `traces` counts the runs.

The weights are not in the program: a TensorFlow program reads the model's variables through their handles, a
JAX program takes their values, at every call. So one program serves every model of its architecture,
trained or not. An entry's name is a hash of all that a program depends on: the model's layers, their
settings and its weights' shapes; the program's kind and the shapes of its inputs; gptlite's own code;
Keras's and the backend's versions (the folder names the backend's version and the CPU). An entry that does
not read back whole (its checksum) is removed and traced again.

Loading a TensorFlow program from bytes is an optional layer over a public floor: TensorFlow has no public API
that adds a function's definition to a process and calls it by name, so it uses `tensorflow.python.eager`,
checked once by a self-test (`backend.program_bytes.private_layer`). Where that fails (a TensorFlow that changed its
internals), or GPTLITE_PRIVATE_APIS=off, each program is traced in each process with `tf.function` and called as
tf.function calls it, for its own model; nothing is kept on disk, so a second process starts slower, and a
warning says so once. JAX's programs use public APIs only (`jax.export`, `jax.jit`).
"""

import functools
import hashlib
import json
import pathlib
import threading
import weakref

import keras

from gptlite.backend import compile_cache
from gptlite.backend.program_bytes import filled, layout_of, leaves_of, structure_of, write_entry
from gptlite.backend.runtime import running
from gptlite.model.layers import layers_within

# The programs loaded in this process, by entry name: models of one architecture share them.
_loaded = {}
# The thread of the last `prepare` that started one, whichever function's: a new one starts after it has ended.
_last_preparing = None
# Held while a program is made (traced or loaded): threads that decode at once (a server's warm-up) make one program
# at a time, each once, and run theirs side by side.
_making = threading.RLock()


class Compiled:
    """A decode function compiled for the backend (see the module's docstring).

    `name` says which program it is (with the model, it names the entry on
    disk); `xla`: TensorFlow compiles it with XLA (otherwise it runs as a
    graph). `traces` counts how often `function` ran to be traced (on torch:
    how often it ran); `loads`, how many of its programs came from disk.
    """

    def __init__(self, name, function, model, xla=True):
        self.name, self.function, self.xla = name, function, xla
        self.runtime = running()  # what the backend does its own way: whether it compiles, how it traces
        self._model = weakref.ref(model)
        # What its programs read at each call; a model that gains variables (LoRA's adapters) gets new Programs,
        # and so new Compiled functions (see `programs.programs_for`).
        self._variables = model.variables
        self.traces = self.loads = 0
        self._programs = {}  # (layout, shapes) of the inputs -> a program
        self._traced_here = {}  # entry name -> a program of the public floor (see private_layer)
        self._preparing = {}  # (layout, shapes) -> the thread that runs the program once (see prepare)
        self._calls = {}  # (layout, shapes) -> how often it has been called on such inputs

    @property
    def built(self):
        """How many programs it holds, one for each shape of inputs it has met (traced, loaded or shared)."""
        return len(self._programs)

    def __call__(self, *args):
        if not self.runtime.compiles:
            self.traces += 1
            return self.runtime.run_eagerly(self.function, args)
        key, program, inputs = self._find(args)
        preparing = self._preparing.pop(key, None)
        if preparing is not None:
            preparing.join()
        self._calls[key] = self._calls.get(key, 0) + 1
        return program(self._variables, inputs)

    def calls(self, *args):
        """How often it has been called on inputs like `args` in this process."""
        return self._calls.get(self._key(args)[0], 0)

    def ready(self, *args):
        """Whether its program for inputs like `args` is made and not being prepared: a call would not wait.
        On a backend that compiles nothing (torch), never."""
        if not self.runtime.compiles:
            return False
        key, _ = self._key(args)
        preparing = self._preparing.get(key)
        return key in self._programs and (preparing is None or not preparing.is_alive())

    def prepare(self, *args, aside=False):
        """Make the program for inputs like `args` ready without waiting for it: trace or load it here, then
        run it once on `args` on a thread of its own, so that the backend compiles it (or loads its machine
        code) meanwhile; the first call with such inputs waits for that run. Nothing, where it is ready.
        `aside`: the thread traces or loads it too, after the last preparation has ended, and the caller waits
        for nothing (see `ready`)."""
        global _last_preparing
        if not self.runtime.compiles:
            return
        if aside:
            key, _ = self._key(args)
            if key in self._programs or key in self._preparing:
                return
            previous = _last_preparing

            def trace_and_run():
                if previous is not None:
                    previous.join()
                try:
                    _, program, inputs = self._find(args)
                    program(self._variables, inputs)
                except Exception:  # it stays unready: its callers go on with what they ran before
                    pass

            self._preparing[key] = _last_preparing = threading.Thread(target=trace_and_run,
                                                                      name=f"gptlite-prepare-{self.name}")
            self._preparing[key].start()
            return
        # One program prepared at a time beside the caller's work. A decode stopped before its first step (an
        # answer stopped at its first piece) leaves its run going; the next decode's would otherwise run beside it
        # and beside that decode's prefill, three programs compiling or running at once on the backend's threads.
        if _last_preparing is not None:
            _last_preparing.join()
            _last_preparing = None
        known = len(self._programs)
        key, program, inputs = self._find(args)
        if len(self._programs) == known:
            return
        variables = self._variables

        def run():
            try:
                program(variables, inputs)
            except Exception:  # the call this prepares meets the same error, and raises it
                pass

        # Not a daemon: a process that ends meanwhile waits for it rather than leaving the backend mid-compile.
        self._preparing[key] = _last_preparing = threading.Thread(target=run, name=f"gptlite-prepare-{self.name}")
        self._preparing[key].start()

    def _find(self, args):
        """(key, program, flat inputs) for `args`: the program made (traced or loaded) if it is new."""
        key, inputs = self._key(args)
        if key not in self._programs:
            with _making:
                if key not in self._programs:
                    shapes = tuple((tuple(int(size) for size in value.shape),
                                    keras.backend.standardize_dtype(value.dtype)) for value in inputs)
                    self._programs[key] = self._program(layout_of(args), shapes)
        return key, self._programs[key], inputs

    @staticmethod
    def _key(args):
        """(key, flat inputs) for `args`. Every call passes here: the key is quick to make (the containers' types,
        each array's shape and dtype as they come); the layout and standard shapes that name a program are made
        for new keys only."""
        inputs = []
        return (structure_of(args, inputs), tuple((tuple(value.shape), value.dtype) for value in inputs)), inputs

    def _program(self, layout, shapes):
        # A process keeps its programs on disk from its first on (see gptlite.compile_cache), unless told not to.
        compile_cache.start(self.runtime.name)
        model = self._model()
        entry = _entry_name(self.name, self.xla, model, layout, shapes)
        if self.runtime.traces_each_process():  # programs of this model's own, traced in this process
            if entry not in self._traced_here:  # inputs that differ only in how they come (a dtype's kind) share one
                described = {}
                self._traced_here[entry] = self.runtime.trace_here(self._flat(layout, described), shapes, self.xla,
                                                                   lambda: described["outputs"])
            return self._traced_here[entry]
        if entry in _loaded:
            return _loaded[entry]
        where = compile_cache.programs_folder(self.runtime.name)
        path = None if where is None else where / f"{entry}.program"
        program = self.runtime.read(path)
        if program is not None:
            self.loads += 1
        else:
            header, payload = self._trace(model, layout, shapes)
            program = self.runtime.load(header, payload)
            write_entry(path, header, payload)
        _loaded[entry] = program
        return program

    def _flat(self, layout, described):
        """The function of flat inputs (the arrays of `layout`) to flat outputs that the backend traces; tracing it
        counts a trace and describes the outputs' layout in `described`."""

        def flat(*inputs):
            self.traces += 1
            outputs = self.function(*filled(layout, iter(inputs)))
            described["outputs"] = layout_of(outputs)
            return leaves_of(outputs)

        return flat

    def _trace(self, model, layout, shapes):
        """Trace the function for inputs of `layout` and `shapes` -> (header, payload): the program as bytes."""
        described = {}
        flat = self._flat(layout, described)
        header, payload = self.runtime.trace(flat, model, shapes, self.xla)
        header["outputs_layout"] = described["outputs"]
        return header, payload


# --- an entry's name


def _entry_name(name, xla, model, layout, shapes):
    described = {"program": repr(name), "xla": xla, "model": _architecture(model), "inputs": layout,
                 "shapes": shapes, "code": _code_fingerprint(), "keras": keras.__version__,
                 "backend": running().name, "backend version": backend_version()}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _architecture(model):
    """What the model's programs depend on besides gptlite's code: each layer's kind and settings (LoRA's rank
    and alpha among them) and each weight's shape and dtype, in order; not the weights' values."""
    layers = []
    for layer in (model, *layers_within(model)):
        settings = {key: value for key, value in vars(layer).items()
                    if not key.startswith("_") and key != "name" and isinstance(value, (bool, int, float, str))}
        layers.append([type(layer).__module__, type(layer).__qualname__, settings, layer.dtype_policy.name])
    config = getattr(model, "config", None)
    weights = [[list(variable.shape), variable.dtype] for variable in model.variables]
    return [layers, None if config is None else repr(config), weights]


def backend_version():
    """The version of Keras's backend: a program it traced may mean something else to another version."""
    return running().version()


@functools.cache
def _code_fingerprint():
    """A hash of gptlite's own source, every folder of it (the model's layers above all): a program traced by
    other code is another program."""
    package = pathlib.Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
