import csv
import errno
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest

import gptlite
from gptlite.backend import runtime
from gptlite.data import lm
from gptlite.evaluation import scores
from gptlite.training import checkpoints, fit, history, run
from gptlite.training.settings import dtype_policy

from conftest import REPO, built_once, StopAtStep


@pytest.fixture(scope="module")
def tiny_run(text, tokenizer):
    """One short training run on the generated text, shared by the tests below, once a session (`built_once`).

    Returns (the trained model's config, the evaluation rows, the run's folder)."""
    def train(out):
        keras.utils.set_random_seed(0)
        model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=32, block_size=16,
                            tokenizer=tokenizer)
        train_ids, validation_ids = lm.split(tokenizer.encode(text))
        config = gptlite.TrainingConfig(batch_size=16, max_iters=130, lr=3e-3, min_lr=3e-4, warmup_iters=10,
                                        eval_interval=40, eval_iters=4, seed=0)
        # A folder's name will do.
        rows = fit.train(model, train_ids, validation_ids, config, str(out), "lm", verbose=0)
        return model.config, rows

    out, (model_config, rows) = built_once("tiny-run", train)
    return model_config, rows, out


def test_training_lowers_validation_loss_by_a_clear_margin(tiny_run, tokenizer):
    _, rows, _ = tiny_run
    uniform = math.log(tokenizer.vocabulary_size)
    assert rows[0]["val_loss"] < uniform
    # Words from a 14-word list: a model that learns spelling gets far below uniform.
    assert rows[-1]["val_loss"] < 0.6 * uniform
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] - 0.3


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_precision_trains_about_as_well_as_fp32(tmp_path, text, tokenizer, tiny_run, precision):
    if precision == "fp16" and keras.backend.backend() == "jax":
        pytest.skip("XLA on a CPU has no float16 matmuls; test_fp16_under_jax_on_a_cpu_is_refused checks the message")
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=32, block_size=16,
                        tokenizer=tokenizer, dtype=dtype_policy(precision))
    train_ids, validation_ids = lm.split(tokenizer.encode(text))
    config = gptlite.TrainingConfig(batch_size=16, max_iters=130, lr=3e-3, min_lr=3e-4, warmup_iters=10,
                                    eval_interval=40, eval_iters=4, seed=0, precision=precision)
    rows = fit.train(model, train_ids, validation_ids, config, tmp_path, "lm", verbose=0)
    assert model.compute_dtype == {"bf16": "bfloat16", "fp16": "float16"}[precision]
    assert all(v.dtype == "float32" for v in model.trainable_variables)
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] - 0.3
    # The same run as tiny_run's, in 16 bits: it should end close to the fp32 loss. How close depends on the
    # CPU's 16-bit arithmetic (native bf16 matmuls round otherwise than fp32 ones converted): within a tenth.
    assert abs(rows[-1]["val_loss"] - tiny_run[1][-1]["val_loss"]) < 0.1 * tiny_run[1][-1]["val_loss"]
    # A model saved in 16 bits loads and samples.
    reloaded = gptlite.load(tmp_path / "model.keras")
    assert reloaded.compute_dtype == model.compute_dtype
    assert len(gptlite.generate(reloaded, "the ", max_new_tokens=10, seed=0)) == len("the ") + 10


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the refusal is JAX's")
def test_fp16_under_jax_on_a_cpu_is_refused(tmp_path, tokenizer):
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=1, n_embd=8, block_size=8,
                        dtype=dtype_policy("fp16"))
    ids = np.zeros(100, np.uint16)
    with pytest.raises(gptlite.ConfigError, match="fp16 under jax needs a GPU"):
        fit.train(model, ids, ids, gptlite.TrainingConfig(precision="fp16"), tmp_path, "lm", verbose=0)


def test_a_model_built_in_another_precision_is_refused(tmp_path, tiny_model):
    ids = np.zeros(100, np.uint16)
    with pytest.raises(gptlite.ConfigError, match="computes in float32 but the training precision is bf16"):
        fit.train(tiny_model, ids, ids, gptlite.TrainingConfig(precision="bf16"), tmp_path, "lm", verbose=0)


