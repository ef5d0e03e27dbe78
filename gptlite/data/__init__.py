"""Training data: a language model's text (`lm`), seq2seq pairs, conversations, and the built-in synthetic tasks.

Nothing here imports Keras: the command line reads the choices below before it starts a backend.
"""

# The built-in seq2seq tasks (`pairs.synthetic_pairs`) and conversation tasks (`chat_tasks`).
SYNTHETIC_TASKS = ("addition", "reverse", "sort")
CHAT_SYNTHETIC_TASKS = ("arithmetic", "direct", "recall", "copy", "backwards")
