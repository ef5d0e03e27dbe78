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
checked once by a self-test (`private_layer`). Where that fails (a TensorFlow that changed its internals), or
GPTLITE_PRIVATE_APIS=off, each program is traced in each process with `tf.function` and called as tf.function
calls it, for its own model; nothing is kept on disk, so a second process starts slower, and a warning says so
once. JAX's programs use public APIs only (`jax.export`, `jax.jit`).
"""

import functools
import hashlib
import importlib
import json
import os
import pathlib
import tempfile
import threading
import warnings
import weakref

import keras
import numpy as np

from gptlite.backend import compile_cache, notices
from gptlite.model.layers import layers_within

_MAGIC = b"gptlite program 1\n"
# Set to "off", the optional layers over private APIs are left off (see the module's docstring).
PRIVATE_APIS_VARIABLE = "GPTLITE_PRIVATE_APIS"
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
        self.backend = keras.backend.backend()
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
        if self.backend == "torch":
            import torch

            self.traces += 1
            with torch.no_grad():  # eager torch would otherwise record every step for a backward pass
                return self.function(*args)
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
        On torch, which compiles nothing, never."""
        if self.backend == "torch":
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
        if self.backend == "torch":
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
                    self._programs[key] = self._program(_layout(args), shapes)
        return key, self._programs[key], inputs

    @staticmethod
    def _key(args):
        """(key, flat inputs) for `args`. Every call passes here: the key is quick to make (the containers' types,
        each array's shape and dtype as they come); the layout and standard shapes that name a program are made
        for new keys only."""
        inputs = []
        return (_structure(args, inputs), tuple((tuple(value.shape), value.dtype) for value in inputs)), inputs

    def _program(self, layout, shapes):
        model = self._model()
        entry = _entry_name(self.name, self.xla, model, layout, shapes)
        if self.backend == "tensorflow" and not private_layer():  # the public floor: programs of this model's own
            if entry not in self._traced_here:  # inputs that differ only in how they come (a dtype's kind) share one
                self._traced_here[entry] = self._traced_tensorflow(model, layout, shapes)
            return self._traced_here[entry]
        if entry in _loaded:
            return _loaded[entry]
        where = compile_cache.programs_folder(self.backend)
        path = None if where is None else where / f"{entry}.program"
        program = _read(path, self.backend)
        if program is not None:
            self.loads += 1
        else:
            header, payload = self._trace(model, layout, shapes)
            program = _load(self.backend, header, payload)
            _write(path, header, payload)
        _loaded[entry] = program
        return program

    def _flat(self, layout, described):
        """The function of flat inputs (the arrays of `layout`) to flat outputs that the backend traces; tracing it
        counts a trace and describes the outputs' layout in `described`."""

        def flat(*inputs):
            self.traces += 1
            outputs = self.function(*_filled(layout, iter(inputs)))
            described["outputs"] = _layout(outputs)
            return _leaves(outputs)

        return flat

    def _trace(self, model, layout, shapes):
        """Trace the function for inputs of `layout` and `shapes` -> (header, payload): the program as bytes."""
        described = {}
        flat = self._flat(layout, described)
        if self.backend == "tensorflow":
            header, payload = _trace_tensorflow(flat, model, shapes, self.xla)
        else:
            header, payload = _trace_jax(flat, model, shapes)
        header["outputs_layout"] = described["outputs"]
        return header, payload

    def _traced_tensorflow(self, model, layout, shapes):
        """The public floor under TensorFlow: the function traced by tf.function and called as tf.function calls
        it. It reads the weights of `model`, the one it was traced with."""
        import tensorflow as tf

        described = {}
        specs = [tf.TensorSpec(shape, dtype) for shape, dtype in shapes]
        traced = tf.function(self._flat(layout, described), jit_compile=self.xla,
                             autograph=False).get_concrete_function(*specs)
        return _TensorFlowProgram(traced, [], described["outputs"])  # it reads no weights as inputs: its own


# --- the nested inputs and outputs, as a flat list of arrays and a layout


def _layout(structure):
    """A JSON description of a nested structure: its containers, None as None and each array as 0."""
    if structure is None:
        return None
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        kind = type(structure)
        return {"namedtuple": f"{kind.__module__}:{kind.__qualname__}", "items": [_layout(x) for x in structure]}
    if isinstance(structure, (tuple, list)):
        return {type(structure).__name__: [_layout(item) for item in structure]}
    return 0


def _structure(structure, leaves):
    """A hashable description of a nested structure's containers; its arrays are appended to `leaves`."""
    if structure is None:
        return None
    if isinstance(structure, (tuple, list)):
        return type(structure), tuple(_structure(item, leaves) for item in structure)
    leaves.append(_array(structure))
    return 0


def _leaves(structure):
    """The arrays of a nested structure, in the order _layout and _filled take them (None is none)."""
    leaves = []
    _structure(structure, leaves)
    return leaves


