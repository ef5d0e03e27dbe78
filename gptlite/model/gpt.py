"""The models: the GPT (embedding, a stack of transformer blocks, a final norm
unless the blocks are post-norm, and the LM head) and the encoder–decoder
Seq2Seq built from the same parts."""

import dataclasses

import keras
import numpy as np
from keras import ops

from gptlite.backend import compile_cache
from gptlite.errors import ConfigError, InputError
from gptlite.model.attention import CachePlacement, PackedTexts
from gptlite.model.blocks import EncoderBlock, TransformerBlock
from gptlite.model.config import ATTENTION_PARTS, GPTConfig, LORA_TARGETS, lora_targets
from gptlite.model.hooks import Hooks, of_block, seen, step_name
from gptlite.model.layers import layers_within, register, TokenAndPositionEmbedding, weights_arriving
from gptlite.model.norms import make_norm, NORM_LAYERS
from gptlite.text import load_tokenizer_classes, templates, tokenizers

load_tokenizer_classes()  # Keras must know every tokenizer class that a saved model may hold


# Stored in every saved model; raised when the saved form changes incompatibly.
FORMAT_VERSION = 1


# What a caller may use a gptlite model for, each use declared once with the words that refuse it to a model of a
# kind that does not serve it ({model}: that model's class; {form} and {source}: the caller's words for the file
# it writes or the model it was given). None: every kind of model serves it. Each kind lists the uses it serves
# (`uses`); a caller names the use it makes (`check_use`) and never asks which kind a model is.
USES = {
    "continue a prompt": "a {model} writes targets with generate_target; it continues no prompt",
    "write targets": "generate_target needs a Seq2Seq model, not a {model}; a GPT continues a prompt with generate",
    "trace a text": "a trace follows a GPT's forward pass over a text; a {model} writes targets from sources",
    "trace a target": "a target's trace follows a Seq2Seq's encoder and decoder; a {model} continues text: trace it "
                      "with `trace`",
    "be written in a decoder-only form": "{form} holds a decoder-only model, one that continues text (a GPT); a "
                                         "{model} writes targets from sources",
    "be fine-tuned": "{source} holds a {model}; only a GPT can be fine-tuned",
    "score its heads": "head scores and patching read a GPT's causal self-attention over a text; a {model}'s heads "
                       "are knocked out in its trace (trace_target's `ablate`)",
    "be loaded": None,
    "be scored": None,
    "draw its attention": None,
}


def check_use(value, use, refusal=None, **words):
    """`value` where it is a gptlite model that serves `use` (one of USES). A model of another kind is refused with
    USES's words for the use (a ConfigError; `words` fill them); anything else, with `refusal` where the caller
    gives one (a file that holds another Keras model), else with a ConfigError naming the kinds that serve it."""
    if not isinstance(value, _Transformer):
        serving = " or ".join(kind.__name__ for kind in MODELS if _serves(kind, use))
        raise refusal or ConfigError(f"expected a gptlite {serving}, got {type(value).__name__}")
    if not _serves(type(value), use):
        raise ConfigError(USES[use].format(model=type(value).__name__, **words))
    return value


def _serves(kind, use):
    """Whether a model of `kind` (a class of MODELS) serves `use`: every kind serves a use USES refuses to none."""
    return USES[use] is None or use in kind.uses


