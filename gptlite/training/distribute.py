"""Data-parallel training: one step's batch split across devices or hosts, with the same result as on one."""

import contextlib
import os

import keras

from gptlite.errors import ConfigError


def mirrored():
    """Whether a TensorFlow strategy with more than one replica is in scope."""
    import tensorflow as tf

    return tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1


@contextlib.contextmanager
def data_parallel(batch_size):
    """A scope in which to build, compile and train a model data-parallel; yields the replica count.

    Each step's batch of `batch_size` sequences is split evenly across the
    replicas and their gradients averaged, so the step is the same step, on
    the same batch and learning rate, as on one device. TensorFlow: a
    MirroredStrategy over the local GPUs (else the local CPU devices); Keras
    clips each replica's gradient before the average there. JAX:
    keras.distribution.DataParallel over every device, after joining the
    processes (hosts) that KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES
    and _PROCESS_ID describe, where they are set.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
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
    elif backend == "jax":
        if "KERAS_DISTRIBUTION_NUM_PROCESSES" in os.environ:
            keras.distribution.initialize()
        devices = keras.distribution.list_devices()
        check_split(batch_size, len(devices))
        previous = keras.distribution.distribution()
        distribution = keras.distribution.DataParallel(devices=devices)
        # Each process feeds its own rows of every batch (see process_part), already split.
        distribution.auto_shard_dataset = False
        keras.distribution.set_distribution(distribution)
        try:
            yield len(devices)
        finally:
            keras.distribution.set_distribution(previous)
    else:
        raise ConfigError(f"distributed training needs the tensorflow or jax backend, not {backend}")


def check_accumulation(grad_accum):
    """Refuse gradient accumulation where Keras cannot do it data-parallel: under TensorFlow's mirrored replicas."""
    if grad_accum > 1 and keras.backend.backend() == "tensorflow":
        raise ConfigError("`grad_accum` above 1 does not train data-parallel under tensorflow (Keras cannot "
                          "accumulate gradients across mirrored replicas); use the jax backend, or one device")


def process_part():
    """(i, n): this is process i of the n that train together, each feeding 1/n of every batch."""
    if keras.backend.backend() == "jax" and keras.distribution.distribution() is not None:
        import jax

        return jax.process_index(), jax.process_count()
    return 0, 1


def check_split(batch_size, replicas):
    """Refuse a batch that cannot be split evenly across `replicas` devices."""
    if batch_size % replicas:
        raise ConfigError(f"`batch_size` {batch_size} does not split evenly across {replicas} devices; "
                          f"choose a multiple of {replicas}")
