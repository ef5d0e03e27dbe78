"""What the running backend does its own way, asked by the decode path, the server, the model's layers, the
training data, the training loop and the export instead of its name: one `Runtime` for each backend Keras runs on.

    runtime = running()            # the running backend's (Keras has started)
    runtime.compiles               # whether a decode function becomes a program, traced once per shape
    runtime.trace(flat, model, shapes, xla) -> (header, payload)   # a program as bytes (`program_bytes`)
    runtime.load(header, payload)  # and back
    with runtime.data_parallel(batch_size) as replicas: ...   # a training step split across devices

It imports Keras: the modules that ask it import Keras too.
"""

import contextlib
import functools
import importlib
import os

import keras

from gptlite.backend import program_bytes
from gptlite.backend.machine import A100_PEAK_FLOPS
from gptlite.errors import ConfigError


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
        """Whether each process traces its own programs for each model (`trace_here`), none loaded from bytes or
        kept."""
        return False

    def trace_here(self, flat, shapes, xla, outputs_layout):
        """The program of `flat` (a function of flat arrays) for inputs of `shapes`, traced in this process and
        reading the weights of the model it was traced with; `outputs_layout()`, once traced: its outputs' layout.
        For a runtime that `traces_each_process`."""
        raise NotImplementedError

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

    def on_gpu(self):
        """Whether this process computes on a GPU (a CUDA device)."""
        return any(kind in device.lower() for device in keras.distribution.list_devices() for kind in ("gpu", "cuda"))

    def rows_on_device(self):
        """Whether a decode batch's rows stay on the device between calls (a GPU's), rather than in NumPy."""
        return self.on_gpu()

    def peak_flops(self):
        """The device's peak FLOPs per second where it is known, to measure MFU against: a GPU is taken for an
        A100 (bfloat16), as nanoGPT takes it; None on a CPU."""
        return A100_PEAK_FLOPS if self.on_gpu() else None

    # Training.
    # Whether Keras runs the steps of a compiled call one by one anyway: a call is then best one step.
    runs_steps_one_by_one = False

    def trains_with_xla(self, model, lora):
        """Whether `model`'s training step (`lora`: its adapters' only) is compiled with XLA."""
        return False

    def mirrors_variables(self):
        """Whether the variables made now are mirrored across several devices (a strategy's replicas)."""
        return False

    def seed_step(self, seed):
        """Seed what a training step's dropout masks draw from, where that is not Keras's own seeded generator."""

    def check_precision(self, precision):
        """Refuse a training `precision` ("fp32", "bf16", "fp16") this backend cannot train in here."""

    def evaluates_beside_steps(self):
        """Whether an evaluation may run on a thread beside the training steps and leave the run as it would be
        without it."""
        return False

    @contextlib.contextmanager
    def data_parallel(self, batch_size):
        """A scope in which to build, compile and train a model data-parallel; yields the replica count.

        Each step's batch of `batch_size` sequences is split evenly across the replicas and their gradients
        averaged, so that the step is the same step, on the same batch and learning rate, as on one device.
        """
        trainers = backends_where(lambda runtime: runtime.data_parallel is not Runtime.data_parallel)
        raise ConfigError(f"distributed training needs the {trainers} backend, not {self.name}")
        yield

    def check_accumulation(self, grad_accum):
        """Refuse gradient accumulation (`grad_accum` batches a step) where it cannot be done data-parallel."""

    def process_part(self):
        """(i, n): this is process i of the n that train together, each feeding 1/n of every batch."""
        return 0, 1


def check_split(batch_size, replicas):
    """Refuse a batch that cannot be split evenly across `replicas` devices."""
    if batch_size % replicas:
        raise ConfigError(f"`batch_size` {batch_size} does not split evenly across {replicas} devices; "
                          f"choose a multiple of {replicas}")


