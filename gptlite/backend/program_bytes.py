"""A traced decode program as bytes and back, for `decode.compiled`: nested inputs and outputs as a flat list of
arrays and a layout (JSON); an entry's file (a magic line, a header line of JSON, the program's bytes, checked by
its hash); TensorFlow's programs (a GraphDef, loaded through TensorFlow's own internals where `private_layer` finds
them working) and JAX's (`jax.export`'s serialized StableHLO).
"""

import functools
import hashlib
import importlib
import json
import os
import tempfile
import warnings

import keras
import numpy as np

from gptlite.backend import compile_cache, notices

MAGIC = b"gptlite program 1\n"
# Set to "off", the optional layers over private APIs are left off (see `decode.compiled`'s docstring).
PRIVATE_APIS_VARIABLE = "GPTLITE_PRIVATE_APIS"


# --- the nested inputs and outputs, as a flat list of arrays and a layout


def layout_of(structure):
    """A JSON description of a nested structure: its containers, None as None and each array as 0."""
    if structure is None:
        return None
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        kind = type(structure)
        return {"namedtuple": f"{kind.__module__}:{kind.__qualname__}", "items": [layout_of(x) for x in structure]}
    if isinstance(structure, (tuple, list)):
        return {type(structure).__name__: [layout_of(item) for item in structure]}
    return 0


def structure_of(structure, leaves):
    """A hashable description of a nested structure's containers; its arrays are appended to `leaves`."""
    if structure is None:
        return None
    if isinstance(structure, (tuple, list)):
        return type(structure), tuple(structure_of(item, leaves) for item in structure)
    leaves.append(_array(structure))
    return 0


def leaves_of(structure):
    """The arrays of a nested structure, in the order layout_of and filled take them (None is none)."""
    leaves = []
    structure_of(structure, leaves)
    return leaves


def filled(layout, leaves):
    """The structure `layout` describes, with the arrays of the iterator `leaves` in its places."""
    if layout is None:
        return None
    if layout == 0:
        return next(leaves)
    if "namedtuple" in layout:
        module, name = layout["namedtuple"].split(":")
        if module.split(".")[0] != "gptlite":
            raise ValueError(f"a program's layout names {module}, not a gptlite module")
        return getattr(importlib.import_module(module), name)(*(filled(item, leaves) for item in layout["items"]))
    (kind, items), = layout.items()
    contents = [filled(item, leaves) for item in items]
    return tuple(contents) if kind == "tuple" else contents


def _array(value):
    return np.asarray(value) if isinstance(value, (int, float, bool, np.generic)) else value


# --- the entry's file: a magic line, a header line (JSON) and the program's bytes


def read_entry(path, backend):
    """The program written at `path`, loaded; None where there is none. A damaged one is removed."""
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a program")
        header_line, payload = data[len(MAGIC):].split(b"\n", 1)
        header = json.loads(header_line)
        if hashlib.sha256(payload).hexdigest() != header["sha256"]:
            raise ValueError("its checksum does not match")
        program = load(backend, header, payload)
    except Exception:  # damaged, cut short, or written by other code: traced again, and written anew
        if compile_cache.is_ours(path.parent):
            path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)  # used now: the cache's oldest entries go first when it is full
    except OSError:
        pass
    return program


def write_entry(path, header, payload):
    """Write the entry whole or not at all (a temporary file renamed); a folder that cannot be written is left."""
    if path is None:
        return
    header = dict(header, sha256=hashlib.sha256(payload).hexdigest())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".partial", delete=False) as file:
            file.write(MAGIC + json.dumps(header).encode() + b"\n" + bytes(payload))
        os.replace(file.name, path)
    except OSError:
        pass


def load(backend, header, payload):
    return load_tensorflow(header, payload) if backend == "tensorflow" else load_jax(header, payload)


# --- TensorFlow


def trace_tensorflow(flat, model, shapes, xla):
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


class TensorFlowProgram:
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
        return filled(self.outputs_layout, iter(outputs))


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
        header, payload = trace_tensorflow(lambda x: [x * 2.0 + weight.value], holder, [((2,), "float32")], False)
        program = load_tensorflow(dict(header, outputs_layout={"list": [0]}), payload)
        works = np.allclose(keras.ops.convert_to_numpy(program([weight], [np.array([3.0, 4.0], "float32")])[0]),
                            [7.0, 10.0])
    except Exception:  # noqa: BLE001 (any failure of TensorFlow's internals means: use the floor)
        works = False
    if not works:
        warnings.warn("this TensorFlow's internals are not those gptlite loads decode programs with: each process "
                      "traces its own, so the first tokens of a new process come later", RuntimeWarning, stacklevel=2)
    return works


def load_tensorflow(header, payload):
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

    return TensorFlowProgram(function, header["variables"], header["outputs_layout"])


# --- JAX


def trace_jax(flat, model, shapes):
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
        import jax

        values = [variable.value for variable in weights]
        devices = values[0].sharding.device_set if values else set()
        if len(devices) == 1:
            # Every input placed on the weights' device, as the outputs of a call are: jax.jit keeps a compiled
            # program for each mix of placed and unplaced inputs (NumPy arrays are not placed), so a server that
            # fed its last call's state back beside new rows from NumPy compiled one program again and again,
            # 0.5 s each time. Weights spread over several devices (a Keras distribution) leave inputs as they are.
            inputs = jax.device_put(list(inputs), next(iter(devices)))
        outputs = self.function(values, *inputs)
        return filled(self.outputs_layout, iter(outputs))


def load_jax(header, payload):
    import jax

    exported = jax.export.deserialize(bytearray(payload))
    return _JaxProgram(jax.jit(exported.call), header["outputs_layout"])