def test_run_stops_at_max_iters_with_a_final_evaluation(tiny_run):
    _, rows, _ = tiny_run
    assert [row["step"] for row in rows] == [40, 80, 120, 130]


def test_run_writes_history_plot_and_best_model(tiny_run, text, tokenizer):
    model_config, rows, out = tiny_run
    with open(out / "history.csv") as file:
        written = list(csv.DictReader(file))
    assert [int(row["step"]) for row in written] == [row["step"] for row in rows]
    assert float(written[-1]["learning_rate"]) == pytest.approx(3e-4, rel=1e-3)
    for row, csv_row in zip(rows, written):
        # A char model's token is a character: bits per character is the loss in bits.
        assert row["val_bits_per_char"] == pytest.approx(row["val_loss"] / math.log(2), rel=1e-9)
        assert float(csv_row["val_bits_per_char"]) == pytest.approx(row["val_bits_per_char"], rel=1e-9)
        assert 0 < row["tokens_per_s"] == float(csv_row["tokens_per_s"]) < 1e9
        assert "mfu" not in row  # measured only when asked
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "loss.png").stat().st_size > 10_000
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.keras").stat().st_mode & 0o777 == 0o666 & ~umask

    best = min(rows, key=lambda row: row["val_loss"])
    saved = gptlite.load(out / "model.keras")
    assert getattr(saved, "optimizer", None) is None  # a lean file: no optimizer state
    assert saved.config == model_config
    # The saved model is the best one: it scores that evaluation's loss again
    # on the same validation batches (seed + 1, as training draws them).
    _, validation_ids = lm.split(tokenizer.encode(text))
    batches = lm.RandomWindows(validation_ids, 16, 16, 4, seed=1)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    losses = [float(loss(y, saved(x))) for x, y in (batches[i] for i in range(4))]
    assert np.mean(losses) == pytest.approx(best["val_loss"], abs=1e-4)


@pytest.mark.parametrize("settings,field", [
    (dict(batch_size=0), "batch_size"), (dict(lr=-1.0), "lr"), (dict(min_lr=1e-2), "min_lr"),
    (dict(eval_iters=0), "eval_iters"), (dict(warmup_iters=5000), "warmup_iters"),
])
def test_training_config_rejects_impossible_values(settings, field):
    with pytest.raises(gptlite.ConfigError, match=field):
        gptlite.TrainingConfig(**settings)


# The history's columns of time, which differ from run to run.
TIMINGS = ("elapsed_s", "tokens_per_s", "run_tokens_per_s", *(f"{part}_s" for part in history.RunTime.PARTS))


def small_run(tokenizer, text, out, stop_request=None, resume=False, model=None, optimizer="adamw", steps_per_call=1):
    if model is None:
        keras.utils.set_random_seed(5)
    model = model or gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16,
                                 block_size=16, dropout=0.1, tokenizer=tokenizer)
    train_ids, validation_ids = lm.split(tokenizer.encode(text))
    config = gptlite.TrainingConfig(batch_size=8, max_iters=60, lr=3e-3, min_lr=3e-4, warmup_iters=5,
                                    eval_interval=20, eval_iters=2, checkpoint_interval=40, seed=5,
                                    optimizer=optimizer, steps_per_call=steps_per_call)
    return model, fit.train(model, train_ids, validation_ids, config, out, "lm", verbose=0,
                                 resume=resume, stop_request=stop_request)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tokenizer, text):
    return small_run(tokenizer, text, tmp_path_factory.mktemp("whole"))[1]


@pytest.mark.slow
def test_same_seed_gives_identical_loss_history(tmp_path, tokenizer, text, uninterrupted):
    _, again = small_run(tokenizer, text, tmp_path)
    without_time = lambda rows: [{k: v for k, v in row.items() if k not in TIMINGS} for row in rows]
    assert without_time(again) == without_time(uninterrupted)


@pytest.fixture(scope="module")
def uninterrupted_muon(tmp_path_factory, tokenizer, text):
    return small_run(tokenizer, text, tmp_path_factory.mktemp("muon"), optimizer="muon")


