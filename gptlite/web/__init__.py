"""The web page, in a room of its own: the page that writes with a model in the reader's browser and shows inside
it (`export`), the ONNX graphs it runs (`onnx_graph`: the decoding step, and every step of a forward pass), the
page's forms of the tokenizers (`tokenizer_form`) and the page's own files (`page/`: HTML, JavaScript and ONNX
Runtime Web, which the notebook's view of a trace, `gptlite.inside.notebook`, reads too).

Nothing here imports Keras at import time.
"""
