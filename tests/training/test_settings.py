import pytest

import gptlite
from gptlite.training import settings
from gptlite.training.settings import (PRESETS, SYNTHETIC_MAX_ITERS, SYNTHETIC_TASKS, chat_settings, default_settings,
                                       resolve_settings, split_settings)

pytestmark = pytest.mark.once("settings are plain Python")


def test_every_preset_is_a_valid_model_and_schedule():
    for values in PRESETS.values():
        model_settings, training_settings = split_settings(values)
        gptlite.GPTConfig(**model_settings)
        gptlite.TrainingConfig(**training_settings)


def test_each_synthetic_task_trains_the_seq2seq_preset_for_its_own_steps():
    assert set(SYNTHETIC_MAX_ITERS) == set(SYNTHETIC_TASKS)
    assert default_settings() == PRESETS["cpu"]
    assert default_settings(seq2seq=True) == PRESETS["seq2seq"]
    for task, steps in SYNTHETIC_MAX_ITERS.items():
        settings = default_settings(seq2seq=True, synthetic=task)
        assert settings == {**PRESETS["seq2seq"], "max_iters": steps}
        gptlite.TrainingConfig(**split_settings(settings)[1])


def test_settings_come_from_the_defaults_then_the_preset_then_overrides():
    assert resolve_settings() == PRESETS["cpu"]
    tiny = resolve_settings("tiny", {"max_iters": 70, "lr": None})
    assert tiny == {**PRESETS["tiny"], "max_iters": 70}  # None means: not given
    assert resolve_settings(overrides={"n_layer": 1}, seq2seq=True, synthetic="reverse") == {
        **PRESETS["seq2seq"], "max_iters": SYNTHETIC_MAX_ITERS["reverse"], "n_layer": 1}


def test_unknown_settings_and_presets_are_named():
    with pytest.raises(gptlite.ConfigError, match="unknown settings: max_iter "):
        resolve_settings(overrides={"max_iter": 5})
    with pytest.raises(gptlite.ConfigError, match="preset must be one of"):
        resolve_settings("huge")


def test_a_resumed_run_keeps_its_shape_and_precision_and_may_train_longer():
    checkpoint = {"model_config": {**PRESETS["tiny"], "bias": False, "tie_weights": True, "position": "learned"},
                  "training_config": {**split_settings(PRESETS["tiny"])[1], "precision": "fp32", "seed": 5}}
    resumed = resolve_settings(overrides={"max_iters": 500}, checkpoint=checkpoint)
    assert resumed["max_iters"] == 500 and resumed["seed"] == 5 and resumed["n_embd"] == PRESETS["tiny"]["n_embd"]
    with pytest.raises(gptlite.ConfigError, match=r"another shape \(`n_embd` is 32 in the checkpoint, 64 here\) and "
                                                  r".*optimizer state .* \(`precision` is fp32"):
        resolve_settings(overrides={"n_embd": 64, "precision": "bf16"}, checkpoint=checkpoint)
    # An older checkpoint has no grad_accum: it trained one batch a step, and keeps doing so.
    assert resumed["grad_accum"] == 1
    with pytest.raises(gptlite.ConfigError) as refusal:
        resolve_settings(overrides={"grad_accum": 4}, checkpoint=checkpoint)
    assert "optimizer state was saved for other settings (`grad_accum` is 1 in the checkpoint, 4 here)" in str(
        refusal.value) and "shape" not in str(refusal.value)


def test_a_presets_warm_up_fits_a_short_run_and_a_given_one_is_kept():
    for preset in (None, *PRESETS):
        settings = resolve_settings(preset, {"max_iters": 40})
        assert settings["warmup_iters"] == min(default_settings().get("warmup_iters") if preset is None
                                               else PRESETS[preset]["warmup_iters"], 8)
        gptlite.TrainingConfig(**split_settings(settings)[1])
    assert resolve_settings("cpu")["warmup_iters"] == PRESETS["cpu"]["warmup_iters"]
    assert resolve_settings(overrides={"max_iters": 40, "warmup_iters": 20})["warmup_iters"] == 20
    with pytest.raises(gptlite.ConfigError, match="warmup_iters"):
        gptlite.TrainingConfig(**split_settings(resolve_settings(overrides={"max_iters": 40, "warmup_iters": 40}))[1])


def test_a_chat_run_is_sized_from_its_conversations():
    # A small file of short conversations: the shortest context, the fewest steps.
    short, line = chat_settings([30] * 500)
    assert short == {**PRESETS["modern"], "batch_size": settings.CHAT_BATCH_SIZE, "block_size": 64,
                     "max_iters": settings.CHAT_MIN_STEPS, "eval_interval": 100, "checkpoint_interval": 100,
                     "eval_iters": 80}
    assert "context 64 (100% fit whole" in line and "1,000 steps of 8 rows" in line
    # Longer conversations: the shortest context that holds 99% of them whole; one longer than any is cut.
    assert chat_settings([100] * 990 + [2000] * 10)[0]["block_size"] == 128
    assert chat_settings([100] * 980 + [2000] * 20)[0]["block_size"] == 256
    assert [chat_settings([length] * 100)[0]["block_size"] for length in (129, 130, 161, 162, 193, 194)] == \
        [128, 160, 160, 192, 192, 256]
    long, line = chat_settings([400] * 100)
    assert long["block_size"] == 256 and "0% fit whole" in line
    # Steps: twenty passes over the packed rows (conversations of 30 tokens fill a 65-token row 2 at a time),
    # rounded up to a hundred...
    middle, line = chat_settings([30] * 8_000)
    assert settings.packed_rows([30] * 8_000, 64) == 4_000 and settings.CHAT_EPOCHS == 20
    assert middle["max_iters"] == 10_000 and "10,000 steps of 8 rows (20.0 passes over 4,000 packed rows)" in line
    # ... up to about 14 minutes' worth of tokens on 2 cores, evaluated and saved about ten times a run; a context
    # under 128 gets the steps of 128, whose steps take nearly as long.
    large, line = chat_settings([60] * 20_000)
    assert large["max_iters"] == settings.CHAT_MAX_TOKENS // (8 * 128) and "about 14 minutes on 2 cores" in line
    assert large["eval_interval"] == large["checkpoint_interval"] == large["max_iters"] // 1000 * 100
    # A longer context's token takes longer (its attention grows with it): fewer of them fit the same time.
    steps = {length: chat_settings([length] * 20_000)[0]["max_iters"] for length in (100, 150, 250)}
    assert steps[100] == settings.CHAT_MAX_TOKENS // (8 * 128)
    assert steps[100] * 128 > steps[150] * 160 > steps[250] * 256 > steps[100] * 128 / 2
    with pytest.raises(gptlite.ConfigError, match="no conversations"):
        chat_settings([])


def test_a_preset_or_an_override_wins_over_the_chat_sizing():
    chosen, _ = chat_settings([30] * 500)
    assert resolve_settings(chat=chosen) == chosen
    assert resolve_settings(overrides={"max_iters": 77}, chat=chosen)["max_iters"] == 77
    assert resolve_settings("cpu", chat=chosen) == PRESETS["cpu"]
