"""The model shapes the generation benchmarks measure, as random-weight models with a 65-token vocabulary.

`cpu` is the cpu preset's shape (4 layers, 4 heads, width 128, context 64),
`big` the gpu preset's (6 layers, 6 heads, width 384, context 256).
"""

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
