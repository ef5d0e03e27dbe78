"""Weights in and out: the model.keras file, GPT-2, the Llama family, Hugging Face folders and GGUF files.

Nothing here imports Keras: the command line reads the choices below before it starts a backend.
"""

import functools

# How a GGUF file stores the weight matrices (`gguf_export`): float32, float16, or llama.cpp's 8-bit blocks of 32
# weights with a 16-bit scale each.
GGUF_OUTTYPES = ("f32", "f16", "q8_0")


def decoder_only(form):
    """Declare that an export function (`write(model, ...)`) writes `form` (what it is, in words), which holds only a
    decoder-only model, one that continues text: any other model is refused here, in one way, before anything is
    written."""
    def declared(write):
        @functools.wraps(write)
        def checked(model, *args, **kwargs):
            from gptlite.model.gpt import check_use  # not above: it imports Keras

            check_use(model, "be written in a decoder-only form", form=form)
            return write(model, *args, **kwargs)
        return checked
    return declared
