"""The kinds of run, one `Task` each: a language model on text (`language`), a GPT on conversations (`chat`), an
encoder-decoder on source/target pairs (`pairs`). A task owns what differs between them: reading its data, its
new model, its batches and loss mask, its scores and what a run samples; `task.py` says which task a run, a model
or its data is.

Nothing here imports Keras: the command line reads the choices below before it starts a backend.
"""

# What a run trains: a GPT on text, an encoder-decoder, a GPT on conversations.
TASKS = ("lm", "seq2seq", "chat")
