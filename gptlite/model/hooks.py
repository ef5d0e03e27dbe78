"""Named points on a model's one forward pass, where a `Hooks` keeps what the pass computes and edits it.

The layers' `call` takes `hooks=None`: absent, as in training and decoding, a layer computes what it always did
and the programs compiled for those are today's; given, each step the pass takes is handed to the hooks by its
name, kept if asked and changed where an edit is declared, before the pass goes on. A trace, an ablated head, a
patched activation and the logit lens are that pass run with hooks (`gptlite.inside`), as TransformerLens runs its
hook points; the page's inside graph names its outputs the same way.

A step's full name is its block's and its own: `layer_1.attention` (a decoder block's, N from 0),
`encoder_layer_0.query` (a Seq2Seq's encoder), `layer_1.cross_heads` (cross-attention's steps start `cross_`), or a
name of MODEL_STEPS alone. Shapes below leave out the batch; every step is kept with it, heads first where it has
heads (B, H, T, D).
"""

# The steps outside the blocks, in the order they run: a Seq2Seq's source as it enters its encoder and as it leaves
# it, then the tokens' vectors (T, C), the position table's rows added (T, C; a model with a table), their sum
# (T, C), that through the final norm (T, C) and the logits (T, V).
MODEL_STEPS = ("source_embedding", "encoded", "token_embedding", "position", "embedding", "final_normed", "logits")
# Attention's steps: queries (H, T, D), keys and values (K, S, D) as projected, then QK-normed and turned by
# rotary positions where the model does either; q.k (H, T, S), that over sqrt(D) (before the mask), the weights
# after the mask and softmax, each head's weighted sum of the values (H, T, D), the heads side by side (T, H D).
# `head_outputs` (H, T, C), each head's share of the output projection (its bias apart), is computed only where a
# hooks asks for it.
ATTENTION_STEPS = ("query", "key", "value", "query_normed", "key_normed", "query_rotated", "key_rotated", "products",
                   "scores", "attention", "heads", "joined", "head_outputs")
# A block's steps: its input (T, C), each sublayer's normed input (pre-norm), output and the residual after it;
# cross-attention's as `cross_...`; the feed-forward's widened vector (or its gate and up, SwiGLU's), its hidden
# activations (T, F), and the block's output (T, C).
BLOCK_STEPS = ("input", "attention_normed", *ATTENTION_STEPS, "attention_output", "attention_residual",
               "cross_normed", *(f"cross_{step}" for step in ATTENTION_STEPS), "cross_output", "cross_residual",
               "feed_forward_normed", "expanded", "gate", "up", "hidden", "feed_forward_output", "output")
# What a block's steps are named under: a decoder's (or a GPT's) blocks, a Seq2Seq's encoder's.
BLOCK_PREFIXES = ("layer", "encoder_layer")


def step_name(step, layer=None, stack="layer"):
    """A step's full name: `step` alone outside the blocks (layer None), else `<stack>_<layer>.<step>`."""
    return step if layer is None else f"{stack}_{layer}.{step}"


class Hooks:
    """What a forward pass keeps and what it changes, by step name.

    Args:
        keep: the steps to keep: True (every one), a collection of full names, or a function of a full name
            that says whether to keep it; None keeps nothing.
        edits: {full name: function}: the value a step computed goes through its function, which returns
            the value the pass goes on with (of the same shape); the kept value is the edited one.

    A layer hands a step over as `hooks(step, value)` and goes on with what it returns; `hooks.within(prefix)` is
    the same hooks for a part whose steps are named under `prefix` (a block's `layer_0.`). `kept` holds every kept
    step by its full name, as the backend's tensors.
    """

    def __init__(self, keep=None, edits=None):
        self.kept = {}
        self._keep = keep
        self._edits = dict(edits or {})
        self._prefix = ""

    def within(self, prefix):
        """These hooks for a part whose steps are named `prefix` + their own name: they share what is kept."""
        part = Hooks.__new__(Hooks)
        part.kept, part._keep, part._edits = self.kept, self._keep, self._edits
        part._prefix = self._prefix + prefix
        return part

    def keeps(self, step):
        """Whether the step (this part's name for it) is kept."""
        name, keep = self._prefix + step, self._keep
        if keep is None or keep is False:
            return False
        if keep is True:
            return True
        return keep(name) if callable(keep) else name in keep

    def wants(self, step):
        """Whether the step is kept or edited: a step computed only to be seen (`head_outputs`) is computed then."""
        return self.keeps(step) or self._prefix + step in self._edits

    def __call__(self, step, value):
        name = self._prefix + step
        edit = self._edits.get(name)
        if edit is not None:
            value = edit(value)
        if self.keeps(step):
            self.kept[name] = value
        return value


def seen(hooks, step, value):
    """`value` through `hooks` as `step`, or as it is where there are none (training and decoding)."""
    return value if hooks is None else hooks(step, value)


def within(hooks, prefix):
    """`hooks.within(prefix)`, or None where there are none."""
    return None if hooks is None else hooks.within(prefix)


def of_block(hooks, index, stack="layer"):
    """The hooks of block `index` of a stack (`BLOCK_PREFIXES`: "layer", a decoder's; "encoder_layer"), or None."""
    return within(hooks, f"{stack}_{index}.")
