import dataclasses
import json
import warnings

import keras
import numpy as np
import pytest

import gptlite
from gptlite.model import layers, norms, positions
from gptlite.model.attention import Attention, causal_mask, scaled_dot_product_attention
from gptlite.model.blocks import EncoderBlock, TransformerBlock
from gptlite.model.hooks import Hooks


def numpy_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def numpy_causal_attention(q, k, v):
    """softmax(Q K^T / sqrt(d) + causal mask) V for (B, H, T, D) arrays."""
    length, head_size = q.shape[-2], q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(head_size)
    scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
    weights = numpy_softmax(scores)
    return weights @ v, weights


def with_weights(attention, *args, **kwargs):
    """An attention layer's output and its weights (B, H, T, S), which hooks keep."""
    hooks = Hooks(keep=["attention"])
    output = attention(*args, hooks=hooks, **kwargs)
    return output, hooks.kept["attention"]


@pytest.mark.parametrize("batch,length,width,heads", [(1, 1, 8, 1), (2, 5, 8, 2), (3, 7, 12, 3), (2, 16, 32, 4)])
def test_causal_self_attention_matches_numpy_reference(batch, length, width, heads):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, length, width)).astype("float32")
    attention = Attention(gptlite.GPTConfig(n_embd=width, n_head=heads, bias=True))
    attention.build(x.shape)
    for weight in attention.weights:  # random biases too, so they are checked
        weight.assign(rng.normal(scale=0.3, size=weight.shape).astype("float32"))

    output, weights = with_weights(attention, x)

    qkv_kernel, qkv_bias = (w.numpy() for w in attention.qkv_projection.weights)
    out_kernel, out_bias = (w.numpy() for w in attention.output_projection.weights)
    head_size = width // heads
    q, k, v = np.split(x @ qkv_kernel + qkv_bias, 3, axis=-1)  # each (B, T, C)
    to_heads = lambda t: t.reshape(batch, length, heads, head_size).transpose(0, 2, 1, 3)
    expected_heads, expected_weights = numpy_causal_attention(to_heads(q), to_heads(k), to_heads(v))
    merged = expected_heads.transpose(0, 2, 1, 3).reshape(batch, length, width)
    expected = merged @ out_kernel + out_bias

    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected_weights, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected, atol=1e-5)
    # Without weights to return, the backend's fused attention computes the same thing.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(attention(x)), expected, atol=1e-5)


def test_attention_over_a_padded_context_matches_numpy_reference():
    rng = np.random.default_rng(1)
    batch, length, context_length, width, heads = 2, 3, 5, 8, 2
    x = rng.normal(size=(batch, length, width)).astype("float32")
    context = rng.normal(size=(batch, context_length, width)).astype("float32")
    context_mask = np.array([[True, True, True, False, False], [True, True, True, True, True]])
    attention = Attention(gptlite.GPTConfig(n_embd=width, n_head=heads, bias=True), causal=False, cross=True)
    attention.build(x.shape)
    for weight in attention.weights:
        weight.assign(rng.normal(scale=0.3, size=weight.shape).astype("float32"))

    output, weights = with_weights(attention, x, context, context_mask)

    kernel = lambda dense: [w.numpy() for w in dense.weights]  # noqa: E731
    (q_kernel, q_bias), (kv_kernel, kv_bias), (out_kernel, out_bias) = (
        kernel(attention.query_projection), kernel(attention.key_value_projection),
        kernel(attention.output_projection))
    head_size = width // heads
    to_heads = lambda t: t.reshape(batch, -1, heads, head_size).transpose(0, 2, 1, 3)  # noqa: E731
    q = to_heads(x @ q_kernel + q_bias)
    k, v = (to_heads(t) for t in np.split(context @ kv_kernel + kv_bias, 2, axis=-1))
    scores = np.where(context_mask[:, None, None, :], q @ np.swapaxes(k, -1, -2) / np.sqrt(head_size), -np.inf)
    expected_weights = numpy_softmax(scores)
    expected = (expected_weights @ v).transpose(0, 2, 1, 3).reshape(batch, length, width) @ out_kernel + out_bias

    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected_weights, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected, atol=1e-5)
    assert np.all(keras.ops.convert_to_numpy(weights)[0, :, :, 3:] == 0)  # padding gets no attention