def test_muon_moves_the_blocks_matrices_adamw_the_rest_and_the_loss_falls(uninterrupted_muon, tokenizer):
    model, rows = uninterrupted_muon
    optimizer = model.optimizer
    assert isinstance(optimizer, keras.optimizers.Muon)
    # Keras's Muon gives a variable that it leaves to AdamW a second moment (a velocity) of its own.
    # (Its lists follow the variables it was built with: the model's trainable ones.)
    adamw = {variable.path for variable, velocity in zip(model.trainable_variables, optimizer.adam_velocities)
             if velocity is not None}
    for variable in model.trainable_variables:
        matrix_of_a_block = len(variable.shape) == 2 and "embedding" not in variable.path
        assert (variable.path not in adamw) == matrix_of_a_block, variable.path
    uniform = math.log(tokenizer.vocabulary_size)
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] - 0.1 and rows[-1]["val_loss"] < uniform - 0.3


def assert_resumes_as_uninterrupted(tmp_path, tokenizer, text, optimizer, uninterrupted, stop_at=27, stopped_at=27,
                                    steps_per_call=1):
    """A small run stopped at `stop_at` (at `stopped_at`, the end of that step's compiled call) and resumed in a fresh
    model, as in a new process, gets the losses of `uninterrupted` (the rows of the same run, whole)."""
    keras.utils.set_random_seed(5)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        dropout=0.1, tokenizer=tokenizer)
    model.build((None, 16))
    with pytest.raises(gptlite.TrainingInterrupted, match=f"stopped at step {stopped_at} of 60"):
        small_run(tokenizer, text, tmp_path, stop_request=StopAtStep(model, stop_at), model=model, optimizer=optimizer,
                  steps_per_call=steps_per_call)
    assert checkpoints.read_checkpoint(tmp_path)["step"] == stopped_at
    # Everything comes from the checkpoint, the optimizer's state too.
    resumed = small_run(tokenizer, text, tmp_path, resume=True, optimizer=optimizer, steps_per_call=steps_per_call)[1]
    assert_same_losses(resumed, uninterrupted)


def assert_same_losses(rows, uninterrupted):
    assert [row["step"] for row in rows] == [row["step"] for row in uninterrupted] == [20, 40, 60]
    for got, want in zip(rows, uninterrupted):
        assert got["val_loss"] == pytest.approx(want["val_loss"], abs=1e-4)
        assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-4)


def test_steps_run_several_to_a_call_give_the_same_losses_at_the_same_steps(tmp_path, tokenizer, text, uninterrupted):
    # 7 steps a call: the calls before each evaluation (every 20 steps) end short of 7, at the evaluation's step.
    model, rows = small_run(tokenizer, text, tmp_path, steps_per_call=7)
    assert_same_losses(rows, uninterrupted)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 60
    assert math.isfinite(rows[0]["tokens_per_s"]) and rows[0]["tokens_per_s"] > 0


@pytest.mark.slow
def test_a_stop_waits_for_its_call_s_last_step_and_resumes_to_the_same_losses(tmp_path, tokenizer, text,
                                                                               uninterrupted):
    # Calls of 7 steps after step 20 end at 27, 34 and 40; torch runs one step a call.
    stopped_at = 25 if keras.backend.backend() == "torch" else 27
    assert_resumes_as_uninterrupted(tmp_path, tokenizer, text, "adamw", uninterrupted, stop_at=25,
                                    stopped_at=stopped_at, steps_per_call=7)


@pytest.mark.slow
def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(tmp_path, tokenizer, text, uninterrupted):
    assert_resumes_as_uninterrupted(tmp_path, tokenizer, text, "adamw", uninterrupted)


@pytest.mark.slow
def test_an_interrupted_muon_run_resumes_with_its_optimizer_state(tmp_path, tokenizer, text, uninterrupted_muon):
    assert_resumes_as_uninterrupted(tmp_path, tokenizer, text, "muon", uninterrupted_muon[1])