class _Transformer(keras.Model):
    """What GPT and Seq2Seq share: the config, the tokenizer, the embedding
    (which is also the output layer), the decoder's blocks and final norm (None after post-norm blocks),
    the key/value cache and the saved form.
    """

    # Whether the decoder's blocks attend over an encoder's output.
    _CROSS_ATTENTION = False
    # What a caller asks instead of which class a model is: whether it writes a target for a source text
    # (a Seq2Seq) rather than continuing its prompt (a GPT).
    writes_targets = False
    # The uses of USES that only some kinds serve, which this kind serves.
    uses = frozenset()
    # Its attention, by ATTENTION_PARTS's names, and its stacks of blocks, by the prefix their steps are named
    # under (`gptlite.model.hooks.BLOCK_PREFIXES`).
    attention_parts = ("decoder",)
    block_stacks = ("layer",)
    # Whether its prefill is compiled (XLA) rather than a plain graph on TensorFlow: a GPT's is quick to build, so
    # that the first token comes without waiting for a compiler; a Seq2Seq's targets come whole, so its compiles.
    compiled_prefill = False

    def __init__(self, *, tokenizer=None, config=None, **kwargs):
        # The shape: a GPTConfig given whole, or its fields (as a saved model gives them), with its defaults; the
        # rest are Keras's (name, dtype, ...).
        shape = {field.name: kwargs.pop(field.name) for field in dataclasses.fields(GPTConfig) if field.name in kwargs}
        if config is not None and shape:
            raise ConfigError(f"give the shape as a GPTConfig or as its settings, not both ({', '.join(shape)})")
        config = GPTConfig(**shape) if config is None else config
        if config.vocab_size is None:  # the tokenizer's
            if tokenizer is None:
                raise ConfigError("a model without a tokenizer needs its vocab_size")
            config = dataclasses.replace(config, vocab_size=tokenizer.vocabulary_size)
        super().__init__(**kwargs)
        self.config = config
        vocab_size, block_size, n_embd = config.vocab_size, config.block_size, config.n_embd
        if tokenizer is not None and tokenizer.vocabulary_size != vocab_size:
            raise ConfigError(
                f"the tokenizer has {tokenizer.vocabulary_size} tokens but vocab_size is {vocab_size}"
            )
        self.tokenizer = tokenizer
        self.embedding = TokenAndPositionEmbedding(
            vocab_size,
            block_size,
            n_embd,
            position=config.position,
            tie_weights=config.tie_weights,
            dtype=self.dtype_policy,
            name="embedding",
        )
        self.embedding_dropout = keras.layers.Dropout(config.dropout, dtype=self.dtype_policy)
        self.blocks = [self._block(TransformerBlock, f"block_{i}", cross_attention=self._CROSS_ATTENTION)
                       for i in range(config.n_layer)]
        self.final_norm = self._norm("final_norm")

    def _norm(self, name):
        """A norm after a stack of blocks; None for post-norm blocks, whose every output is normalised already."""
        if self.config.norm_position == "post":
            return None
        return make_norm(self.config.norm, self.config.norm_epsilon, self.config.bias, self.dtype_policy, name)

    @staticmethod
    def _normalised(norm, x):
        """x (B, T, C) through a stack's final norm, where it has one."""
        return x if norm is None else norm(x)

    def _block(self, kind, name, **kwargs):
        return kind(self.config, dtype=self.dtype_policy, name=name, **kwargs)

    @classmethod
    def from_gpt_config(cls, config, tokenizer=None, **kwargs):
        return cls(config=config, tokenizer=tokenizer, **kwargs)

    def build_from_config(self, config):
        # Keras builds a saved model so as it loads it, and reads the saved weights in right after.
        with weights_arriving():
            super().build_from_config(config)

    def build(self, input_shape=None):
        hidden_shape = (None, None, self.config.n_embd)
        self.embedding.build((None, None))
        for block in self.blocks:
            block.build(hidden_shape)
        if self.final_norm is not None:
            self.final_norm.build(hidden_shape)
        self.built = True

    @property
    def chats(self):
        """Whether the model holds a conversation: a language model whose tokenizer has a chat template."""
        return not self.writes_targets and self.tokenizer is not None and \
            templates.template_of(self.tokenizer) is not None

    def decoding_context(self, sources=None):
        """What every decoding step reads besides its tokens and cache, passed on to `call_with_cache`: nothing
        for a GPT; a Seq2Seq's encoded sources (B, S)."""
        return ()

    def empty_cache(self, batch_size, length=None):
        """A zero key/value cache: a tuple with one (B, 2, K, length, D) tensor per decoder block.

        `length` (block_size unless given) slots hold positions 0 .. length - 1.
        A tuple rather than one stacked tensor, so that a decode step updates
        each block's cache in place instead of copying all of them.
        """
        config = self.config
        length = config.block_size if length is None else length
        shape = (batch_size, 2, config.kv_heads, length, config.head_size)
        return tuple(ops.zeros(shape, dtype=self.compute_dtype) for _ in range(config.n_layer))

    def _decode_with_cache(self, token_ids, cache, start_positions, logits_at=None, **cross):
        """Logits (B, T, V) for tokens placed at `start_positions` (B,), and the updated cache; with
        `logits_at` (B,), row b's at its token logits_at[b] alone, (B, 1, V)."""
        x = self.embedding(token_ids, start_positions)  # (B, T, C)
        # Every block's cache has one shape: where the new keys and values go is worked out once.
        placement = CachePlacement.of(start_positions, ops.shape(token_ids)[1], cache[0])
        layer_caches = []
        for index, (block, layer_cache) in enumerate(zip(self.blocks, cache)):
            block_cross = {"cross_key_values": cross["cross_key_values"][index],
                           "context_mask": cross["context_mask"]} if cross else {}
            # Called as it is, every step, not through Keras's __call__: under torch, which runs each step as it
            # comes, that is Python's time on every token.
            x, layer_cache = block.call(x, cache=layer_cache, placement=placement, **block_cross)
            layer_caches.append(layer_cache)
        if logits_at is not None:
            # One position a row through the head: a prompt's others' logits would cost a product with the
            # whole token table each, and only its last token's choose anything. Rows of the flattened states
            # rather than take_along_axis, whose int64 indices TensorFlow transposes, logging an error, outside XLA.
            rows, length = ops.shape(x)[0], ops.shape(x)[1]
            flat = ops.reshape(x, (-1, ops.shape(x)[2]))  # (B*T, C)
            x = ops.take(flat, ops.arange(rows) * length + ops.cast(logits_at, "int32"), axis=0)[:, None]  # (B, 1, C)
        return self.embedding.logits(self._normalised(self.final_norm, x), decoding=True), tuple(layer_caches)

    def enable_lora(self, rank, alpha=None, targets=LORA_TARGETS):
        """Train low-rank adapters on the decoder blocks' projections, with every other weight frozen.

        Each targeted projection (`targets` from LORA_TARGETS: "qkv", the
        query, key and value projections; "attention_output"; "expand", the
        feed-forward's first projection, gate and up for SwiGLU; "contract",
        its last, down) gains two small matrices A (in, rank) and B (rank, out),
        B starting at zero, and computes x W + (alpha / rank) (x A) B
        (`layers.Linear.enable_lora`); its kernel W is frozen, as is every
        other weight, unless `targets` names "embedding": the token embedding
        (and an untied output head) then trains whole; "norms" trains every
        norm's scale (and shift) whole. A saved model holds the
        merged kernels and no adapters. The model must be built; compile it
        after.
        """
        targets = lora_targets(",".join(targets) if isinstance(targets, (list, tuple)) else targets)
        if not self.built:
            raise ConfigError("build the model before enabling LoRA")
        for weight in self.trainable_weights:
            weight.trainable = False
        if "embedding" in targets:
            for weight in self.embedding.token_embedding.weights:
                weight.trainable = True
        if "norms" in targets:
            for layer in layers_within(self):
                if isinstance(layer, NORM_LAYERS):
                    for weight in layer.weights:
                        weight.trainable = True
        for block in self.blocks:
            projections = block.projections()
            for name in targets:
                for layer in projections.get(name, ()):
                    layer.enable_lora(rank, alpha)

    def get_config(self):
        config = super().get_config()
        config.update(dataclasses.asdict(self.config), format_version=FORMAT_VERSION)
        config["tokenizer"] = (
            keras.saving.serialize_keras_object(self.tokenizer) if self.tokenizer is not None else None
        )
        return config

    @classmethod
    def from_config(cls, config):
        # A saved model loaded (by gptlite.load or keras.saving.load_model) is loaded to be used: this process keeps
        # its compiled programs on disk from here on (gptlite.compile_cache), TensorFlow's XLA programs too, whose
        # runtime reads where they go as it starts, in the model's first operation. Building a model starts nothing.
        compile_cache.start()
        config = dict(config)
        saved_format = config.pop("format_version", FORMAT_VERSION)
        if saved_format > FORMAT_VERSION:
            raise InputError(
                f"this model was saved by a newer gptlite (format {saved_format}; this one reads "
                f"up to {FORMAT_VERSION}); upgrade gptlite to load it"
            )
        if config.get("tokenizer") is not None:
            config["tokenizer"] = keras.saving.deserialize_keras_object(config["tokenizer"])
        return cls(**config)


