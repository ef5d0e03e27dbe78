import pytest

import gptlite
from gptlite.tasks.task import Sizing
from gptlite.tasks import task as tasks
from gptlite.data import LM_SYNTHETIC_TASKS
from gptlite.training.settings import (DEFAULT_PRESET, PRESETS, SYNTHETIC_MAX_ITERS, SYNTHETIC_SETTINGS, SYNTHETIC_TASKS,
                                       default_settings, resolve_settings, split_settings)

pytestmark = pytest.mark.once("settings are plain Python")


def test_every_preset_is_a_valid_model_and_schedule():
    for values in PRESETS.values():
        model_settings, training_settings = split_settings(values)
        gptlite.GPTConfig(**model_settings)
        gptlite.TrainingConfig(**training_settings)


def test_each_synthetic_task_trains_its_task_s_preset_with_its_own_settings():
    assert set(SYNTHETIC_MAX_ITERS) == set(SYNTHETIC_TASKS) | set(LM_SYNTHETIC_TASKS)
    assert default_settings() == PRESETS[DEFAULT_PRESET]
    assert default_settings("seq2seq") == PRESETS["seq2seq"]
    for task, steps in SYNTHETIC_MAX_ITERS.items():
        preset = "seq2seq" if task in SYNTHETIC_TASKS else DEFAULT_PRESET
        settings = default_settings(preset, synthetic=task)
        assert settings == {**PRESETS[preset], **SYNTHETIC_SETTINGS[task]} and settings["max_iters"] == steps
        model_settings, training_settings = split_settings(settings)
        gptlite.GPTConfig(**model_settings)
        gptlite.TrainingConfig(**training_settings)
    # The induction task's model is TransformerLens's demo's shape.
    induction = default_settings(DEFAULT_PRESET, synthetic="induction")
    assert (induction["n_layer"], induction["n_head"], induction["n_embd"]) == (2, 2, 64)


def test_settings_come_from_the_defaults_then_the_preset_then_overrides():
    assert resolve_settings() == PRESETS[DEFAULT_PRESET] == PRESETS["laptop"]
    assert tasks.named().default_preset == DEFAULT_PRESET  # a language model's run takes it
    # A preset named brings nothing of the default's: the cpu preset is GPT-2's layout, trained by AdamW.
    assert resolve_settings("cpu") == PRESETS["cpu"]
    assert gptlite.TrainingConfig(**split_settings(resolve_settings("cpu"))[1]).optimizer == "adamw"
    tiny = resolve_settings("tiny", {"max_iters": 70, "lr": None})
    assert tiny == {**PRESETS["tiny"], "max_iters": 70}  # None means: not given
    assert resolve_settings(overrides={"n_layer": 1}, default_preset="seq2seq", synthetic="reverse") == {
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
    # An older checkpoint has no optimizer setting either: it trained with AdamW, whose moments it holds.
    assert resumed["optimizer"] == "adamw"
    with pytest.raises(gptlite.ConfigError, match=r"optimizer state .* \(`optimizer` is adamw in the checkpoint, "
                                                  r"muon here\)"):
        resolve_settings(overrides={"optimizer": "muon"}, checkpoint=checkpoint)


@pytest.mark.parametrize("setting,saved,given,keras_default", [("newton_schulz_steps", 4, 2, 5),
                                                                 ("muon_momentum", 0.8, 0.9, 0.95)])
def test_muons_settings_are_kept_on_resume_unless_given_and_may_change(setting, saved, given, keras_default):
    # Muon's state (its momentum) has the same shape whatever either says: a resumed run may take another.
    checkpoint = {"model_config": dict(PRESETS["tiny"]),
                  "training_config": {**split_settings(PRESETS["tiny"])[1], "optimizer": "muon", setting: saved}}
    assert resolve_settings(checkpoint=checkpoint)[setting] == saved
    assert resolve_settings(overrides={setting: given}, checkpoint=checkpoint)[setting] == given
    # A checkpoint written before the setting existed trained with Keras's default.
    del checkpoint["training_config"][setting]
    resumed = split_settings(resolve_settings(checkpoint=checkpoint))[1]
    assert getattr(gptlite.TrainingConfig(**resumed), setting) == keras_default


def test_an_optimizer_is_one_of_those_offered_and_lora_trains_with_adamw():
    with pytest.raises(gptlite.ConfigError, match="optimizer must be one of adamw, muon"):
        gptlite.TrainingConfig(optimizer="sgd")
    with pytest.raises(gptlite.ConfigError, match="LoRA's adapters train with the adamw optimizer, not muon"):
        gptlite.TrainingConfig(lora_rank=4, optimizer="muon")


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


def test_settings_a_task_sized_from_its_data_lie_under_the_preset_and_the_overrides():
    sized = Sizing({"batch_size": 8, "block_size": 64, "max_iters": 1000}, "modern")
    assert resolve_settings(sizing=sized) == {**PRESETS["modern"], **sized.settings}
    assert resolve_settings(overrides={"max_iters": 77}, sizing=sized)["max_iters"] == 77
    assert resolve_settings("cpu", sizing=sized) == PRESETS["cpu"]  # a preset named: the sizing's preset is not
    longest = Sizing({"block_size": 23})  # a seq2seq run's longest pair, over its task's default preset
    assert resolve_settings(default_preset="seq2seq", sizing=longest) == {**PRESETS["seq2seq"], "block_size": 23}
    assert resolve_settings("tiny", default_preset="seq2seq", sizing=longest)["block_size"] == PRESETS["tiny"][
        "block_size"]


def test_a_pretrained_model_fine_tunes_with_adamw_whatever_the_default_presets_optimizer():
    pretrained = gptlite.GPTConfig(vocab_size=50, **split_settings(PRESETS["tiny"])[0])
    assert resolve_settings(pretrained=pretrained)["optimizer"] == "adamw"
    with_adapters = resolve_settings(overrides={"lora_rank": 4}, pretrained=pretrained)
    assert gptlite.TrainingConfig(**split_settings(with_adapters)[1]).lora_rank == 4  # LoRA refuses Muon