class HeldDisk:
    """A disk whose first fsync waits until the test lets it go (the later ones pass), `holding` it from then.

    It is let go once `release_after` steps ran after the hold began, or at once when the run waits for its
    writes: where it says that a checkpoint waits for the one before (it must), and when it closes its writer
    at its end. `steps` counts the training steps (a Keras callback); `steps_when_held` and
    `steps_when_released`, those before each; `said`, what the run printed (it must train with verbose=1).
    """

    WAIT = 120

    def __init__(self, monkeypatch, release_after=None):
        self.released, self.holding = threading.Event(), False
        self.steps, self.steps_when_held, self.steps_when_released = 0, None, None
        self.release_after = release_after
        self.said = []
        fsync, close = os.fsync, fit.FileWriter.close
        disk = self

        def slow_fsync(descriptor):
            if self.holding and not self.released.is_set():
                self.steps_when_held = self.steps
                assert self.released.wait(self.WAIT), "the disk was never released"
            fsync(descriptor)

        def closing(writer):
            self.release()
            close(writer)

        class Output(io.StringIO):
            def write(self, text):
                disk.said.append(text)
                if fit.SLOW_DISK in text:
                    disk.release()
                return len(text)

        class Steps(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                disk.steps += 1
                held = disk.steps_when_held
                if disk.release_after is not None and held is not None and disk.steps >= held + disk.release_after:
                    disk.release()

        monkeypatch.setattr(os, "fsync", slow_fsync)
        monkeypatch.setattr(fit.FileWriter, "close", closing)
        monkeypatch.setattr(sys, "stdout", Output())
        self.callback = Steps()

    def release(self):
        if not self.released.is_set():
            self.steps_when_released = self.steps
            self.released.set()


def run_with(tokenizer, text, out, callbacks=(), stop_request=None, resume=False, checkpoint_interval=20):
    keras.utils.set_random_seed(5)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        dropout=0.1, tokenizer=tokenizer)
    model.build((None, 16))
    train_ids, validation_ids = lm.split(tokenizer.encode(text))
    config = gptlite.TrainingConfig(batch_size=8, max_iters=60, lr=3e-3, min_lr=3e-4, warmup_iters=5,
                                    eval_interval=20, eval_iters=2, checkpoint_interval=checkpoint_interval, seed=5)
    if callable(stop_request):
        stop_request = stop_request(model)
    rows = fit.train(model, train_ids, validation_ids, config, out, "lm", verbose=1, resume=resume,
                          stop_request=stop_request, callbacks=list(callbacks))
    return model, rows


@pytest.mark.slow
def test_steps_go_on_while_a_checkpoint_is_written_and_it_holds_its_own_step(tmp_path, tokenizer, text,
                                                                             uninterrupted, monkeypatch):
    # From the first write on (step 20's best model, then its checkpoint), the disk syncs nothing for 10 steps.
    disk = HeldDisk(monkeypatch, release_after=10)
    disk.holding = True
    kept = tmp_path / "at step 20"
    kept.mkdir()
    replace = os.replace

    def keeping_the_first_checkpoint(source, target):
        replace(source, target)
        if str(target).endswith(checkpoints.CHECKPOINT) and not (kept / checkpoints.CHECKPOINT).exists():
            shutil.copy(target, kept / checkpoints.CHECKPOINT)

    monkeypatch.setattr(os, "replace", keeping_the_first_checkpoint)
    run_with(tokenizer, text, tmp_path / "run", callbacks=[disk.callback])
    # Step 20's files were handed over at step 20 and were still not all on disk after more steps had run.
    assert disk.steps_when_released > 20 and disk.steps == 60
    # The checkpoint written after them holds step 20 as it was: resumed, the run ends as an uninterrupted one.
    assert checkpoints.read_checkpoint(kept)["step"] == 20
    monkeypatch.setattr(os, "replace", replace)
    _, resumed = small_run(tokenizer, text, kept, resume=True)
    assert [row["step"] for row in resumed] == [20, 40, 60]
    for got, want in zip(resumed, uninterrupted):
        assert got["val_loss"] == pytest.approx(want["val_loss"], abs=1e-4)
        assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-4)