@register
class GPT(_Transformer):
    """A decoder-only transformer language model that carries its tokenizer.

    Build one from a `GPTConfig` with `GPT.from_gpt_config(config, tokenizer)`,
    or pass the config's fields as keyword arguments.

    Call: token ids (B, T), T <= block_size -> next-token logits (B, T, V), float32.
    Rows that pack several texts (conversations) come as {"token_ids": (B, T),
    "positions": (B, T)}, each token's position in its own text: each text is
    then read as if it were alone, its positions counted from 0 and its
    attention kept within it, as it is read when the model is used.
    """

    uses = frozenset({"continue a prompt", "trace a text", "be written in a decoder-only form", "be fine-tuned",
                      "score its heads"})

    def call(self, inputs, training=None, hooks=None):
        token_ids, positions = (inputs["token_ids"], inputs.get("positions")) if isinstance(inputs, dict) else \
            (inputs, None)
        x = self.embedding(token_ids, positions=positions, hooks=hooks)  # (B, T, C)
        x = seen(hooks, "embedding", self.embedding_dropout(x, training=training))
        packed = None if positions is None else PackedTexts.of(positions)  # once for every block
        for index, block in enumerate(self.blocks):
            x = block(x, packed=packed, training=training, hooks=of_block(hooks, index))
        x = seen(hooks, "final_normed", self._normalised(self.final_norm, x))
        return seen(hooks, "logits", self.embedding.logits(x))  # (B, T, V)

    def call_with_cache(self, token_ids, cache, start_positions, logits_at=None):
        """Next-token logits for tokens placed at `start_positions`, and the updated cache.

        token_ids (B, T), start_positions (B,) with start_positions[b] + T no more than
        the cache's length, cache as from `empty_cache` -> logits (B, T, V), cache.
        Attention reads the whole cache, so a cache no longer than the text needs
        makes a step cheaper. `logits_at` (B,): only row b's logits at its token
        logits_at[b] are wanted (a prompt's last), (B, 1, V).
        """
        return self._decode_with_cache(token_ids, cache, start_positions, logits_at)

    def training_flops_per_token(self):
        """The FLOPs a training step spends per token at full context, estimated as nanoGPT does
        (after PaLM's appendix B): 6 per weight, forward and backward, but the position table's,
        which is only looked up, and 12 x layers x width x context for attention's own products."""
        config = self.config
        table = config.block_size * config.n_embd if config.position != "rotary" else 0
        weights = self.count_params() - table
        return 6 * weights + 12 * config.n_layer * config.n_embd * config.block_size

    def attention_weights(self, token_ids):
        """Attention weights of every block, stacked: (n_layer, B, H, T, T)."""
        hooks = Hooks(keep=[step_name("attention", index) for index in range(self.config.n_layer)])
        self(token_ids, hooks=hooks)
        return ops.stack([hooks.kept[step_name("attention", index)] for index in range(self.config.n_layer)])

    def attention_reading(self, text, part=None, target=None, unknown="error", write_target=None):
        """What `gptlite.attention_maps` shows of `text`, a prompt read as its last block_size tokens: the
        inputs `call` reads (1, T), the part (a GPT has one, "decoder": causal self-attention), its weights
        (n_layer, 1, H, T, T) and the token ids of the queries and of the keys, both the prompt's (T,)."""
        if part not in (None, "decoder"):
            raise ConfigError(f"a GPT has only causal self-attention (part 'decoder'), not {part!r}")
        if target is not None:
            raise ConfigError("a target goes with a Seq2Seq model's source; a GPT reads a prompt only")
        ids = self.tokenizer.encode(tokenizers.known_text(self.tokenizer, text, unknown, "prompt"))
        if len(ids) == 0:
            raise InputError("give a prompt of at least one token to look inside the model with")
        ids = ids[-self.config.block_size:].astype("int32")
        return ids[None], "decoder", self.attention_weights(ids[None]), ids, ids


