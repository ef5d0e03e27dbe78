"""llama.cpp, through llama-cpp-python, as the benchmarks open it."""

def open_llama_cpp(path, context, repack=True):
    """llama-cpp-python's Llama on 2 threads; `repack=False` keeps the weights as the file has them, as
    `llama-cli --no-repack` does (on machine D, llama.cpp 0.3.36 crashes on q8_0 weights it repacks)."""
    import llama_cpp

    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def params():
        chosen = defaults()
        chosen.use_extra_bufts = repack
        return chosen

    llama_cpp.llama.llama_cpp.llama_model_default_params = params
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=context, n_threads=2, verbose=False)
    finally:
        llama_cpp.llama.llama_cpp.llama_model_default_params = defaults
