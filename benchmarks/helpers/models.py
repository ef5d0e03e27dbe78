"""The random-weight models the speed benchmarks measure (speed only: the same weights every time): the `cpu` and
`big` presets' shapes with a 65-token vocabulary (`random_model`), the default preset's (`laptop_model`), and GPT-2
small's and SmolLM2's shapes with
their vocabularies' sizes (`model_of`, `gpt2_sized_model`), whose end token is never the likeliest."""

import keras

import gptlite

SIZES = {
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
    "big": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
}
VOCABULARY_SIZE = 65


def random_model(size, **settings):
    """A built gptlite GPT of that shape (and other `settings`), the same weights every time (speed only)."""
    keras.utils.set_random_seed(0)
    tokenizer = gptlite.CharTokenizer("".join(chr(32 + i) for i in range(VOCABULARY_SIZE)))
    model = gptlite.GPT(vocab_size=VOCABULARY_SIZE, tokenizer=tokenizer, **SIZES[size], **settings)
    model.build((None, SIZES[size]["block_size"]))
    return model


GPT2_SMALL = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024)
GPT2_VOCABULARY_SIZE = 50257
LARGE_SHAPES = {
    "gpt2": dict(GPT2_SMALL, bias=True),
    "smollm2": dict(n_layer=30, n_head=9, n_kv_head=3, n_embd=576, mlp_hidden_size=1536, block_size=2048,
                    position="rotary", norm="rms", mlp="swiglu", rope_theta=100000.0),
}
LARGE_VOCABULARY_SIZES = {"gpt2": GPT2_VOCABULARY_SIZE, "smollm2": 49152}
# What the decoding benchmarks write from: in the cpu shape's 65 characters too.
PROMPT = "HELLO"


def gpt2_sized_tokenizer(vocabulary_size=GPT2_VOCABULARY_SIZE):
    """A byte-level tokenizer with GPT-2's 50,257 ids (or `vocabulary_size`): the 256 bytes, one merge,
    placeholders, the end token."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocabulary = {symbol: index for index, symbol in enumerate(alphabet)}
    merged = alphabet[0] + alphabet[1]  # one merge, which KerasHub's tokenizer needs
    vocabulary[merged] = len(alphabet)
    vocabulary.update({f"<unused{index}>": index for index in range(len(alphabet) + 1, vocabulary_size - 1)})
    vocabulary[gptlite.BPETokenizer.END_TOKEN] = vocabulary_size - 1
    return gptlite.BPETokenizer.from_vocabulary_and_merges(vocabulary, [(alphabet[0], alphabet[1])])


def gpt2_sized_model():
    """A gptlite GPT of GPT-2 small's shape with random weights (seed 0) that never ends early."""
    return model_of("gpt2")


def laptop_model():
    """The default (`laptop`) preset's model (rotary, RMSNorm, SwiGLU, grouped-query, QK-norm) with the `cpu` shape's
    65 characters and random weights."""
    keras.utils.set_random_seed(0)
    laptop = {key: gptlite.PRESETS["laptop"][key] for key in ("n_layer", "n_head", "n_embd", "block_size", "position",
                                                             "norm", "mlp", "n_kv_head", "qk_norm")}
    model = gptlite.GPT(vocab_size=VOCABULARY_SIZE, tokenizer=random_model("cpu").tokenizer, **laptop)
    model.build((None, laptop["block_size"]))
    return model


def model_of(shape):
    """A random-weight GPT of the shape ("cpu", "laptop", or one of LARGE_SHAPES); a large vocabulary's end token is
    never the likeliest (its row is zero)."""
    if shape == "cpu":
        return random_model("cpu")
    if shape == "laptop":
        return laptop_model()
    keras.utils.set_random_seed(0)
    size = LARGE_VOCABULARY_SIZES[shape]
    tokenizer = gpt2_sized_tokenizer(size)
    model = gptlite.GPT(vocab_size=size, tokenizer=tokenizer, **LARGE_SHAPES[shape])
    model.build((None, LARGE_SHAPES[shape]["block_size"]))
    table = model.embedding.token_embedding.embeddings
    table.assign(keras.ops.where(keras.ops.arange(size)[:, None] == tokenizer.end_token_id, 0.0, table.value))
    return model
