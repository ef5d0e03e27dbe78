"""Weights in and out: the model.keras file, GPT-2, the Llama family, Hugging Face folders and GGUF files.

Nothing here imports Keras: the command line reads the choices below before it starts a backend.
"""

# How a GGUF file stores the weight matrices (`gguf_export`): float32, float16, or llama.cpp's 8-bit blocks of 32
# weights with a 16-bit scale each.
GGUF_OUTTYPES = ("f32", "f16", "q8_0")
