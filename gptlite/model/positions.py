"""Where a token sits: the three kinds of position information a model can have.

- "learned": a trained (block_size, C) table, one vector per position, added
  to the token embeddings (GPT-2's).
- "sinusoidal": the fixed table of "Attention Is All You Need", added the same way.
- "rotary" (RoPE, Su et al. 2021): nothing is added to the embeddings; inside
  attention, each head's query and key vectors are rotated by angles that grow
  with their position, so that a query-key product depends only on how far
  apart the two tokens are.

The first two are tables that `layers.TokenAndPositionEmbedding` holds; the
third is applied by `attention.Attention` with `rotate`.
"""

import numpy as np
from keras import ops

from gptlite.model.config import GPTConfig


def token_positions(start_positions, length):
    """Absolute positions (B, T) of `length` tokens per row, row b starting at start_positions[b]."""
    return ops.reshape(start_positions, (-1, 1)) + ops.arange(length)[None, :]


def sinusoidal_position_encoding(length, width):
    """The fixed encoding of "Attention Is All You Need", as a (length, width) array.

    PE(pos, 2i) = sin(pos / 10000^(2i/width)), PE(pos, 2i+1) = cos(pos / 10000^(2i/width)).
    """
    positions = np.arange(length, dtype=np.float64)[:, None]  # (T, 1)
    two_i = np.arange(0, width, 2, dtype=np.float64)[None, :]  # (1, ceil(C/2))
    angles = positions / np.power(10000.0, two_i / width)  # (T, ceil(C/2))
    encoding = np.zeros((length, width), dtype=np.float64)
    encoding[:, 0::2] = np.sin(angles)
    encoding[:, 1::2] = np.cos(angles[:, : width // 2])
    return encoding.astype(np.float32)


def rotary_angles(positions, head_size, theta=GPTConfig.rope_theta):
    """The rotation angles (..., D/2) of positions (...): position p turns pair i by p / theta^(2i/D).

    The first pairs turn fast and tell near positions apart; the last turn
    slowly and still differ across thousands of positions.
    """
    frequencies = 1.0 / np.power(theta, np.arange(0, head_size, 2, dtype=np.float64) / head_size)  # (D/2,)
    return ops.cast(positions, "float32")[..., None] * ops.convert_to_tensor(frequencies.astype(np.float32))


def rotate(x, angles):
    """Rotate the head vectors x (B, T, H, D) by angles (B, T, D/2) or (T, D/2).

    Dimension i is paired with i + D/2 (the "rotate half" layout of Hugging
    Face's Llama, whose weights gptlite reads as they are):
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    """
    cos = ops.cast(ops.cos(angles), x.dtype)[..., None, :]  # (B, T, 1, D/2)
    sin = ops.cast(ops.sin(angles), x.dtype)[..., None, :]
    first, second = ops.split(x, 2, axis=-1)  # each (B, T, H, D/2)
    return ops.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def rotary_table(length, head_size, theta=GPTConfig.rope_theta):
    """What rotary positions do to one head, as a (length, D) array: cos then sin of each pair's angle.

    A drawing of it shows the fast pairs cycling and the slow ones barely
    moving; two rows' cosine similarity depends only on their distance.
    """
    angles = ops.convert_to_numpy(rotary_angles(np.arange(length), head_size, theta))  # (T, D/2)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)
