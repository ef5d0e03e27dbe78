import dataclasses
import pathlib

import pytest

import gptlite
from gptlite.tasks import task as tasks
from gptlite.training.plan import plan_run, RunArguments
from gptlite.training.settings import PRESETS

pytestmark = pytest.mark.once("a run's plan is plain Python: it reads and writes nothing")


def test_a_plan_resolves_every_setting_once_and_is_frozen(tmp_path):
    asked = RunArguments(out_dir=tmp_path / "run", settings={"max_iters": 40, "n_kv_head": 2}, preset="tiny")
    plan = plan_run(asked, tasks.named())
    assert plan.model_config == gptlite.GPTConfig(**{**{name: PRESETS["tiny"][name] for name in
                                                        ("n_layer", "n_head", "n_embd", "block_size", "dropout")},
                                                     "n_kv_head": 2, "vocab_size": None})
    assert plan.training_config.max_iters == 40 and plan.training_config.warmup_iters == 5
    assert plan.tokenizer == "char" and plan.checkpoint is None and plan.peak_flops is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.training_config = None
    assert not (tmp_path / "run").exists()  # nothing written


def test_a_tasks_sizing_lies_under_the_runs_own_settings(tmp_path):
    sizing = tasks.Sizing({"block_size": 12}, line="the longest pair")
    plan = plan_run(RunArguments(out_dir=tmp_path, settings={"n_layer": 1}), tasks.named("seq2seq"), sizing=sizing)
    assert plan.model_config.block_size == 12 and plan.model_config.n_layer == 1
    assert plan.training_config.batch_size == PRESETS["seq2seq"]["batch_size"]
    assert plan.sizing is sizing


def test_a_plan_refuses_what_cannot_train(tmp_path):
    with pytest.raises(gptlite.ConfigError, match="`lora_rank` trains adapters beside a pretrained model"):
        plan_run(RunArguments(out_dir=tmp_path, settings={"lora_rank": 4}), tasks.named())
    checkpoint = {"model_class": "Seq2Seq", "model_config": {}, "training_config": {}, "step": 1}
    with pytest.raises(gptlite.ConfigError, match="trains a seq2seq model; resume it with `task='seq2seq'`"):
        plan_run(RunArguments(out_dir=tmp_path, resume=True), tasks.named(), checkpoint=checkpoint)
    for arguments, message in ((dict(resume=True, overwrite=True), "contradict each other"),
                               (dict(tokenizer="words"), "tokenizer must be one of char, bpe, got 'words'"),
                               (dict(vocab_size=300), "sets the size of a learned vocabulary"),
                               (dict(peak_flops=-1.0), "peak_flops must be positive"),
                               (dict(long_conversations="trim"), "long_conversations must be")):
        with pytest.raises(gptlite.ConfigError, match=message):
            RunArguments(out_dir=pathlib.Path(tmp_path), **arguments).check()


def test_mfu_is_measured_where_asked_or_in_the_gpu_preset_on_a_gpu(tmp_path):
    gpu = RunArguments(out_dir=tmp_path, preset="gpu")
    assert plan_run(gpu, tasks.named(), device_peak_flops=312e12).peak_flops == 312e12
    assert plan_run(gpu, tasks.named(), device_peak_flops=None).peak_flops is None
    assert plan_run(RunArguments(out_dir=tmp_path, mfu=True), tasks.named()).peak_flops == 312e12
    assert plan_run(RunArguments(out_dir=tmp_path, peak_flops=1e12), tasks.named()).peak_flops == 1e12