@pytest.mark.slow
def test_a_stop_during_a_write_waits_for_it_and_leaves_every_file_whole(tmp_path, tokenizer, text, monkeypatch):
    # The disk is let go only once the run waits for its writes (step 25's checkpoint for step 20's, then the
    # run's end for all): a run that did not wait would end before any file of step 25 were on disk.
    disk = HeldDisk(monkeypatch)
    disk.holding = True
    with pytest.raises(gptlite.TrainingInterrupted, match="stopped at step 25 of 60"):
        run_with(tokenizer, text, tmp_path, callbacks=[disk.callback], stop_request=lambda m: StopAtStep(m, 25))
    assert disk.steps_when_released == 25
    assert sum(fit.SLOW_DISK in text for text in disk.said) == 1
    assert checkpoints.read_checkpoint(tmp_path)["step"] == 25
    assert gptlite.load(tmp_path / "model.keras").config.n_embd == 16
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no temporary file left


@pytest.mark.slow
def test_a_failed_write_stops_the_run_and_leaves_the_last_good_checkpoint(tmp_path, tokenizer, text, monkeypatch):
    fsync, replace = os.fsync, os.replace
    full = threading.Event()

    def full_after_the_first_checkpoint(source, target):
        replace(source, target)
        if str(target).endswith(checkpoints.CHECKPOINT):
            full.set()

    def full_disk(descriptor):
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(descriptor)

    monkeypatch.setattr(os, "replace", full_after_the_first_checkpoint)
    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(gptlite.GPTLiteError, match="^cannot write .*: No space left on device$") as raised:
        run_with(tokenizer, text, tmp_path)
    assert "\n" not in str(raised.value)
    assert checkpoints.read_checkpoint(tmp_path)["step"] == 20
    assert gptlite.load(tmp_path / "model.keras").config.n_embd == 16


@pytest.mark.slow
def test_a_checkpoint_of_the_earlier_format_still_resumes(tmp_path, tokenizer, text, uninterrupted):
    """Format 1, as earlier versions wrote it: Keras's weights file with the optimizer state, and a document."""
    keras.utils.set_random_seed(5)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        dropout=0.1, tokenizer=tokenizer)
    model.build((None, 16))
    with pytest.raises(gptlite.TrainingInterrupted):
        small_run(tokenizer, text, tmp_path, stop_request=StopAtStep(model, 27), model=model)
    document = checkpoints.read_checkpoint(tmp_path)
    model.save_weights(tmp_path / checkpoints.FORMAT_1_WEIGHTS)
    document.update(format=1, seed_states=[keras.ops.convert_to_numpy(variable).tolist()
                                           for variable in checkpoints._seed_states(model)])
    (tmp_path / checkpoints.FORMAT_1_STATE).write_text(json.dumps(document))
    (tmp_path / checkpoints.CHECKPOINT).unlink()
    _, resumed = small_run(tokenizer, text, tmp_path, resume=True)
    assert [row["step"] for row in resumed] == [20, 40, 60]
    for got, want in zip(resumed, uninterrupted):
        assert got["val_loss"] == pytest.approx(want["val_loss"], abs=1e-4)


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(gptlite.InputError, match="no checkpoint to resume"):
        checkpoints.read_checkpoint(tmp_path)


def test_nan_loss_stops_training_and_keeps_the_last_good_model(tmp_path, tokenizer, text):
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        tokenizer=tokenizer)
    model.build((None, 16))
    (tmp_path / "model.keras").write_bytes(b"the last good model")
    weight = model.blocks[0].feed_forward.expand.kernel
    weight.assign(np.full(weight.shape, np.nan, dtype="float32"))
    with pytest.raises(gptlite.TrainingDiverged, match="became nan by step 1;"):
        small_run(tokenizer, text, tmp_path, model=model)
    assert (tmp_path / "model.keras").read_bytes() == b"the last good model"