class TensorFlowRuntime(Runtime):
    name = "tensorflow"
    compiles_prefill_aside = True
    recomputes_gelu_gradient = True
    reads_batches_through_tf_data = True

    def traces_each_process(self):
        # The public floor: where TensorFlow's internals are not those programs are loaded from bytes with.
        return not program_bytes.private_layer()

    def trace_here(self, flat, shapes, xla, outputs_layout):
        # Traced by tf.function and called as tf.function calls it; it reads no weights as inputs: its model's own.
        import tensorflow as tf

        specs = [tf.TensorSpec(shape, dtype) for shape, dtype in shapes]
        traced = tf.function(flat, jit_compile=xla, autograph=False).get_concrete_function(*specs)
        return program_bytes.TensorFlowProgram(traced, [], outputs_layout())

    def trace(self, flat, model, shapes, xla):
        return program_bytes.trace_tensorflow(flat, model, shapes, xla)

    # The largest model (adapters included) whose LoRA step is compiled with XLA. At 1.5M parameters XLA's fusing
    # of many small operations made the step 1.57x faster for 0.3 GB more memory; at 6M and 13M only 1.1x faster
    # for 0.3-0.4 GB more, and on GPT-2 small no faster for 0.6 GB more (benchmarks/lora_xla.py).
    lora_xla_max_parameters = 4_000_000

    def trains_with_xla(self, model, lora):
        # Keras's "auto" leaves XLA off on a CPU, yet XLA makes the cpu preset's step about 1.5x faster there; but
        # XLA refuses a step whose mirrored variables sit on several devices.
        return not self.mirrors_variables() and (not lora or model.count_params() <= self.lora_xla_max_parameters)

    def mirrors_variables(self):
        import tensorflow as tf

        return tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1

    def evaluates_beside_steps(self):
        import tensorflow as tf

        return not tf.distribute.has_strategy()  # whose scope a thread does not inherit

    @contextlib.contextmanager
    def data_parallel(self, batch_size):
        # A MirroredStrategy over the local GPUs, else the local CPU devices; Keras clips each replica's gradient
        # before the average there.
        import tensorflow as tf

        if "TF_CONFIG" in os.environ:
            # Keras 3's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585).
            raise ConfigError(
                "training over several hosts needs the jax backend (KERAS_BACKEND=jax, hosts given by "
                "KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and _PROCESS_ID): Keras's fit does not run "
                "under TensorFlow's MultiWorkerMirroredStrategy; unset TF_CONFIG to train on this host's devices"
            )
        # MirroredStrategy's own default takes one CPU device even where there are more.
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        strategy = tf.distribute.MirroredStrategy([device.name for device in devices])
        check_split(batch_size, strategy.num_replicas_in_sync)
        with strategy.scope():
            yield strategy.num_replicas_in_sync

    def check_accumulation(self, grad_accum):
        if grad_accum > 1:
            raise ConfigError("`grad_accum` above 1 does not train data-parallel under tensorflow (Keras cannot "
                              "accumulate gradients across mirrored replicas); use the jax backend, or one device")


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

    def trains_with_xla(self, model, lora):
        return True

    def check_precision(self, precision):
        if precision == "fp16" and all(device.startswith("cpu") for device in keras.distribution.list_devices()):
            raise ConfigError("fp16 under jax needs a GPU: XLA's CPU matmuls have no float16; set `precision` to "
                              "bf16")

    def evaluates_beside_steps(self):
        return keras.distribution.distribution() is None  # whose scope a thread does not inherit

    @contextlib.contextmanager
    def data_parallel(self, batch_size):
        # keras.distribution.DataParallel over every device, after joining the processes (hosts) that
        # KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and _PROCESS_ID describe, where they are set.
        if "KERAS_DISTRIBUTION_NUM_PROCESSES" in os.environ:
            keras.distribution.initialize()
        devices = keras.distribution.list_devices()
        check_split(batch_size, len(devices))
        previous = keras.distribution.distribution()
        distribution = keras.distribution.DataParallel(devices=devices)
        # Each process feeds its own rows of every batch (process_part), already split.
        distribution.auto_shard_dataset = False
        keras.distribution.set_distribution(distribution)
        try:
            yield len(devices)
        finally:
            keras.distribution.set_distribution(previous)

    def process_part(self):
        if keras.distribution.distribution() is None:
            return 0, 1
        import jax

        return jax.process_index(), jax.process_count()


class TorchRuntime(Runtime):
    name = "torch"
    compiles = False
    exports_saved_model = False  # Keras would need torch_xla
    # And a step's dropout masks are seeded as it begins (`seed_step`), which Keras tells of once a call.
    runs_steps_one_by_one = True

    def on_gpu(self):
        import torch  # whose devices Keras does not list

        return torch.cuda.is_available()

    def seed_step(self, seed):
        # Keras's unseeded dropout draws from torch's own global generator, which the data loader also draws
        # from: seeded from the step, the masks are the same in a resumed run. That one generator is also why no
        # evaluation runs beside the steps: its data loader would change the masks, and the losses, of a seed.
        import torch

        torch.manual_seed(seed)

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


def backends_where(answer):
    """The backends whose runtime class `answer` (a function of one) holds true for, in words: "tensorflow or
    jax", for a refusal that names the backends that would do."""
    return " or ".join(name for name, runtime in RUNTIMES.items() if answer(runtime))


@functools.cache
def _runtime(name):
    return RUNTIMES[name]()


def running():
    """The running backend's `Runtime` (Keras starts, where it has not)."""
    import keras

    return _runtime(keras.backend.backend())