def test_encoder_block_sees_later_positions_and_ignores_padding():
    keras.utils.set_random_seed(2)
    rng = np.random.default_rng(2)
    block = EncoderBlock(gptlite.GPTConfig(n_embd=8, n_head=2))
    x = rng.normal(size=(1, 6, 8)).astype("float32")
    block.build(x.shape)
    mask = np.array([[True, True, True, True, False, False]])
    before = keras.ops.convert_to_numpy(block(x, padding_mask=mask))

    later_changed = x.copy()
    later_changed[0, 3] = rng.normal(size=8)  # a real position after the first three
    after = keras.ops.convert_to_numpy(block(later_changed, padding_mask=mask))
    # Freshly initialised projections are small, so the effect is small, but far
    # above float noise (about 1e-7 here), which is all a padded change may cause.
    assert np.abs(after[0, :3] - before[0, :3]).max() > 1e-5

    padding_changed = x.copy()
    padding_changed[0, 4:] = rng.normal(size=(2, 8))
    after = keras.ops.convert_to_numpy(block(padding_changed, padding_mask=mask))
    np.testing.assert_allclose(after[0, :4], before[0, :4], atol=1e-6)


class UnfusedAttention(Attention):
    """Always the step-by-step attention, for comparison with the fused one."""

    def call(self, x, context=None, context_mask=None, packed=None, training=None, cache=None, placement=None,
             hooks=None):
        return super().call(x, packed=packed, training=training, hooks=Hooks())  # hooks that keep nothing


@pytest.mark.parametrize("packed", [False, True])
def test_fused_attention_trains_exactly_like_the_step_by_step_one(tokenizer, packed):
    import gptlite

    def trained_weights(fused):
        keras.utils.set_random_seed(3)
        model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=16, block_size=8)
        model.build((None, 8))
        if not fused:
            for block in model.blocks:
                block.attention.__class__ = UnfusedAttention
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        ids = np.random.default_rng(0).integers(0, tokenizer.vocabulary_size, (4, 9))
        inputs = ids[:, :-1]
        if packed:  # rows of two texts, attended apart
            inputs = {"token_ids": inputs, "positions": np.tile([0, 1, 2, 0, 1, 2, 3, 4], (4, 1))}
        for _ in range(3):
            model.train_on_batch(inputs, ids[:, 1:])
        return [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]

    for fused, unfused in zip(trained_weights(True), trained_weights(False)):
        np.testing.assert_allclose(fused, unfused, atol=1e-5)


def test_scaled_dot_product_attention_with_mask_matches_numpy():
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(2, 3, 6, 4)).astype("float32") for _ in range(3))
    output, weights = scaled_dot_product_attention(q, k, v, causal_mask(6, 6))
    expected, expected_weights = numpy_causal_attention(q, k, v)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected_weights, atol=1e-6)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_one_query_a_row_over_a_cache_matches_numpy(kv_heads):
    # A decoding step's form: one query a row, each row seeing its own number of cached keys.
    rng = np.random.default_rng(3)
    q = rng.normal(size=(2, 4, 1, 8)).astype("float32")
    k, v = (rng.normal(size=(2, kv_heads, 6, 8)).astype("float32") for _ in range(2))
    visible = np.arange(6)[None, :] <= np.array([2, 5])[:, None]  # (B, S)
    output, weights = scaled_dot_product_attention(q, k, v, visible[:, None, None, :])
    shared_k, shared_v = (np.repeat(part, 4 // kv_heads, axis=1) for part in (k, v))
    scores = np.where(visible[:, None, None, :], q @ shared_k.swapaxes(-1, -2) / np.sqrt(8), -np.inf)
    expected_weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected_weights /= expected_weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected_weights, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected_weights @ shared_v, atol=1e-5)


def test_attention_over_a_single_key_gives_it_all_the_weight_without_a_warning():
    rng = np.random.default_rng(2)
    q = rng.normal(size=(2, 3, 4, 5)).astype("float32")
    k, v = (rng.normal(size=(2, 3, 1, 5)).astype("float32") for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns of a softmax over one element
        output, weights = scaled_dot_product_attention(q, k, v, causal_mask(4, 1, query_offset=3))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(weights), np.ones((2, 3, 4, 1)))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), np.broadcast_to(v, (2, 3, 4, 5)), atol=1e-6)


def test_causal_mask_with_offset_lets_late_queries_see_earlier_keys():
    mask = keras.ops.convert_to_numpy(causal_mask(2, 5, query_offset=3))
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


def test_head_count_must_divide_width():
    with pytest.raises(gptlite.ConfigError, match=r"n_embd \(16\).*n_head \(3\)"):
        Attention(gptlite.GPTConfig(n_embd=16, n_head=3))