def accumulating_run(tokenizer, text, out, batch_size, grad_accum, max_iters=5, stop_request=None, resume=False):
    keras.utils.set_random_seed(7)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        tokenizer=tokenizer)
    model.build((None, 16))
    train_ids, validation_ids = lm.split(tokenizer.encode(text))
    config = gptlite.TrainingConfig(batch_size=batch_size, grad_accum=grad_accum, max_iters=max_iters, lr=3e-3,
                                    min_lr=3e-4, warmup_iters=2, eval_interval=5, eval_iters=1,
                                    checkpoint_interval=5, seed=3)
    rows = fit.train(model, train_ids, validation_ids, config, out, "lm", verbose=0, resume=resume,
                          stop_request=stop_request)
    return model, rows


@pytest.fixture(scope="module")
def one_batch_of_16(tmp_path_factory, tokenizer, text):
    return accumulating_run(tokenizer, text, tmp_path_factory.mktemp("batch16"), 16, 1)


@pytest.mark.slow
def test_two_micro_batches_of_8_take_the_steps_one_batch_of_16_takes(tmp_path, tokenizer, text, one_batch_of_16):
    whole, whole_rows = one_batch_of_16
    accumulated, accumulated_rows = accumulating_run(tokenizer, text, tmp_path, 8, 2)

    assert int(keras.ops.convert_to_numpy(accumulated.optimizer.iterations)) == 5
    assert [row["step"] for row in accumulated_rows] == [5]
    assert accumulated_rows[0]["learning_rate"] == pytest.approx(whole_rows[0]["learning_rate"], rel=1e-6)
    assert accumulated_rows[0]["train_loss"] == pytest.approx(whole_rows[0]["train_loss"], abs=1e-5)
    moved = 0.0
    for got, want, start in zip(accumulated.weights, whole.weights, _initial_weights(tokenizer)):
        got, want = keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want)
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg="weights differ after 5 steps")
        moved = max(moved, float(np.abs(want - start).max()))
    assert moved > 1e-3  # the steps did train: equal weights are not equal starting points


def _initial_weights(tokenizer):
    keras.utils.set_random_seed(7)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        tokenizer=tokenizer)
    model.build((None, 16))
    return [keras.ops.convert_to_numpy(weight) for weight in model.weights]


@pytest.mark.slow
def test_a_checkpoint_whose_optimizer_state_does_not_fit_is_refused(tmp_path, tokenizer, text):
    # Accumulating gradients adds optimizer variables: Keras would only warn and start the optimizer afresh.
    accumulating_run(tokenizer, text, tmp_path, 8, 2)
    with pytest.raises(gptlite.InputError, match="optimizer state in the checkpoint .* does not fit"):
        accumulating_run(tokenizer, text, tmp_path, 8, 1, max_iters=10, resume=True)


@pytest.mark.slow
def test_an_accumulating_run_stops_between_optimizer_steps_and_resumes(tmp_path, tokenizer, text):
    class StopAtOnce:
        signal_number = signal.SIGINT
        requested = True

    with pytest.raises(gptlite.TrainingInterrupted, match="stopped at step 1 of 10"):
        accumulating_run(tokenizer, text, tmp_path, 8, 3, max_iters=10, stop_request=StopAtOnce())
    assert checkpoints.read_checkpoint(tmp_path)["step"] == 1
    model, rows = accumulating_run(tokenizer, text, tmp_path, 8, 3, max_iters=10, resume=True)
    assert [row["step"] for row in rows] == [5, 10]
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 10


@pytest.mark.slow
@pytest.mark.once("the event files are written the same on every backend, and a resumed run's steps on each are "
                   "test_interrupted_and_resumed_run_matches_an_uninterrupted_one's")
