import keras
import numpy as np


def test_sampler_filters_without_a_model():
    from gptlite.sampling import sample_next_token

    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 2000, dtype="float32"))
    noise = np.random.default_rng(0).random(logits.shape).astype("float32")
    draw = lambda t, k, p: keras.ops.convert_to_numpy(
        sample_next_token(logits, np.array([t, k, p], "float32"), noise))
    assert set(draw(0.0, 4, 1.0)) == {0}
    assert set(draw(1.0, 2, 1.0)) == {0, 1}
    # The nucleus keeps a token while the mass ranked above it is below p: here 0, 0.5, 0.8 and 0.95,
    # so each p below is at least 0.1 from every boundary, whatever the CPU's rounding.
    assert set(draw(1.0, 4, 0.7)) == {0, 1}
    assert set(draw(1.0, 4, 0.4)) == {0}
    counts = np.bincount(draw(1.0, 4, 1.0), minlength=4) / 2000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.04)
