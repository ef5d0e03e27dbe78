"""Looking inside a model, in a room of its own below the page's, which shows what it computes: every step of
the forward pass with its real numbers (`trace`), the pass with heads knocked out or activations copied from
another run (`edits`), what each head does (`heads`: its attention's patterns, its induction score, what knocking
it out costs), how much of an answer each head or residual restores (`patching`), the residual stream through the
output layer (`lens`: the logit lens, a logit's attribution), attention maps and token reports (`inspection`),
what the page's Inside view shows of a trace (`views`), a trace shown in Jupyter as that view (`notebook`), and a
run's film read back, each frame's model and what it shows (`film`).

Every analysis is the model's own forward pass run with hooks (`gptlite.model.hooks`); none copies it.
Nothing here imports Keras at import time.
"""

# How a knocked-out head's output is replaced: by zeros, or by its mean over the positions of the text.
ABLATIONS = ("zero", "mean")
# Where a run keeps its film (`film`), in its folder: the frames' weights, and their index.
FILM_FOLDER = "film"
FILM_INDEX = f"{FILM_FOLDER}/frames.json"