def test_tensorboard_holds_each_evaluation_and_its_curve_carries_on_after_resume(tmp_path, tokenizer, text):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import tensorflow as tf

    keras.utils.set_random_seed(2)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        tokenizer=tokenizer)
    train_ids, validation_ids = lm.split(tokenizer.encode(text))
    config = gptlite.TrainingConfig(batch_size=8, max_iters=20, lr=3e-3, min_lr=3e-4, warmup_iters=2,
                                    eval_interval=5, eval_iters=1, checkpoint_interval=10, seed=2)
    events = tmp_path / "events"
    # A "sample" that says which weights wrote it: the sum of the token embedding's.
    embedding_sum = lambda values: float(np.sum(keras.ops.convert_to_numpy(values), dtype="float64"))
    sample = lambda trained: f"embedding sum {embedding_sum(trained.embedding.token_embedding.embeddings):.6f}"
    with pytest.raises(gptlite.TrainingInterrupted):
        fit.train(model, train_ids, validation_ids, config, tmp_path, "lm", verbose=0, tensorboard=events,
                       sample=sample, stop_request=StopAtStep(model, 10), peak_flops=1e12)
    index = next(index for index, variable in enumerate(model.variables)
                 if variable.path.endswith("token_embedding/embeddings"))
    with np.load(tmp_path / checkpoints.CHECKPOINT) as saved:
        at_step_10 = embedding_sum(saved[f"model_{index}"])
    resumed = gptlite.GPT.from_config(model.get_config())
    rows = fit.train(resumed, train_ids, validation_ids, config, tmp_path, "lm", verbose=0, resume=True,
                          tensorboard=events, sample=sample, peak_flops=1e12)

    assert [row["step"] for row in rows] == [5, 10, 15, 20]
    for row in rows:
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * resumed.training_flops_per_token() / 1e12,
                                           rel=1e-6)
    assert len(list(events.iterdir())) == 2  # one event file for each of the two processes' runs
    written = EventAccumulator(str(events), size_guidance={"tensors": 0})
    written.Reload()
    scalars = {"loss/train": "train_loss", "loss/validation": "val_loss", "learning_rate": "learning_rate",
               "bits_per_character/validation": "val_bits_per_char", "tokens_per_second": "tokens_per_s",
               "mfu": "mfu"}
    for tag, column in scalars.items():
        steps_and_values = sorted((event.step, float(tf.make_ndarray(event.tensor_proto)))
                                  for event in written.Tensors(tag))
        assert [step for step, _ in steps_and_values] == [5, 10, 15, 20], tag
        np.testing.assert_allclose([value for _, value in steps_and_values], [row[column] for row in rows],
                                   rtol=1e-6, err_msg=tag)
    texts = sorted((event.step, tf.make_ndarray(event.tensor_proto).item().decode())
                   for event in written.Tensors("sample"))
    assert [step for step, _ in texts] == [5, 10, 15, 20]
    # The sample of step 10 came from the weights of step 10, which the checkpoint of step 10 holds.
    assert float(re.search(r"embedding sum (\S+)", texts[1][1]).group(1)) == pytest.approx(at_step_10, abs=1e-5)


@pytest.mark.once("the message is the same on every backend")
def test_tensorboard_without_its_package_says_how_to_install_it(monkeypatch, tmp_path):
    from gptlite.training import history

    real_find_spec = history.importlib.util.find_spec
    monkeypatch.setattr(history.importlib.util, "find_spec",
                        lambda name, *args: None if name == "tensorboard" else real_find_spec(name, *args))
    with pytest.raises(gptlite.ConfigError, match=r"pip install \"gptlite\[tensorboard\]\""):
        run.train_on_text([], tmp_path / "run", preset="tiny", tensorboard=True, verbose=0)
    assert not (tmp_path / "run").exists()


# --- data-parallel training

# Runs the train command on two virtual CPU devices. With NO_CLIP set, both
# runs train without gradient clipping: on TensorFlow, Keras clips each
# replica's gradient before averaging them, which is not the one-device step.
TRAIN = """
import os, sys
if os.environ["KERAS_BACKEND"] == "tensorflow" and "--distribute" in sys.argv:
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from gptlite.cli import train_main
from gptlite.training import fit
if os.environ.get("NO_CLIP"):
    make_optimizer = fit.make_optimizer
    def unclipped(model, config):
        optimizer = make_optimizer(model, config)
        optimizer.global_clipnorm = None
        return optimizer
    fit.make_optimizer = unclipped
sys.exit(train_main(sys.argv[1:]))
"""
TINY_RUN = ["--preset", "tiny", "--max-iters", "30", "--eval-interval", "10", "--checkpoint-interval", "30"]


