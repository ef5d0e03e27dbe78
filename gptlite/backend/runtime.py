"""What the running backend does its own way, asked by the decode path, the server, the model's layers, the
training data and the export instead of its name: one `Runtime` for each backend Keras runs on.

    runtime = running()            # the running backend's (Keras has started)
    runtime.compiles               # whether a decode function becomes a program, traced once per shape
    runtime.trace(flat, model, shapes, xla) -> (header, payload)   # a program as bytes (`program_bytes`)
    runtime.load(header, payload)  # and back

It imports Keras: the modules that ask it import Keras too.
"""

import functools
import importlib

from gptlite.backend import program_bytes
from gptlite.backend.devices import on_gpu


class Runtime:
    """A backend's answers. `name` is Keras's name for it."""

    name = None
    # Whether a decode function is traced into a program, once per shape of its inputs, and kept on disk; where
    # not, it runs eagerly at each call (`run_eagerly`), and there is nothing to warm up.
    compiles = True
    # Whether a prefill that runs as a plain graph (for a process's first token) is compiled with XLA aside, on a
    # thread of its own, once the same shape comes again (`decode.engine`).
    compiles_prefill_aside = False
    # Whether its fused attention (`ops.dot_product_attention`) takes fewer key/value heads than query heads as
    # they are (grouped-query attention); where not, they are repeated to the query heads' number first.
    attends_grouped_heads = False
    # Whether GELU's gradient is recomputed from its input (a custom gradient), rather than the backend's own
    # gradient of the formula, which keeps four more tensors of the feed-forward's width per block where no XLA
    # fuses them (TensorFlow's graphs: ~90 MB of a LoRA step's peak memory on GPT-2 small at context 256).
    recomputes_gelu_gradient = False
    # Whether training batches are read through tf.data (TensorFlow's own input pipeline), rather than the
    # PyDataset itself.
    reads_batches_through_tf_data = False
    # Whether Keras writes a TensorFlow SavedModel from it (`keras.export.ExportArchive`).
    exports_saved_model = True

    def saved_model_options(self, block_size):
        """What `ExportArchive.add_endpoint` takes besides the function, for a model of context `block_size`."""
        return {}

    def fused_attention_is_faster(self, compute_dtype):
        """Whether `ops.dot_product_attention` beats the step-by-step ops in `compute_dtype`."""
        return True

    def version(self):
        """The backend's version: a program it traced may mean something else to another version."""
        return importlib.import_module(self.name).__version__

    def run_eagerly(self, function, args):
        """`function(*args)` as a backend that compiles nothing runs a decode function."""
        return function(*args)

    def traces_each_process(self):
        """Whether each process traces its own programs for each model, none loaded from bytes or kept."""
        return False

    def trace(self, flat, model, shapes, xla):
        """The program of `flat` (a function of flat arrays, reading `model`'s variables) for inputs of `shapes`,
        as (header, payload) bytes; `xla`: compiled with XLA where the backend chooses."""
        raise NotImplementedError

    def load(self, header, payload):
        """The program that `trace` wrote."""
        return program_bytes.load(self.name, header, payload)

    def read(self, path):
        """The program kept at `path`, loaded; None where there is none (a damaged one is removed)."""
        return program_bytes.read_entry(path, self.name)

    def rows_on_device(self):
        """Whether a decode batch's rows stay on the device between calls (a GPU's), rather than in NumPy."""
        return on_gpu()


class TensorFlowRuntime(Runtime):
    name = "tensorflow"
    compiles_prefill_aside = True
    recomputes_gelu_gradient = True
    reads_batches_through_tf_data = True

    def traces_each_process(self):
        # The public floor: where TensorFlow's internals are not those programs are loaded from bytes with.
        return not program_bytes.private_layer()

    def trace(self, flat, model, shapes, xla):
        return program_bytes.trace_tensorflow(flat, model, shapes, xla)


class JaxRuntime(Runtime):
    name = "jax"
    attends_grouped_heads = True

    def saved_model_options(self, block_size):
        # jax2tf must be told the length's bound, or slicing the position table fails to convert. Serving needs no
        # gradient, and converting one would lose the bound.
        return {"jax2tf_kwargs": {"polymorphic_shapes": ["(batch, length)"],
                                  "polymorphic_constraints": [f"length <= {block_size}"], "with_gradient": False}}

    def trace(self, flat, model, shapes, xla):
        return program_bytes.trace_jax(flat, model, shapes)  # jax.jit compiles every program


class TorchRuntime(Runtime):
    name = "torch"
    compiles = False
    exports_saved_model = False  # Keras would need torch_xla

    def fused_attention_is_faster(self, compute_dtype):
        # But on a CPU in 16 bits, where torch's flash kernel is slower than plain matmuls and softmax
        # (benchmarks/journal.md, "Fused attention").
        if compute_dtype == "float32":
            return True
        import torch

        return torch.cuda.is_available() or torch.backends.mps.is_available()

    def run_eagerly(self, function, args):
        import torch

        with torch.no_grad():  # eager torch would otherwise record every step for a backward pass
            return function(*args)


# Every backend's runtime, by Keras's name for it.
RUNTIMES = {runtime.name: runtime for runtime in (TensorFlowRuntime, JaxRuntime, TorchRuntime)}


@functools.cache
def _runtime(name):
    return RUNTIMES[name]()


def running():
    """The running backend's `Runtime` (Keras starts, where it has not)."""
    import keras

    return _runtime(keras.backend.backend())