def _filled(layout, leaves):
    """The structure `layout` describes, with the arrays of the iterator `leaves` in its places."""
    if layout is None:
        return None
    if layout == 0:
        return next(leaves)
    if "namedtuple" in layout:
        module, name = layout["namedtuple"].split(":")
        if module.split(".")[0] != "gptlite":
            raise ValueError(f"a program's layout names {module}, not a gptlite module")
        return getattr(importlib.import_module(module), name)(*(_filled(item, leaves) for item in layout["items"]))
    (kind, items), = layout.items()
    filled = [_filled(item, leaves) for item in items]
    return tuple(filled) if kind == "tuple" else filled


def _array(value):
    return np.asarray(value) if isinstance(value, (int, float, bool, np.generic)) else value


# --- an entry's name


def _entry_name(name, xla, model, layout, shapes):
    described = {"program": repr(name), "xla": xla, "model": _architecture(model), "inputs": layout,
                 "shapes": shapes, "code": _code_fingerprint(), "keras": keras.__version__,
                 "backend": keras.backend.backend(), "backend version": backend_version()}
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
    return importlib.import_module(keras.backend.backend()).__version__


@functools.cache
def _code_fingerprint():
    """A hash of gptlite's own source: a program traced by other code is another program."""
    package = pathlib.Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# --- the entry's file: a magic line, a header line (JSON) and the program's bytes


def _read(path, backend):
    """The program written at `path`, loaded; None where there is none. A damaged one is removed."""
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        if not data.startswith(_MAGIC):
            raise ValueError("not a program")
        header_line, payload = data[len(_MAGIC):].split(b"\n", 1)
        header = json.loads(header_line)
        if hashlib.sha256(payload).hexdigest() != header["sha256"]:
            raise ValueError("its checksum does not match")
        program = _load(backend, header, payload)
    except Exception:  # damaged, cut short, or written by other code: traced again, and written anew
        if compile_cache.is_ours(path.parent):
            path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)  # used now: the cache's oldest entries go first when it is full
    except OSError:
        pass
    return program


def _write(path, header, payload):
    """Write the entry whole or not at all (a temporary file renamed); a folder that cannot be written is left."""
    if path is None:
        return
    header = dict(header, sha256=hashlib.sha256(payload).hexdigest())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".partial", delete=False) as file:
            file.write(_MAGIC + json.dumps(header).encode() + b"\n" + bytes(payload))
        os.replace(file.name, path)
    except OSError:
        pass


def _load(backend, header, payload):
    return _load_tensorflow(header, payload) if backend == "tensorflow" else _load_jax(header, payload)


# --- TensorFlow


def _trace_tensorflow(flat, model, shapes, xla):
    """A GraphDef that calls the traced function (XLA's or a graph's, as the function's own attributes say),
    its inputs: the arrays, then the model's variables it reads, by their index."""
    import tensorflow as tf

    specs = [tf.TensorSpec(shape, dtype) for shape, dtype in shapes]
    traced = tf.function(flat, jit_compile=xla, autograph=False).get_concrete_function(*specs)
    # The traced function called from a graph of its own: the graph holds only the call, and the function
    # (with its XLA attribute) goes into the GraphDef's library, which loads quickly.
    caller = tf.function(lambda *inputs: traced(*inputs), autograph=False).get_concrete_function(*specs)
    index = {id(variable.value.handle): position for position, variable in enumerate(model.variables)}
    captured = caller.captured_inputs
    unknown = [tensor for tensor in captured if id(tensor) not in index]
    if unknown:
        raise ValueError(f"a decode program reads {len(unknown)} tensors that are not the model's weights")
    graph_def = caller.graph.as_graph_def()
    _rename_functions(graph_def)
    names = [tensor.name for tensor in caller.inputs]
    header = {"inputs": names, "outputs": [tensor.name for tensor in caller.outputs],
              "variables": [index[id(tensor)] for tensor in captured]}
    return header, graph_def.SerializeToString()


def _rename_functions(graph_def):
    """Name the GraphDef's functions by a hash of their definitions: TensorFlow names a traced function by a
    count of this process's traces, so a name may mean another function in another process, where loading it
    would clash with one of that process's own."""
    digest = hashlib.sha256(graph_def.SerializeToString(deterministic=True)).hexdigest()[:16]
    renamed = {function.signature.name: f"gptlite_{digest}_{number}"
               for number, function in enumerate(graph_def.library.function)}

    def rename_in(nodes):
        for node in nodes:
            node.op = renamed.get(node.op, node.op)
            for value in node.attr.values():
                if value.HasField("func"):
                    value.func.name = renamed.get(value.func.name, value.func.name)
                for function in value.list.func:
                    function.name = renamed.get(function.name, function.name)

    rename_in(graph_def.node)
    for function in graph_def.library.function:
        function.signature.name = renamed[function.signature.name]
        rename_in(function.node_def)
    for gradient in graph_def.library.gradient:
        gradient.function_name = renamed.get(gradient.function_name, gradient.function_name)
        gradient.gradient_func = renamed.get(gradient.gradient_func, gradient.gradient_func)