@pytest.mark.parametrize("width", [6, 7])
def test_sinusoidal_encoding_matches_formula(width):
    table = positions.sinusoidal_position_encoding(12, width)
    for pos in range(12):
        for j in range(width):
            i = j // 2
            angle = pos / 10000 ** (2 * i / width)
            expected = np.sin(angle) if j % 2 == 0 else np.cos(angle)
            assert table[pos, j] == pytest.approx(expected, abs=1e-6)


def test_sinusoidal_embedding_adds_the_fixed_table_and_does_not_train():
    embedding = layers.TokenAndPositionEmbedding(10, 8, 6, position="sinusoidal")
    embedding.build((None, 8))
    ids = np.array([[1, 2, 3, 4, 5]])
    tokens_only = keras.ops.convert_to_numpy(embedding.token_embedding(ids))
    added = keras.ops.convert_to_numpy(embedding(ids)) - tokens_only
    np.testing.assert_allclose(added[0], positions.sinusoidal_position_encoding(8, 6)[:5], atol=1e-6)
    assert all(w is not embedding.position_embeddings for w in embedding.trainable_weights)


def test_untied_embedding_has_its_own_output_matrix():
    tied = layers.TokenAndPositionEmbedding(10, 8, 4, tie_weights=True)
    untied = layers.TokenAndPositionEmbedding(10, 8, 4, tie_weights=False)
    tied.build((None, 8))
    untied.build((None, 8))
    assert len(untied.trainable_weights) == len(tied.trainable_weights) + 1
    assert keras.ops.shape(untied.logits(np.zeros((1, 3, 4), "float32"))) == (1, 3, 10)


LAYER_CASES = [
    (layers.TokenAndPositionEmbedding, dict(vocab_size=11, block_size=8, n_embd=4, position="sinusoidal",
                                            tie_weights=False), (2, 5), "int32"),
    (Attention, dict(config=gptlite.GPTConfig(n_embd=8, n_head=2, dropout=0.1, attention_dropout=0.05)),
     (2, 5, 8), "float32"),
    (Attention, dict(config=gptlite.GPTConfig(n_embd=16, n_head=4, n_kv_head=2, qkv_bias=True, position="rotary",
                                              rope_theta=500.0, qk_norm=True, norm_epsilon=1e-6)),
     (2, 5, 16), "float32"),
    (layers.FeedForward, dict(dropout=0.2, bias=True), (2, 5, 8), "float32"),
    (layers.FeedForward, dict(bias=False, mlp="swiglu", mlp_hidden_size=12), (2, 5, 8), "float32"),
    (TransformerBlock,
     dict(config=gptlite.GPTConfig(n_embd=8, n_head=4, dropout=0.1, norm_epsilon=1e-6, attention_dropout=0.1)),
     (2, 5, 8), "float32"),
    (TransformerBlock,
     dict(config=gptlite.GPTConfig(n_embd=16, n_head=4, n_kv_head=1, norm="rms", mlp="swiglu", mlp_hidden_size=24,
                                   position="rotary", qk_norm=True)),
     (2, 5, 16), "float32"),
    (Attention, dict(config=gptlite.GPTConfig(n_embd=8, n_head=2, dropout=0.1, attention_dropout=0.05),
                     causal=False, cross=True), (2, 5, 8), "float32"),
    (EncoderBlock, dict(config=gptlite.GPTConfig(n_embd=8, n_head=2, dropout=0.1, bias=True, norm_epsilon=1e-6)),
     (2, 5, 8), "float32"),
    (layers.Linear, dict(units=3, use_bias=False), (2, 5, 8), "float32"),
    (norms.RMSNorm, dict(epsilon=1e-6), (2, 5, 8), "float32"),
]


@pytest.mark.parametrize("cls,kwargs,shape,dtype", LAYER_CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_layer_config_round_trip_gives_same_layer(cls, kwargs, shape, dtype):
    layer = cls(**kwargs, name="original")
    config = json.loads(json.dumps(layer.get_config()))  # plain JSON, as in model.keras
    for key, value in kwargs.items():  # a layer given the model's GPTConfig saves its fields
        assert config[key] == (dataclasses.asdict(value) if isinstance(value, gptlite.GPTConfig) else value)
    clone = cls.from_config(config)
    assert clone.get_config() == layer.get_config()

    rng = np.random.default_rng(0)
    x = rng.integers(0, 11, size=shape) if dtype == "int32" else rng.normal(size=shape)
    x = x.astype(dtype)
    layer.build(shape)
    clone.build(shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x)), keras.ops.convert_to_numpy(clone(x)))