@register
class Seq2Seq(_Transformer):
    """An encoder–decoder transformer: the encoder reads a source text, the
    decoder writes the target one token at a time, attending over it.

    The shape is a `GPTConfig`'s: the encoder and the decoder each have
    n_layer blocks, and block_size bounds the source's length and the
    target's (its start token included). One embedding (tokens and
    positions) serves the source, the target and the output. The tokenizer
    must have pad (id 0), start and end tokens: the decoder reads the start
    token and then the target, and learns to end it with the end token.

    Call: {"source_ids": (B, S), "target_ids": (B, T)} -> next-token logits
    (B, T, V), float32. Source positions holding the pad id are padding; an
    optional "source_mask" (B, S), True at real positions, says so instead.
    """

    _CROSS_ATTENTION = True
    writes_targets = True
    attention_parts = ATTENTION_PARTS
    block_stacks = ("layer", "encoder_layer")
    uses = frozenset({"write targets", "trace a target"})
    compiled_prefill = True
    PAD_ID = 0

    def __init__(self, *, tokenizer=None, **kwargs):
        super().__init__(tokenizer=tokenizer, **kwargs)
        if tokenizer is not None and (tokenizer.pad_token_id != self.PAD_ID or tokenizer.start_token_id is None
                                      or tokenizer.end_token_id is None):
            raise ConfigError("a Seq2Seq model needs a tokenizer with pad (id 0), start and end tokens, such as "
                              "CharTokenizer(..., special_tokens=('pad', 'start', 'end'))")
        self.encoder_blocks = [self._block(EncoderBlock, f"encoder_block_{i}") for i in range(self.config.n_layer)]
        self.encoder_norm = self._norm("encoder_norm")

    def build(self, input_shape=None):
        super().build()
        hidden_shape = (None, None, self.config.n_embd)
        for block in self.encoder_blocks:
            block.build(hidden_shape)
        if self.encoder_norm is not None:
            self.encoder_norm.build(hidden_shape)

    def call(self, inputs, training=None, hooks=None):
        source_ids, target_ids = inputs["source_ids"], inputs["target_ids"]
        source_mask = inputs.get("source_mask")
        if source_mask is None:
            source_mask = self.source_mask(source_ids)
        encoded = self.encode(source_ids, source_mask, training=training, hooks=hooks)
        return self.decode(target_ids, encoded, source_mask, training=training, hooks=hooks)

    def source_mask(self, source_ids):
        """True at the real (not padding) positions of source ids (B, S)."""
        return ops.not_equal(source_ids, self.PAD_ID)

    def encode(self, source_ids, source_mask, training=None, hooks=None):
        """Source ids (B, S) and their mask -> the encoder's output (B, S, C)."""
        x = seen(hooks, "source_embedding", self.embedding_dropout(self.embedding(source_ids), training=training))
        for index, block in enumerate(self.encoder_blocks):
            x = block(x, padding_mask=source_mask, training=training, hooks=of_block(hooks, index, "encoder_layer"))
        return seen(hooks, "encoded", self._normalised(self.encoder_norm, x))

    def decode(self, target_ids, encoded, source_mask, training=None, hooks=None):
        """Target ids so far (B, T), read with the encoder's output (B, S, C) -> next-token logits (B, T, V)."""
        x = self.embedding(target_ids, hooks=hooks)  # (B, T, C)
        x = seen(hooks, "embedding", self.embedding_dropout(x, training=training))
        for index, block in enumerate(self.blocks):
            x = block(x, context=encoded, context_mask=source_mask, training=training, hooks=of_block(hooks, index))
        x = seen(hooks, "final_normed", self._normalised(self.final_norm, x))
        return seen(hooks, "logits", self.embedding.logits(x))

    def attention_weights(self, inputs):
        """Every block's attention weights for the inputs of `call`, as a dict:
        "encoder" (n_layer, B, H, S, S), "decoder" (n_layer, B, H, T, T), the
        decoder's causal self-attention, and "cross" (n_layer, B, H, T, S).
        """
        layers = range(self.config.n_layer)
        names = {"encoder": [step_name("attention", index, "encoder_layer") for index in layers],
                 "decoder": [step_name("attention", index) for index in layers],
                 "cross": [step_name("cross_attention", index) for index in layers]}
        hooks = Hooks(keep=[name for part in names.values() for name in part])
        self(inputs, hooks=hooks)
        return {part: ops.stack([hooks.kept[name] for name in part_names]) for part, part_names in names.items()}

    def attention_reading(self, text, part=None, target=None, unknown="error", write_target=None):
        """What `gptlite.attention_maps` shows of `text`, a source (S,): the inputs `call` reads, the part
        ("cross" by default, "encoder" or "decoder"), its weights (n_layer, 1, H, T or S, S or T), and the token
        ids of the queries and of the keys. The target is `target`, or `write_target(self, text)`'s."""
        part = part or "cross"
        if part not in ATTENTION_PARTS:
            raise ConfigError(f"part must be one of {', '.join(ATTENTION_PARTS)}; got {part!r}")
        tokenizer, block_size = self.tokenizer, self.config.block_size
        source = tokenizers.known_text(tokenizer, text, unknown, "source")
        source_ids = tokenizer.encode(source).astype("int32")
        if not 1 <= len(source_ids) <= block_size:
            raise InputError(f"the source must be 1 to {block_size} tokens long; it is {len(source_ids)}")
        if target is None:
            target = write_target(self, source)
        target = tokenizers.known_text(tokenizer, target, unknown, "target")
        target_ids = np.concatenate([[tokenizer.start_token_id], tokenizer.encode(target)]).astype("int32")
        if len(target_ids) > block_size:
            raise InputError(f"the target must be at most {block_size - 1} tokens long; it is {len(target_ids) - 1}")
        inputs = {"source_ids": source_ids[None], "target_ids": target_ids[None]}
        queries = source_ids if part == "encoder" else target_ids
        keys = target_ids if part == "decoder" else source_ids
        return inputs, part, self.attention_weights(inputs)[part], queries, keys

    def decoding_context(self, sources=None):
        """Each decoder block's keys and values of the encoded sources (B, S), and the sources' mask: what every
        decoding step reads (see `call_with_cache`), computed once per source."""
        source_mask = self.source_mask(sources)
        return self.cross_key_values(self.encode(sources, source_mask)), source_mask

    def cross_key_values(self, encoded):
        """Each decoder block's keys and values of the encoder's output: computed once per source."""
        return tuple(block.cross_attention.key_values(encoded) for block in self.blocks)

    def call_with_cache(self, token_ids, cache, start_positions, cross_key_values, source_mask, logits_at=None):
        """As `GPT.call_with_cache`, the decoder attending also over the source
        through `cross_key_values` (from `cross_key_values`) and `source_mask`.
        """
        return self._decode_with_cache(token_ids, cache, start_positions, logits_at,
                                       cross_key_values=cross_key_values, context_mask=source_mask)


# Every kind of gptlite model.
MODELS = (GPT, Seq2Seq)
