"""Text and tokens: tokenizers, chat templates, and token ids back to text with stop strings.

Nothing here imports Keras: the command line reads the choices below before it starts a backend.
"""

# What becomes of text characters a char vocabulary lacks: an error, left out, or spaces.
UNKNOWN_CHOICES = ("error", "skip", "replace")