@pytest.mark.parametrize("cls,saved,named", [
    (layers.TokenAndPositionEmbedding, dict(vocabulary_size=11, sequence_length=8, embedding_dim=4),
     dict(vocab_size=11, block_size=8, n_embd=4)),
    (layers.FeedForward, dict(hidden_size=12, use_bias=False), dict(mlp_hidden_size=12, bias=False)),
])
def test_a_layer_saved_under_its_settings_former_names_loads_under_gptconfigs(cls, saved, named):
    earlier = {name: value for name, value in cls(**named).get_config().items() if name not in named}
    config = cls.from_config({**earlier, **saved}).get_config()
    assert {name: config[name] for name in named} == named and not set(saved) & set(config)


@pytest.mark.parametrize("cls", [Attention, TransformerBlock, EncoderBlock])
def test_a_layer_takes_the_models_config_and_keeps_each_setting_under_its_name(cls):
    config = gptlite.GPTConfig(n_embd=16, n_head=4, n_kv_head=2, position="rotary", qk_norm=True)
    layer = cls(config)
    assert layer.config is config
    layer.build((None, 3, 16))
    attention = layer if cls is Attention else layer.attention
    assert attention.config is config and attention.kv_heads == config.kv_heads == 2


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="only TensorFlow's gradient is recomputed")
def test_gelu_recomputing_its_gradient_gives_the_same_values_and_gradient():
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(0).normal(0, 3, size=(4, 50)).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        recomputed, plain = layers.gelu(x, recompute_gradient=True), layers.gelu(x)
    np.testing.assert_array_equal(recomputed.numpy(), plain.numpy())
    np.testing.assert_allclose(tape.gradient(recomputed, x).numpy(), tape.gradient(plain, x).numpy(), atol=1e-5)


def _random_weights(layer, rng, scale=0.3):
    for weight in layer.weights:
        weight.assign(rng.normal(scale=scale, size=weight.shape).astype("float32"))


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_a_block_matches_numpy_with_its_norms_before_or_after_each_sublayer(norm_position):
    rng = np.random.default_rng(10)
    batch, length, width, heads = 2, 5, 8, 2
    x = rng.normal(size=(batch, length, width)).astype("float32")
    config = gptlite.GPTConfig(n_embd=width, n_head=heads, bias=True, mlp="relu2", norm_position=norm_position)
    block = TransformerBlock(config)
    block.build(x.shape)
    _random_weights(block, rng)

    def norm(layer, h):  # LayerNorm with a learned scale and shift
        mean, variance = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
        return (h - mean) / np.sqrt(variance + config.norm_epsilon) * layer.gamma.numpy() + layer.beta.numpy()

    def attention(h):
        qkv_kernel, qkv_bias = (w.numpy() for w in block.attention.qkv_projection.weights)
        out_kernel, out_bias = (w.numpy() for w in block.attention.output_projection.weights)
        to_heads = lambda t: t.reshape(batch, length, heads, width // heads).transpose(0, 2, 1, 3)
        q, k, v = (to_heads(t) for t in np.split(h @ qkv_kernel + qkv_bias, 3, axis=-1))
        merged = numpy_causal_attention(q, k, v)[0].transpose(0, 2, 1, 3).reshape(batch, length, width)
        return merged @ out_kernel + out_bias

    def feed_forward(h):
        expand, contract = block.feed_forward.expand, block.feed_forward.contract
        hidden = np.maximum(h @ expand.kernel.numpy() + expand.bias.numpy(), 0.0) ** 2
        return hidden @ contract.kernel.numpy() + contract.bias.numpy()

    if norm_position == "pre":  # x + f(norm(x))
        h = x + attention(norm(block.attention_norm, x))
        expected = h + feed_forward(norm(block.feed_forward_norm, h))
    else:  # norm(x + f(x)): the original Transformer's "Add & Norm"
        h = norm(block.attention_norm, x + attention(x))
        expected = norm(block.feed_forward_norm, h + feed_forward(h))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(block(x)), expected, rtol=1e-4, atol=1e-4)


