"""Training data: a language model's text (`lm`), seq2seq pairs, conversations, and the built-in synthetic tasks.

Nothing here imports Keras: the command line reads the choices below before it starts a backend.
"""

# The built-in language-model tasks (`induction`), seq2seq tasks (`pairs.synthetic_pairs`) and conversation tasks (`chat_tasks`), each with what it is.
SYNTHETIC_TASKS = {
    "addition": 'sums of two numbers ("123+456" -> "579")',
    "reverse": "strings of 5 to 20 letters, reversed",
    "sort": "strings of 5 to 20 letters, sorted",
}
LM_SYNTHETIC_TASKS = {
    "induction": "random letters and digits repeated twice, on which a small GPT's induction heads form",
}
CHAT_SYNTHETIC_TASKS = {
    "arithmetic": "sums and differences, answered with the sum restated",
    "direct": "sums and differences, answered with the result alone",
    "recall": "a code given early, asked for later",
    "copy": "a made-up word written back",
    "backwards": "a made-up word written backwards",
}
# What a chat run does with a conversation longer than the model's context: cut it to fit, or refuse it.
LONG_CONVERSATIONS = ("cut", "refuse")
