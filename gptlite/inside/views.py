"""What the page's Inside view shows, declared here once: its steps, in the order the model takes them, and what
each of the model's architecture choices does, in words (`GPTConfig.choices_said`, from `model.config.CHOICES`).
The exported page carries these in its config.json, the server's page in its /config.json, and a notebook's view
beside its trace (`page_declarations`): the page's script names no step and words no choice of its own; it draws
each step it is given (its drawing, by its id, in page/steps_*.js).

A new step is one line here and its drawing there; `tests/inside/test_views.py` adds a throwaway one.
"""

from gptlite.model import hooks as hook_points
from gptlite.model.attention import BLOCK_HEAD_WEIGHTS

# The view's steps: `id` (what its drawing is called), `title`, `layer` (the step is a block's: a layer and a head
# are chosen), `needs` (the trace step a model must have for it: QK-norm, rotary positions, cross-attention), `runs`
# (the step runs the model again, the page's graph: a view that only reads a trace, a notebook's, leaves it out).
VIEW_STEPS = (
    dict(id="tokens", title="Tokens"),
    dict(id="embedding", title="Embedding"),
    dict(id="position", title="Position"),
    dict(id="norm", title="Norm", layer=True),
    dict(id="qkv", title="Q, K, V", layer=True),
    dict(id="qk_norm", title="QK-norm", layer=True, needs="query_normed"),
    dict(id="rotary", title="Rotary turn", layer=True, needs="query_rotated"),
    dict(id="scores", title="Scores", layer=True),
    dict(id="mask", title="Causal mask", layer=True),
    dict(id="softmax", title="Softmax", layer=True),
    dict(id="values", title="Weighted values", layer=True),
    dict(id="heads", title="Heads joined", layer=True),
    dict(id="residual", title="Residual", layer=True),
    dict(id="cross", title="Cross-attention", layer=True, needs="cross_attention"),
    dict(id="feed_forward", title="Feed-forward", layer=True),
    dict(id="feed_forward_residual", title="Residual again", layer=True),
    dict(id="final_norm", title="Final norm"),
    dict(id="logits", title="Logits"),
    dict(id="probabilities", title="Probabilities"),
    dict(id="graph", title="Attention graph", layer=True),
    dict(id="head_roles", title="What each head does", runs=True),
)
# The sampling settings the probabilities step applies live: those that shape a distribution.
LIVE_SETTINGS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def page_declarations(config, probe=None):
    """What the page's Inside view reads of a model of `config` besides its trace: the view's steps, the settings
    it applies live, the trace's step names (`gptlite.model.hooks`) and its blocks' weights' (`weight_steps`: the
    same for every text, fetched once), the model's choices in words, and `probe`, the
    ids `gptlite.heads` scores induction on (a GPT's: `heads.probe_ids`; None where the view scores no heads)."""
    return {"views": [dict(step) for step in VIEW_STEPS], "live": list(LIVE_SETTINGS),
            "steps": list(hook_points.MODEL_STEPS), "block_steps": list(hook_points.BLOCK_STEPS),
            "weight_steps": list(BLOCK_HEAD_WEIGHTS),
            "choices": config.choices_said(), "probe": None if probe is None else [int(i) for i in probe]}