def test_post_norm_models_have_no_norm_after_their_stacks(tokenizer):
    shape = dict(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=8, block_size=8)
    pre, post = (gptlite.GPT(**shape, norm_position=where) for where in ("pre", "post"))
    for model in (pre, post):
        model.build((None, 8))
    # Every block has its norms either way; the pre-norm model one more, of width 8 (a scale and no shift).
    assert pre.count_params() - post.count_params() == 8 and post.final_norm is None
    seq2seq = gptlite.Seq2Seq(**{**shape, "vocab_size": None}, norm_position="post",
                              tokenizer=gptlite.CharTokenizer("ab", special_tokens=("pad", "start", "end")))
    assert seq2seq.encoder_norm is None and seq2seq.final_norm is None


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_attention_matches_numpy_with_each_key_value_head_shared_by_its_group(kv_heads):
    rng = np.random.default_rng(4)
    batch, length, width, heads = 2, 6, 16, 4
    x = rng.normal(size=(batch, length, width)).astype("float32")
    attention = Attention(gptlite.GPTConfig(n_embd=width, n_head=heads, n_kv_head=kv_heads, bias=True))
    attention.build(x.shape)
    _random_weights(attention, rng)
    assert attention.qkv_projection.kernel.shape == (width, (heads + 2 * kv_heads) * width // heads)

    kernel, bias = (w.numpy() for w in attention.qkv_projection.weights)
    out_kernel, out_bias = (w.numpy() for w in attention.output_projection.weights)
    size, groups = width // heads, heads // kv_heads
    qkv = (x @ kernel + bias).reshape(batch, length, heads + 2 * kv_heads, size).transpose(0, 2, 1, 3)
    q, k, v = qkv[:, :heads], qkv[:, heads:heads + kv_heads], qkv[:, heads + kv_heads:]
    # Query head h reads key/value head h // G.
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    expected_heads, expected_weights = numpy_causal_attention(q, k, v)
    expected = expected_heads.transpose(0, 2, 1, 3).reshape(batch, length, width) @ out_kernel + out_bias

    output, weights = with_weights(attention, x)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected_weights, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(attention(x)), expected, atol=1e-5)  # the fused path


def numpy_rotate(x, position, theta):
    """Rotate each vector x (..., D) at `position`: pair (i, i + D/2) turns by position / theta^(2i/D)."""
    half = x.shape[-1] // 2
    angles = position / theta ** (np.arange(half) * 2 / x.shape[-1])
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * np.cos(angles) - second * np.sin(angles),
                           second * np.cos(angles) + first * np.sin(angles)], axis=-1)


def test_rotary_positions_rotate_pairs_and_make_query_key_products_depend_on_distance_only():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1, 7, 2, 8)).astype("float32")  # (B, T, H, D)
    angles = positions.rotary_angles(np.arange(7), 8, theta=100.0)
    rotated = keras.ops.convert_to_numpy(positions.rotate(x, angles))
    for t in range(7):
        np.testing.assert_allclose(rotated[0, t], numpy_rotate(x[0, t], t, 100.0), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)

    query, key = rng.normal(size=8), rng.normal(size=8)
    products = {(p, s): numpy_rotate(query, p, 100.0) @ numpy_rotate(key, s, 100.0) for p in range(6) for s in range(6)}
    for (p, s), product in products.items():
        if p + 1 < 6 and s + 1 < 6:  # both one position later: the same distance, the same product
            assert product == pytest.approx(products[(p + 1, s + 1)], abs=1e-9)
    assert products[(0, 0)] != pytest.approx(products[(3, 0)], abs=1e-3)


def test_rms_norm_matches_numpy():
    rng = np.random.default_rng(6)
    x = rng.normal(2.0, 3.0, size=(2, 3, 8)).astype("float32")
    norm = norms.RMSNorm(epsilon=1e-6)
    norm.build(x.shape)
    _random_weights(norm, rng)
    gamma = norm.gamma.numpy()
    expected = x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + 1e-6) * gamma
    np.testing.assert_allclose(keras.ops.convert_to_numpy(norm(x)), expected, rtol=1e-5, atol=1e-5)


def test_swiglu_feed_forward_matches_numpy():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2, 3, 8)).astype("float32")
    feed_forward = layers.FeedForward(bias=False, mlp="swiglu", mlp_hidden_size=12)
    feed_forward.build(x.shape)
    _random_weights(feed_forward, rng)
    expand, contract = feed_forward.expand.kernel.numpy(), feed_forward.contract.kernel.numpy()
    assert expand.shape == (8, 24) and contract.shape == (12, 8)
    gate, up = x @ expand[:, :12], x @ expand[:, 12:]
    expected = (gate / (1 + np.exp(-gate)) * up) @ contract
    np.testing.assert_allclose(keras.ops.convert_to_numpy(feed_forward(x)), expected, atol=1e-5)