class _TensorFlowProgram:
    def __init__(self, function, variables, outputs_layout):
        import tensorflow as tf

        self.function, self.variables, self.outputs_layout = function, variables, outputs_layout
        self._tensor = tf.convert_to_tensor
        self._ran = False

    def __call__(self, weights, inputs):
        arguments = [*map(self._tensor, inputs), *(weights[index].value.handle for index in self.variables)]
        if self._ran:
            outputs = self.function(*arguments)
        else:  # where XLA finds its machine code in the compile cache, it logs errors about sound entries
            with notices.false_alarms_held_back():
                outputs = self.function(*arguments)
            self._ran = True
        return _filled(self.outputs_layout, iter(outputs))


@functools.cache
def private_layer():
    """Whether TensorFlow programs are loaded from bytes (through `tensorflow.python.eager`, TensorFlow's own
    internals): unless GPTLITE_PRIVATE_APIS is "off", once a small program has been traced, loaded from its
    bytes and run, here, with the right result. Checked once a process; where it fails, a warning says so."""
    if os.environ.get(PRIVATE_APIS_VARIABLE, "").strip().lower() in ("off", "0", "false", "no"):
        return False
    try:
        weight = keras.Variable(np.array([1.0, 2.0], "float32"), trainable=False, name="self_test")
        holder = type("Holder", (), {"variables": [weight]})()
        header, payload = _trace_tensorflow(lambda x: [x * 2.0 + weight.value], holder, [((2,), "float32")], False)
        program = _load_tensorflow(dict(header, outputs_layout={"list": [0]}), payload)
        works = np.allclose(keras.ops.convert_to_numpy(program([weight], [np.array([3.0, 4.0], "float32")])[0]),
                            [7.0, 10.0])
    except Exception:  # noqa: BLE001 (any failure of TensorFlow's internals means: use the floor)
        works = False
    if not works:
        warnings.warn("this TensorFlow's internals are not those gptlite loads decode programs with: each process "
                      "traces its own, so the first tokens of a new process come later", RuntimeWarning, stacklevel=2)
    return works


def _load_tensorflow(header, payload):
    """The program of a GraphDef: its traced function, run by its own name (a hash of it) as an eager operation,
    as TensorFlow runs a tf.function. Run from the imported graph instead, the XLA function would run op by op
    (2.5 times slower at a batch of 8); a jit_compile function around that call would be compiled under a name
    of this process's, under which XLA's cache cannot find what an earlier process compiled."""
    import tensorflow as tf
    from tensorflow.python.eager import context, execute  # what tf.function's own call runs

    graph_def = tf.compat.v1.GraphDef.FromString(bytes(payload))
    eager = context.context()
    for function_def in graph_def.library.function:
        if not eager.has_function(function_def.signature.name):
            eager.add_function_def(function_def)
    calls = [node for node in graph_def.node if node.op in ("StatefulPartitionedCall", "PartitionedCall")]
    if len(calls) != 1:
        raise ValueError(f"a program's graph calls {len(calls)} functions, not one")
    call, = calls
    nodes = {node.name: node for node in graph_def.node}
    # The call's arguments are the caller's inputs (the arrays, then the weights) in an order of its own.
    position = {name.split(":")[0]: index for index, name in enumerate(header["inputs"])}
    order = [position[name.split(":")[0]] for name in call.input if not name.startswith("^")]

    def output_of_call(name):
        """Which output of the call a caller's output is (through the identities between them)."""
        node, source = nodes[name.split(":")[0]], name
        while node.op == "Identity":
            source = node.input[0]
            node = nodes[source.split(":")[0]]
        if node.name != call.name:
            raise ValueError("a program's output does not come from its function")
        return int(source.split(":")[1]) if ":" in source else 0

    outputs = [output_of_call(name) for name in header["outputs"]]
    name, count = call.attr["f"].func.name, len(call.attr["Tout"].list.type)

    def function(*arguments):
        results = execute.execute(name, num_outputs=count, inputs=[arguments[index] for index in order], attrs=(),
                                  ctx=eager)
        return [results[index] for index in outputs]

    return _TensorFlowProgram(function, header["variables"], header["outputs_layout"])


# --- JAX


def _trace_jax(flat, model, shapes):
    """jax.export's serialized program of the function, the model's weights its first argument."""
    import jax

    variables = model.variables

    def stateless(values, *inputs):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return flat(*inputs)

    weight_specs = [jax.ShapeDtypeStruct(variable.shape, variable.dtype) for variable in variables]
    specs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    exported = jax.export.export(jax.jit(stateless))(weight_specs, *specs)
    return {}, bytes(exported.serialize())


class _JaxProgram:
    def __init__(self, function, outputs_layout):
        self.function, self.outputs_layout = function, outputs_layout

    def __call__(self, weights, inputs):
        outputs = self.function([variable.value for variable in weights], *inputs)
        return _filled(self.outputs_layout, iter(outputs))


def _load_jax(header, payload):
    import jax

    exported = jax.export.deserialize(bytearray(payload))
    return _JaxProgram(jax.jit(exported.call), header["outputs_layout"])
