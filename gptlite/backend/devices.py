"""Which device the process computes on. Keras is imported when asked, not before."""


def on_gpu():
    """Whether this process computes on a GPU (a CUDA device). Keras lists devices for TensorFlow and JAX, not torch."""
    import keras

    if keras.backend.backend() == "torch":
        import torch

        return torch.cuda.is_available()
    return any(kind in device.lower() for device in keras.distribution.list_devices() for kind in ("gpu", "cuda"))