def start_training(text_file, out, *flags, **environment):
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend(),
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip(),
               **environment)
    return subprocess.Popen([sys.executable, "-c", TRAIN, str(text_file), "--out", str(out), *TINY_RUN, *flags],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_history(out):
    """history.csv without the timings, which differ from run to run."""
    with open(out / "history.csv") as file:
        return [{k: float(v) for k, v in row.items() if k not in TIMINGS} for row in csv.DictReader(file)]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("text") / "words.txt"
    path.write_text(text)
    return path


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() == "torch", reason="--distribute runs on tensorflow and jax")
def test_two_devices_take_the_same_steps_as_one(tmp_path, text_file, tokenizer):
    # Side by side: most of each run is starting Python and Keras, which takes one core.
    one = start_training(text_file, tmp_path / "one", NO_CLIP="1")
    two = start_training(text_file, tmp_path / "two", "--distribute", NO_CLIP="1")
    (_, one_errors), (two_output, two_errors) = one.communicate(timeout=300), two.communicate(timeout=300)
    assert one.returncode == 0, one_errors[-2000:]
    assert two.returncode == 0, two_errors[-2000:]
    assert "batch 8 split across 2 devices" in two_output
    expected, found = read_history(tmp_path / "one"), read_history(tmp_path / "two")
    assert [row["step"] for row in found] == [10, 20, 30]
    assert [row["learning_rate"] for row in found] == [row["learning_rate"] for row in expected]
    for got, want in zip(found, expected):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-4)
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-4)
    # The distributed run's model is an ordinary one: it loads and generates on one device.
    model = gptlite.load(tmp_path / "two" / "model.keras")
    assert gptlite.generate(model, "the", max_new_tokens=10, seed=0).startswith("the")


# Its processes run JAX whatever the suite's backend: once, in the JAX suite, is enough.
@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="runs in the jax suite (tests/run_backends.sh jax)")
def test_two_jax_processes_train_as_one(tmp_path, text_file):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", TRAIN, str(text_file), "--out", str(tmp_path / f"worker{index}"), *TINY_RUN,
             "--distribute"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, KERAS_BACKEND="jax", KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                     KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID=str(index)),
        )
        for index in range(2)
    ]
    outputs = [worker.communicate(timeout=300) for worker in workers]
    for worker, (stdout, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr[-2000:]
        assert "batch 8 split across 2 devices" in stdout
    first, second = (keras.saving.load_model(tmp_path / f"worker{i}" / "model.keras") for i in range(2))
    for a, b in zip(first.get_weights(), second.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert read_history(tmp_path / "worker0") == read_history(tmp_path / "worker1")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TF_CONFIG is TensorFlow's")
def test_several_tensorflow_workers_are_refused_with_the_way_out(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}}')
    with pytest.raises(gptlite.ConfigError, match="jax backend"):
        with runtime.running().data_parallel(8):
            pass


def test_a_tiny_seq2seq_run_learns_to_reverse_short_strings(reverser_run):
    model, rows, out, held_out = reverser_run

    # Chance is about 5^-4 for a whole string; padded target positions do not count towards the loss.
    assert [row["step"] for row in rows] == [150, 300]
    assert rows[-1]["exact_match"] > 0.5 and rows[-1]["val_loss"] < rows[0]["val_loss"]
    # A target of n characters is n + 1 predicted tokens with its end token.
    characters = sum(len(target) for target in held_out.pairs.targets)
    tokens = characters + len(held_out.pairs.targets)
    assert rows[-1]["val_bits_per_char"] == pytest.approx(rows[-1]["val_loss"] / math.log(2) * tokens / characters,
                                                          rel=1e-9)
    assert rows[-1]["exact_match"] == scores.exact_matches(model, held_out.pairs) / len(held_out.pairs)
    with open(out / "history.csv") as file:
        assert float(list(csv.DictReader(file))[-1]["exact_match"]) == rows[-1]["exact_match"]
    saved = gptlite.load(out / "model.keras")
    assert isinstance(saved, gptlite.Seq2Seq) and saved.tokenizer.special_tokens == ("pad", "start", "end")