def test_relu2_feed_forward_matches_numpy_and_is_as_wide_as_gelu_by_default():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(2, 3, 8)).astype("float32")
    feed_forward = layers.FeedForward(bias=True, mlp="relu2")
    feed_forward.build(x.shape)
    _random_weights(feed_forward, rng)
    expand, contract = feed_forward.expand.kernel.numpy(), feed_forward.contract.kernel.numpy()
    assert expand.shape == (8, 32) and contract.shape == (32, 8)
    hidden = np.maximum(x @ expand + feed_forward.expand.bias.numpy(), 0.0) ** 2
    expected = hidden @ contract + feed_forward.contract.bias.numpy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(feed_forward(x)), expected, rtol=1e-5, atol=1e-5)


def test_swiglu_default_width_keeps_about_the_weights_of_gelu():
    for width in (64, 128, 384, 576, 768):
        hidden = layers.feed_forward_width(width, "swiglu")
        assert hidden % 16 == 0
        assert abs(3 * width * hidden - 2 * width * 4 * width) <= 0.1 * 8 * width * width


def test_linear_with_adapters_computes_the_merged_kernel_and_saves_it_merged():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(2, 3, 6)).astype("float32")
    layer = layers.Linear(4, use_bias=True)
    layer.build(x.shape)
    _random_weights(layer, rng)
    layer.enable_lora(2, alpha=4.0)
    assert [w.name for w in layer.trainable_weights] == ["lora_a", "lora_b"]
    layer.lora_b.assign(rng.normal(size=(2, 4)).astype("float32"))
    merged = layer.kernel.numpy() + 2.0 * layer.lora_a.numpy() @ layer.lora_b.numpy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.merged_kernel()), merged, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), x @ merged + layer.bias.numpy(), atol=1e-5)

    store = {}
    layer.save_own_variables(store)
    plain = layers.Linear(4, use_bias=True)
    plain.build(x.shape)
    plain.load_own_variables(store)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(plain(x)), keras.ops.convert_to_numpy(layer(x)), atol=1e-5)
    layer.load_own_variables(store)  # into a layer with adapters: the kernel holds them, they start again at zero
    assert not np.any(layer.lora_b.numpy())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), keras.ops.convert_to_numpy(plain(x)), atol=1e-5)
    with pytest.raises(ValueError, match="adapters already"):
        layer.enable_lora(2)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention_dropout_drops_weights_in_training_only_and_returns_them_before_dropout(kv_heads):
    x = np.random.default_rng(9).normal(size=(2, 6, 16)).astype("float32")
    attention = Attention(gptlite.GPTConfig(n_embd=16, n_head=4, n_kv_head=kv_heads, attention_dropout=0.5))
    attention.build(x.shape)
    inference, weights = with_weights(attention, x)
    trained, trained_weights = with_weights(attention, x, training=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(trained_weights), keras.ops.convert_to_numpy(weights),
                               atol=1e-6)
    assert np.abs(keras.ops.convert_to_numpy(trained) - keras.ops.convert_to_numpy(inference)).max() > 1e-3


def test_the_layers_within_a_model_are_every_layer_keras_tracks(tiny_model):
    """`layers_within` finds a model's layers through their public attributes; Keras's own walk (private, read here
    only to check it) finds the same ones, a LoRA-enabled model's and a Seq2Seq's too."""
    adapted = gptlite.GPT.from_config(tiny_model.get_config())
    adapted.build((None, 16))
    adapted.enable_lora(2)
    seq2seq = gptlite.Seq2Seq(vocab_size=12, n_layer=2, n_head=2, n_embd=8, block_size=8)
    seq2seq.build()
    for model in (tiny_model, adapted, seq2seq):
        found = layers.layers_within(model)
        tracked = list(model._flatten_layers(include_self=False))
        assert len(found) == len({id(layer) for layer in found}) == len(tracked)
        assert {id(layer) for layer in found} == {id(layer) for layer in tracked}
        # Two models of one config give their layers in one order: what copying weights layer by layer needs.
        twin = type(model).from_config(model.get_config())
        twin.build() if model is seq2seq else twin.build((None, 16))
        if model is adapted:
            twin.enable_lora(2)
        shapes = lambda model: [(type(layer), [tuple(weight.shape) for weight in layer.weights])  # noqa: E731
                                for layer in layers.layers_within(model)]
        assert shapes(twin) == shapes(model)
