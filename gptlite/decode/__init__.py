"""Writing text with a model: sampling, the compiled decode programs, the engine, rows of text, generate and chat."""
