"""The command-line tools end to end, as a user runs them."""

import csv
import hashlib
import importlib.util
import json
import subprocess

import keras
import pytest

import gptlite

from conftest import built_once, make_text, new_machine, run_python

# For tests of the commands themselves (most run them as subprocesses): what
# they check does not depend on the backend, whose own tests run in every suite
# (what generate's and inspect's flags ask for, beams, streams and attention
# maps, is test_generation's and test_inspection's under each backend).
ONCE = pytest.mark.once("a check of the commands that does not depend on the backend")
TRAIN_FLAGS = ["--preset", "tiny", "--max-iters", "30", "--eval-interval", "15", "--eval-iters", "2"]


@pytest.fixture(scope="module")
def trained_run():
    """train.py's run on a text, in a child process, once a session (`built_once`): the tests only read it.

    Returns (the child's CompletedProcess, the text file, the run's folder)."""
    def train(folder):
        (folder / "words.txt").write_text(make_text(3000))
        return run_python("train.py", str(folder / "words.txt"), *TRAIN_FLAGS, "--out", str(folder / "run"))

    folder, result = built_once("cli-run", train)
    return result, folder / "words.txt", folder / "run"


def test_train_writes_model_history_and_plot(trained_run):
    result, _, out = trained_run
    assert result.returncode == 0, result.stderr
    assert "step 30: train loss" in result.stdout and "val loss" in result.stdout
    assert "sample from the final model" in result.stdout
    with open(out / "history.csv") as file:
        assert [row["step"] for row in csv.DictReader(file)] == ["15", "30"]
    assert (out / "loss.png").stat().st_size > 0
    assert (out / "model.keras").stat().st_size > 0


@pytest.mark.slow
@ONCE
def test_generate_streams_prompt_then_text_and_repeats_with_a_seed(trained_run, capsys):
    from gptlite.cli import generate_main

    _, _, out = trained_run
    args = ["--model", str(out / "model.keras"), "--prompt", "the cat",
            "--max-new-tokens", "40", "--temperature", "0.8", "--top-k", "5", "--seed", "1", "--num-samples", "2"]
    first = run_python("generate.py", *args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("the cat")
    samples = first.stdout.split("-" * 40)
    assert len(samples) == 2 and samples[1].lstrip("\n").startswith("the cat")
    assert samples[0] != samples[1]
    # The same seed in another process (this one) writes the same samples.
    assert generate_main(args) == 0
    assert capsys.readouterr().out == first.stdout


@pytest.mark.slow
@ONCE
def test_streamed_and_unstreamed_output_are_the_same(capsys, trained_run):
    from gptlite.cli import generate_main

    _, _, out = trained_run
    args = ["--model", str(out / "model.keras"), "--prompt", "a dog", "--max-new-tokens", "50", "--seed", "4",
            "--top-p", "0.9"]
    assert generate_main(args) == 0
    streamed = capsys.readouterr().out
    assert generate_main([*args, "--no-stream"]) == 0
    assert capsys.readouterr().out == streamed
    assert streamed.startswith("a dog") and len(streamed) == len("a dog") + 50 + 1


@ONCE
def test_existing_model_is_not_overwritten(trained_run):
    _, text_file, out = trained_run
    before = hashlib.sha256((out / "model.keras").read_bytes()).hexdigest()
    result = run_python("train.py", str(text_file), *TRAIN_FLAGS, "--out", str(out))
    assert result.returncode == 2
    assert "already exists" in result.stderr and "--overwrite" in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr  # no start-up notices of the backend's around it
    assert hashlib.sha256((out / "model.keras").read_bytes()).hexdigest() == before
    # Refused before the backend starts: at once, not after seconds of importing Keras.
    script = ("import sys; from gptlite.cli import train_main; status = train_main(sys.argv[1:]); "
              "print('keras' in sys.modules); sys.exit(status)")
    result = run_python("-c", script, str(text_file), *TRAIN_FLAGS, "--out", str(out))
    assert result.returncode == 2 and "already exists" in result.stderr
    assert result.stdout.split() == ["False"]


@ONCE
@pytest.mark.parametrize("args,message", [
    (["train.py", "no/such/file.txt"], "no such file: no/such/file.txt"),
    (["train.py", "--n-embd", "30", "--n-head", "4"], "--n-embd (30) must be divisible by --n-head (4)"),
    (["generate.py", "--model", "no/such/model.keras"], "no such model file"),
])
def test_user_mistakes_give_one_line_and_exit_status_2(args, message):
    result = run_python(*args)
    assert result.returncode == 2
    lines = result.stderr.splitlines()  # the error alone: the backend's start-up notices are held back
    assert len(lines) == 1 and "error:" in lines[0] and message in lines[0], result.stderr


@pytest.mark.parametrize("command,args,message", [
    ("train_main", ["no/such/file.txt"], "no such file: no/such/file.txt"),
    ("generate_main", ["--model", "no/such/model.keras"], "no such model file"),
    ("serve_main", ["."], "is a folder; give the model.keras file inside it"),
    ("eval_main", ["README.md"], "is not a .keras model file"),
])
def test_a_missing_model_or_text_is_refused_before_the_backend_starts(command, args, message):
    script = (f"import sys; from gptlite.cli import {command}; status = {command}(sys.argv[1:]); "
              "print('keras' in sys.modules); sys.exit(status)")
    result = run_python("-c", script, *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert result.stdout.split() == ["False"]


def test_in_process_errors_for_bad_flags(capsys, tmp_path, trained_run):
    from gptlite.cli import generate_main, train_main

    _, _, out = trained_run
    assert generate_main(["--model", str(out / "model.keras"), "--prompt", "ZEBRA"]) == 2
    assert "'ABERZ'" in capsys.readouterr().err
    assert generate_main(["--model", str(out / "model.keras"), "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    assert train_main(["--preset", "tiny", "--out", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert train_main(["--preset", "tiny", "--out", str(a_file / "inside")]) == 2
    assert "cannot write to --out" in capsys.readouterr().err
    assert train_main(["--preset", "tiny", "--grad-accum", "0", "--out", str(tmp_path / "run")]) == 2
    assert "--grad-accum must be a positive whole number, got 0" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit) as exit_info:
        train_main(["--preset", "huge"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
@ONCE
def test_a_run_file_trains_the_same_run_again_and_flags_win_over_it(capsys, tmp_path):
    from gptlite.cli import train_main

    text_file = tmp_path / "words.txt"
    text_file.write_text(make_text(2000))
    flags = ["--preset", "tiny", "--max-iters", "20", "--eval-interval", "10", "--n-embd", "16", "--seed", "3"]
    assert train_main([str(text_file), *flags, "--out", str(tmp_path / "a")]) == 0
    assert train_main(["--config", str(tmp_path / "a" / "config.toml"), "--out", str(tmp_path / "b")]) == 0
    losses = lambda run: [(row["step"], row["train_loss"], row["val_loss"])
                          for row in csv.DictReader(open(tmp_path / run / "history.csv"))]
    assert losses("b") == losses("a") and len(losses("a")) == 2
    assert (tmp_path / "b" / "config.toml").read_text() == (tmp_path / "a" / "config.toml").read_text()

    assert train_main(["--config", str(tmp_path / "a" / "config.toml"), "--max-iters", "10", "--out",
                       str(tmp_path / "c")]) == 0
    written = gptlite.read_run_config(tmp_path / "c" / "config.toml")
    assert written.arguments["settings"]["max_iters"] == 10 and written.arguments["settings"]["n_embd"] == 16
    capsys.readouterr()

    bad = tmp_path / "bad.toml"
    bad.write_text((tmp_path / "a" / "config.toml").read_text().replace("max_iters = 20", 'max_iters = "lots"'))
    assert train_main(["--config", str(bad), "--out", str(tmp_path / "d")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "[settings] 'max_iters' must be a whole number, got 'lots'" in error
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
@ONCE
def test_sigterm_saves_a_checkpoint_and_resume_finishes_the_run(tmp_path, capsys):
    import signal
    import sys

    from conftest import REPO

    text_file = tmp_path / "words.txt"
    text_file.write_text(make_text(3000))
    out = tmp_path / "run"
    command = ["train.py", str(text_file), "--preset", "tiny", "--max-iters", "3000", "--eval-interval", "20",
               "--checkpoint-interval", "1000", "--eval-iters", "1", "--out", str(out)]
    process = subprocess.Popen([sys.executable, *command], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("step 20:"):
            process.send_signal(signal.SIGTERM)
            break
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "checkpoint saved" in stderr and "--resume" in stderr
    with open(out / "history.csv") as file:
        stopped_at_rows = [int(row["step"]) for row in csv.DictReader(file)]
    assert stopped_at_rows and stopped_at_rows[-1] < 3000

    # The resume runs in this process: what the test asks is that the checkpoint the signal left finishes the run.
    from gptlite.cli import train_main

    capsys.readouterr()
    assert train_main([*command[1:-6], "--max-iters", "200", "--eval-interval", "20", "--checkpoint-interval", "1000",
                       "--eval-iters", "1", "--out", str(out), "--resume"]) == 0
    assert "resuming at step" in capsys.readouterr().out
    with open(out / "history.csv") as file:
        steps = [int(row["step"]) for row in csv.DictReader(file)]
    assert steps[: len(stopped_at_rows)] == stopped_at_rows
    assert steps[-1] == 200 and steps == sorted(set(steps))


def test_resume_refusals(capsys, trained_run):
    from gptlite.cli import train_main

    _, text_file, out = trained_run
    base = [str(text_file), "--out", str(out)]
    assert train_main([*base, "--resume", "--n-embd", "64"]) == 2
    assert "--n-embd is 32 in the checkpoint, 64 here" in capsys.readouterr().err
    assert train_main([*base, "--resume"]) == 2
    assert "already done its 30 steps; set a larger --max-iters" in capsys.readouterr().err
    assert train_main([*base, "--resume", "--overwrite"]) == 2
    assert "choose one" in capsys.readouterr().err
    assert train_main([*base, "--resume", "--max-iters", "40", "--precision", "bf16"]) == 2
    assert "--precision is fp32 in the checkpoint, bf16 here" in capsys.readouterr().err


def test_text_problems_are_explained(capsys, tmp_path):
    from gptlite.cli import train_main

    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 ".encode("latin-1") * 20)
    out = str(tmp_path / "out")
    assert train_main([str(latin), "--preset", "tiny", "--out", out]) == 2
    error = capsys.readouterr().err
    assert "not valid utf-8" in error and "--encoding" in error and "--errors replace" in error
    assert train_main([str(latin), "--preset", "tiny", "--encoding", "latin-1", "--out", out]) == 2
    assert "--block-size 9 or less" in capsys.readouterr().err  # 100 characters: too short for 32
    assert not (tmp_path / "out" / "model.keras").exists()


def test_unknown_prompt_characters_can_be_skipped_or_replaced(capsys, trained_run):
    from gptlite.cli import generate_main

    _, _, out = trained_run
    common = ["--model", str(out / "model.keras"), "--max-new-tokens", "5", "--seed", "0"]
    assert generate_main([*common, "--prompt", "the CAT", "--unknown", "skip"]) == 0
    assert capsys.readouterr().out.startswith("the CAT")
    assert generate_main([*common, "--prompt", "the CAT", "--unknown", "error"]) == 2
    assert "--unknown skip or --unknown replace" in capsys.readouterr().err


def test_stop_flag_ends_the_printed_text(capsys, trained_run):
    from gptlite.cli import generate_main

    _, _, out = trained_run
    args = ["--model", str(out / "model.keras"), "--prompt", "the", "--max-new-tokens", "200", "--seed", "2"]
    assert generate_main(args) == 0
    free = capsys.readouterr().out
    assert "\n" in free[len("the"):]
    assert generate_main([*args, "--stop", "\n"]) == 0
    assert capsys.readouterr().out == free[: free.index("\n", len("the"))] + "\n"


@pytest.mark.slow
@ONCE
def test_beam_and_cache_flags(capsys, trained_run):
    from gptlite.cli import generate_main

    _, _, out = trained_run
    args = ["--model", str(out / "model.keras"), "--prompt", "the", "--max-new-tokens", "40"]
    assert generate_main([*args, "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out
    assert generate_main([*args, "--num-beams", "1"]) == 0
    assert capsys.readouterr().out == greedy
    assert generate_main([*args, "--num-beams", "3"]) == 0
    assert capsys.readouterr().out.startswith("the")
    assert generate_main([*args, "--seed", "3", "--no-cache"]) == 0
    uncached = capsys.readouterr().out
    assert generate_main([*args, "--seed", "3"]) == 0
    assert capsys.readouterr().out == uncached
    assert generate_main([*args, "--num-beams", "2", "--num-samples", "2"]) == 2
    assert "--num-samples" in capsys.readouterr().err


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras exports SavedModels from tensorflow and jax")
def test_export_command_writes_a_saved_model_once(capsys, tmp_path, trained_run):
    from gptlite.cli import main

    _, _, out = trained_run
    exported = tmp_path / "exported"
    assert main(["export", "--model", str(out / "model.keras"), "--out", str(exported)]) == 0
    assert "tf.saved_model.load" in capsys.readouterr().out
    assert (exported / "saved_model.pb").exists() and (exported / "tokenizer.json").exists()
    assert main(["export", "--model", str(out / "model.keras"), "--out", str(exported)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["nonsense"]) == 2


def test_export_of_a_film_from_a_run_that_kept_none_is_one_line(capsys, tmp_path, tiny_model):
    from gptlite.cli import main

    gptlite.save(tiny_model, tmp_path / "model.keras")
    for format, said in (("web", "no film in"), ("gguf", "web page alone")):
        assert main(["export", "--model", str(tmp_path / "model.keras"), "--format", format, "--film", "--out",
                     str(tmp_path / "exported")]) == 2
        error = capsys.readouterr().err
        assert said in error and "Traceback" not in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "exported").exists()


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="only torch lacks a SavedModel export")
def test_export_under_torch_says_which_backend_to_use(capsys, tmp_path, tiny_model):
    from gptlite.cli import main
    from gptlite.weights import saving

    with pytest.raises(gptlite.ConfigError, match="KERAS_BACKEND=tensorflow"):
        saving.export_saved_model(tiny_model, tmp_path / "exported")
    gptlite.save(tiny_model, tmp_path / "model.keras")
    assert main(["export", "--model", str(tmp_path / "model.keras"), "--out", str(tmp_path / "exported")]) == 2
    assert "KERAS_BACKEND=tensorflow" in capsys.readouterr().err
    assert not (tmp_path / "exported").exists()


@pytest.mark.slow
@ONCE
def test_bpe_on_several_files_trains_and_its_model_generates(tmp_path, capsys):
    import math

    from gptlite.cli import generate_main, train_main

    (tmp_path / "more").mkdir()
    (tmp_path / "first.txt").write_text(make_text(3000, seed=1))
    (tmp_path / "more" / "second.txt").write_text(make_text(3000, seed=2))
    (tmp_path / "more" / "third.txt").write_text("a cat 🙂 ran to the sun\n" * 200)
    out = tmp_path / "out"
    result = run_python("train.py", str(tmp_path / "first.txt"), str(tmp_path / "more"), "--tokenizer", "bpe",
                        "--vocab-size", "320", "--preset", "tiny", "--max-iters", "60", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3 files" in result.stdout and "byte-level BPE tokens" in result.stdout
    with open(out / "history.csv") as file:
        rows = list(csv.DictReader(file))
    assert float(rows[-1]["val_loss"]) < min(float(rows[0]["val_loss"]), math.log(320) - 1)
    assert len(list(out.glob("tokens-*.uint16"))) == 1

    assert generate_main(["--model", str(out / "model.keras"), "--prompt", "the cat 🙂", "--max-new-tokens", "30",
                          "--seed", "0"]) == 0
    assert capsys.readouterr().out.startswith("the cat 🙂")
    assert train_main([str(tmp_path / "first.txt"), "--vocab-size", "300", "--out", str(tmp_path / "other")]) == 2
    assert "--vocab-size" in capsys.readouterr().err


OTHER_BACKEND = "jax" if keras.backend.backend() != "jax" else "tensorflow"


def _fresh_environment(tmp_path, backend=None):
    """A new machine's environment (an empty home: no keras.json), KERAS_BACKEND only if given."""
    environment = {key: value for key, value in new_machine(tmp_path / "home").items() if key != "KERAS_BACKEND"}
    return environment if backend is None else dict(environment, KERAS_BACKEND=backend)


# A command run as its script, printing at exit the top-level modules the process imported.
IMPORTED = ("import atexit, runpy, sys; atexit.register(lambda: print('imported:', ' '.join(sorted({name.split('.')[0] "
            "for name in sys.modules})), file=sys.stderr)); sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.mark.slow
@ONCE
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax (a dependency of gptlite's)")
def test_generate_and_eval_run_on_the_backend_that_writes_fastest_saying_so_with_the_same_results(trained_run,
                                                                                                 tmp_path):
    import numpy as np

    from conftest import last_logits, TIE
    from gptlite.backend import choice

    _, text_file, out = trained_run
    model_file = str(out / "model.keras")
    chosen, why = choice.writing_backend(model_file, _fresh_environment(tmp_path))
    asked = ["generate.py", "--model", model_file, "--prompt", "the ", "--max-new-tokens", "40", "--temperature", "0"]
    automatic = run_python("-c", IMPORTED, *asked, env=_fresh_environment(tmp_path))
    assert automatic.returncode == 0, automatic.stderr
    said = f"backend: {chosen}, {why} (--backend chooses another)" if chosen else "backend:"
    assert (said in automatic.stderr) == (chosen is not None) and said not in automatic.stdout
    imported = automatic.stderr.split("imported: ")[1].split()
    assert "matplotlib" not in imported  # Keras imports it where it is installed; no command draws with it here
    assert ("tensorflow" in imported) == (chosen in (None, "tensorflow"))
    # --backend and KERAS_BACKEND win, and say nothing.
    for flag, environment in ((["--backend", "tensorflow"], _fresh_environment(tmp_path)),
                              ([], _fresh_environment(tmp_path, "tensorflow"))):
        named = run_python("-c", IMPORTED, *asked, *flag, env=environment)
        assert named.returncode == 0, named.stderr
        assert "backend:" not in named.stderr and "matplotlib" not in named.stderr.split("imported: ")[1].split()
        # The same greedy text on both backends, unless a step is a tie (two logits within float rounding).
        if named.stdout != automatic.stdout:  # a character model: the texts part at the first token that differs
            model = gptlite.load(model_file)
            first = next(i for i, (a, b) in enumerate(zip(named.stdout, automatic.stdout)) if a != b)
            window = [int(i) for i in model.tokenizer.encode(named.stdout[:first])][-model.config.block_size:]
            top_two = np.sort(last_logits(model, [window])[0])[-2:]
            assert top_two[1] - top_two[0] < TIE, (named.stdout, automatic.stdout)
    # eval chooses the same way, and reads the same loss to float rounding.
    losses = []
    for flag in ([], ["--backend", "tensorflow"]):
        scored = run_python("-m", "gptlite", "eval", model_file, str(text_file), "--json", *flag,
                            env=_fresh_environment(tmp_path))
        assert scored.returncode == 0, scored.stderr
        assert (said in scored.stderr) == (chosen is not None and not flag)
        losses.append(json.loads(scored.stdout)["total"]["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


@pytest.mark.slow
@ONCE
def test_a_mistake_found_as_a_command_reads_its_inputs_is_one_line_even_where_the_command_chose_its_backend(
        trained_run, tmp_path):
    """A writing command that chooses its backend says why with its first words: a run that ends in a mistake
    before it says anything prints the mistake alone (in a fresh process, where the choice is made)."""
    import concurrent.futures
    import zipfile

    _, _, out = trained_run
    model_file = str(out / "model.keras")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "odd.txt").write_text("the cat s\u00e4t")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 4)
    with zipfile.ZipFile(tmp_path / "damaged.keras", "w") as damaged:
        damaged.writestr("config.json", "{not json")
    mistakes = [
        (["-m", "gptlite", "eval", model_file, str(tmp_path / "binary.txt")], "binary.txt"),
        (["-m", "gptlite", "eval", model_file, str(tmp_path / "empty.txt")], "too little text"),
        (["-m", "gptlite", "eval", model_file, str(tmp_path / "odd.txt")], "'\u00e4'"),
        (["-m", "gptlite", "eval", model_file, str(tmp_path / "missing.txt")], "no such file"),
        (["-m", "gptlite", "eval", str(tmp_path / "damaged.keras"), str(tmp_path / "odd.txt")], "damaged.keras"),
        (["generate.py", "--model", model_file, "--top-p", "0"], "--top-p must be in (0, 1]"),
        (["generate.py", "--model", model_file, "--prompt", "ZEBRA"], "'ABERZ'"),
    ]
    environment = _fresh_environment(tmp_path)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # a process a core
        results = list(pool.map(lambda mistake: run_python(*mistake[0], env=environment), mistakes))
    for (args, message), result in zip(mistakes, results):
        lines = result.stderr.splitlines()
        assert result.returncode == 2 and len(lines) == 1 and message in lines[0], (args, result.stderr)


@pytest.mark.slow
@pytest.mark.extras
@ONCE
@pytest.mark.skipif(importlib.util.find_spec(OTHER_BACKEND) is None,
                    reason=f"needs {OTHER_BACKEND} (the `{OTHER_BACKEND}` extra)")
def test_backend_and_precision_flags_take_effect(tmp_path):
    text_file = tmp_path / "words.txt"
    text_file.write_text(make_text(2000))
    # KERAS_BACKEND, set for the tests, names another backend: the flag wins.
    result = run_python("train.py", str(text_file), "--preset", "tiny", "--max-iters", "8", "--eval-interval", "4",
                        "--eval-iters", "1", "--backend", OTHER_BACKEND, "--precision", "bf16",
                        "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert f"{OTHER_BACKEND} backend, bf16" in result.stdout


@pytest.mark.extras
@ONCE
@pytest.mark.skipif(importlib.util.find_spec(OTHER_BACKEND) is None,
                    reason=f"needs {OTHER_BACKEND} (the `{OTHER_BACKEND}` extra)")
def test_the_cli_module_runs_on_the_backend_its_flag_names(tmp_path, tiny_model):
    import gptlite

    gptlite.save(tiny_model, tmp_path / "model.keras")
    result = run_python("-m", "gptlite.cli", "inspect", str(tmp_path / "model.keras"), "--prompt", "the",
                        "--positions", str(tmp_path / "positions.png"), "--backend", OTHER_BACKEND, "--json")
    assert result.returncode == 0, result.stderr
    assert "next" in result.stdout and (tmp_path / "positions.png").exists()


# --- seq2seq


def reversal_file(path, count=300, seed=0):
    from conftest import reversal_pairs

    pairs = reversal_pairs(count, seed)
    path.write_text("".join(f"{s}\t{t}\n" for s, t in zip(pairs.sources, pairs.targets)))
    return path


@ONCE
def test_a_malformed_pairs_file_is_refused_with_its_line(tmp_path, capsys):
    from gptlite.cli import train_main

    pairs_file = tmp_path / "pairs.tsv"
    pairs_file.write_text("abc\tcba\nno tab on this line\nab\tba\n")
    assert train_main([str(pairs_file), "--task", "seq2seq", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "line 2: expected source<TAB>target, found no tab" in error
    assert not (tmp_path / "run" / "model.keras").exists()


@ONCE
@pytest.mark.parametrize("flags,message", [
    (["--synthetic", "addition", "--task", "lm"], "leave out --task lm"),
    (["--synthetic", "reverse", "--tokenizer", "bpe"], "reads characters"),
    (["--task", "seq2seq"], "one file of source<TAB>target lines"),
    (["--synthetic", "sort", "--block-size", "10"], "pair 1: the source is"),
])
def test_seq2seq_flag_mistakes_get_one_line(tmp_path, capsys, flags, message):
    from gptlite.cli import train_main

    assert train_main([*flags, "--preset", "tiny", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error


@pytest.mark.slow
@ONCE
def test_a_synthetic_task_trains_for_its_own_steps_unless_told(tmp_path, capsys, monkeypatch):
    from gptlite.cli import train_main
    from gptlite.training import fit
    from gptlite.training.settings import PRESETS, SYNTHETIC_MAX_ITERS

    steps = []

    def record_and_stop(model, train_set, held_out_set, config, out_dir, **kwargs):
        steps.append(config.max_iters)
        raise gptlite.ConfigError("stopped before training")

    monkeypatch.setattr(fit, "train", record_and_stop)
    for flags in (["--synthetic", "reverse"], ["--synthetic", "addition", "--max-iters", "700"],
                  ["--synthetic", "sort", "--preset", "tiny"]):
        assert train_main([*flags, "--out", str(tmp_path / "run")]) == 2
        assert "stopped before training" in capsys.readouterr().err
    assert steps == [SYNTHETIC_MAX_ITERS["reverse"], 700, PRESETS["tiny"]["max_iters"]]


@pytest.mark.slow
@ONCE
def test_source_and_prompt_go_to_the_right_kind_of_model(tmp_path, capsys, reverser, tiny_model):
    from gptlite.cli import generate_main

    gptlite.save(reverser, tmp_path / "seq2seq.keras")
    gptlite.save(tiny_model, tmp_path / "gpt.keras")
    assert generate_main(["--model", str(tmp_path / "seq2seq.keras"), "--prompt", "abc"]) == 2
    assert "is a seq2seq model: give it --source TEXT or --source-file FILE" in capsys.readouterr().err
    assert generate_main(["--model", str(tmp_path / "gpt.keras"), "--source", "abc"]) == 2
    assert "is a language model: give it --prompt TEXT" in capsys.readouterr().err
    assert generate_main(["--model", str(tmp_path / "seq2seq.keras"), "--source", "abcde", "--num-beams", "2",
                          "--num-samples", "1"]) == 0
    assert capsys.readouterr().out == gptlite.generate_target(reverser, "abcde", num_beams=2) + "\n"
    assert generate_main(["--model", str(tmp_path / "seq2seq.keras"), "--source", "abc", "--num-samples", "3",
                          "--temperature", "2", "--seed", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == gptlite.generate_target(
        reverser, ["abc"] * 3, temperature=2.0, seed=1, top_k=200)


@pytest.mark.slow
@ONCE
def test_seq2seq_trains_on_a_tsv_file_resumes_as_seq2seq_only_and_decodes_sources(tmp_path, capsys):
    from gptlite.cli import generate_main, train_main

    pairs_file = reversal_file(tmp_path / "pairs.tsv")
    out = tmp_path / "run"
    base = [str(pairs_file), "--task", "seq2seq", "--preset", "tiny", "--eval-interval", "6", "--eval-iters", "1",
            "--out", str(out)]
    assert train_main([*base, "--max-iters", "6"]) == 0
    printed = capsys.readouterr().out
    assert "270 pairs, 30 held out" in printed and "exact match" in printed
    assert "of 30 held-out pairs exactly" in printed
    assert train_main([str(pairs_file), "--resume", "--out", str(out)]) == 2
    assert "trains a seq2seq model; resume it with --task seq2seq" in capsys.readouterr().err
    assert train_main([*base, "--max-iters", "12", "--resume"]) == 0
    assert "resuming at step 6 of 12 steps" in capsys.readouterr().out
    with open(out / "history.csv") as file:
        rows = list(csv.DictReader(file))
    assert [row["step"] for row in rows] == ["6", "12"] and 0 <= float(rows[-1]["exact_match"]) <= 1

    sources = tmp_path / "sources.txt"
    sources.write_text("abc\nedcba\n\nbb\n")
    assert generate_main(["--model", str(out / "model.keras"), "--source-file", str(sources)]) == 0
    model = gptlite.load(out / "model.keras")
    expected = "".join(f"{t}\n" for t in gptlite.generate_target(model, ["abc", "edcba", "", "bb"]))
    assert capsys.readouterr().out == expected


@ONCE
def test_generate_draws_attention_instead_of_sampling(capsys, tmp_path, trained_run):
    from gptlite.cli import generate_main

    model = str(trained_run[2] / "model.keras")
    picture, one_head = tmp_path / "attention.png", tmp_path / "one.png"
    assert generate_main(["--model", model, "--prompt", "the cat", "--attention", str(picture)]) == 0
    assert capsys.readouterr().out == f"wrote {picture} (causal self-attention for 7 tokens)\n"
    assert generate_main(["--model", model, "--prompt", "the cat", "--attention", str(one_head),
                          "--layer", "1", "--head", "0"]) == 0
    capsys.readouterr()
    for path in (picture, one_head):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000
    for flags, message in [
        (["--prompt", "the", "--layer", "0"], "--layer chooses what --attention FILE draws"),
        (["--prompt", "the", "--attention", str(tmp_path / "a.png"), "--layer", "2"], "layer must be from 0 to 1"),
        (["--prompt", "the", "--attention", str(tmp_path / "a.png"), "--part", "cross"], "causal self-attention only"),
        (["--attention", str(tmp_path / "a.png")], "draws its attention over --prompt TEXT"),
        (["--prompt", "the", "--attention", str(tmp_path / "a.gif")], "must end in .png, .svg, .pdf"),
    ]:
        assert generate_main(["--model", model, *flags]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and message in error
    assert not (tmp_path / "a.png").exists()


@ONCE
def test_generate_draws_a_seq2seq_models_attention(capsys, tmp_path, reverser):
    from gptlite.cli import generate_main

    gptlite.save(reverser, tmp_path / "seq2seq.keras")
    picture = tmp_path / "encoder.svg"
    assert generate_main(["--model", str(tmp_path / "seq2seq.keras"), "--source", "abcd", "--attention",
                          str(picture), "--part", "encoder"]) == 0
    target = gptlite.generate_target(reverser, "abcd")
    assert capsys.readouterr().out == f"wrote {picture} (encoder self-attention for 'abcd' -> {target!r})\n"
    assert b"<svg" in picture.read_bytes()[:1000]


@ONCE
def test_inspect_prints_candidates_and_attention_per_position(capsys, tmp_path, trained_run):
    from gptlite.cli import main

    model = str(trained_run[2] / "model.keras")
    assert main(["inspect", model, "--prompt", "the cat", "--top", "2"]) == 0
    model_line, *lines = capsys.readouterr().out.splitlines()
    assert model_line.startswith("model: 2 layers, 2 heads") and "learned positions, LayerNorm, GELU" in model_line
    assert lines[0].startswith("7 positions; next-token probabilities")
    assert len(lines) == 1 + 7 * 3  # each position: its candidates, then one line per layer
    assert lines[1].startswith("   0 't'") and "next: " in lines[1] and lines[2].strip().startswith("layer 0: 't'@0 100%")

    positions = tmp_path / "positions.png"
    assert main(["inspect", model, "--prompt", "the cat", "--json", "--positions", str(positions)]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [row["token"] for row in report["positions"]] == list("the cat")
    assert all(len(row["next"]) == 5 for row in report["positions"])
    assert f"wrote {positions}" in captured.err and positions.read_bytes()[:4] == b"\x89PNG"
    assert captured.err.startswith("model: ")  # beside the JSON, not in it

    assert main(["inspect", model]) == 2
    assert "give --prompt TEXT" in capsys.readouterr().err
    assert main(["inspect", model, "--source", "abc"]) == 2
    assert "is a language model: give it --prompt TEXT" in capsys.readouterr().err


@ONCE
def test_inspect_heads_prints_every_heads_scores_as_a_table_or_json(capsys, trained_run, tiny_seq2seq, tmp_path):
    from gptlite.cli import main

    model = str(trained_run[2] / "model.keras")
    assert main(["inspect", model, "--heads", "--prompt", "the cat sat on"]) == 0
    model_line, heading, columns, *rows = capsys.readouterr().out.splitlines()
    assert model_line.startswith("model: 2 layers, 2 heads") and heading.startswith("14 tokens, loss ")
    assert columns.split()[:7] == ["layer", "head", "previous", "first", "current", "induction", "ablation"]
    assert [row.split()[:2] for row in rows[:4]] == [["0", "0"], ["0", "1"], ["1", "0"], ["1", "1"]]
    assert rows[4].startswith("at initialisation, the largest: previous token ")
    assert main(["inspect", model, "--heads", "--prompt", "the cat sat on", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [len(row) for row in report["induction"]] == [2, 2] and report["tokens"] == list("the cat sat on")
    assert captured.err.startswith("model: ")
    assert main(["inspect", model, "--heads"]) == 2
    assert "give --prompt TEXT" in capsys.readouterr().err
    assert main(["inspect", model, "--heads", "--prompt", "t"]) == 2
    assert capsys.readouterr().err.strip().endswith("needs a text of at least 2 tokens; this one is 1")
    gptlite.save(tiny_seq2seq, tmp_path / "seq2seq.keras")
    assert main(["inspect", str(tmp_path / "seq2seq.keras"), "--heads", "--source", "12"]) == 2
    assert "head scores and patching read a GPT" in capsys.readouterr().err


@pytest.mark.slow
@ONCE
def test_a_saved_model_fine_tunes_with_lora_and_exports_for_other_tools(capsys, tmp_path, trained_run):
    from gptlite.cli import main, train_main

    _, text_file, out = trained_run
    source = out / "model.keras"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    tuned = tmp_path / "tuned"
    result = run_python("train.py", str(text_file), "--init-from", str(source), "--out", str(tuned),
                        "--max-iters", "20", "--eval-interval", "10", "--eval-iters", "2", "--lora-rank", "2")
    assert "starting from" in result.stdout and "of them trained" in result.stdout
    assert hashlib.sha256(source.read_bytes()).hexdigest() == digest
    assert gptlite.load(tuned / "model.keras").config == gptlite.load(source).config
    assert train_main([str(text_file), "--init-from", str(source), "--out", str(tmp_path / "x"),
                       "--n-embd", "64"]) == 2
    assert "--n-embd is 32 in the pretrained model" in capsys.readouterr().err
    assert train_main([str(text_file), "--init-from", str(tmp_path / "none.keras"), "--out", str(tmp_path / "x")]) == 2
    assert "no such model file" in capsys.readouterr().err

    assert main(["export", "--model", str(tuned / "model.keras"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").exists() and (tmp_path / "hf" / "tokenizer.json").exists()
    assert "a GPT2LMHeadModel" in capsys.readouterr().out
    assert main(["export", "--model", str(tuned / "model.keras"), "--format", "kerashub",
                 "--out", str(tmp_path / "hub")]) == 2
    assert "byte-level BPE" in capsys.readouterr().err and not (tmp_path / "hub").exists()


def test_gptlite_lists_its_commands_with_a_line_each_and_names_an_unknown_one(capsys):
    from gptlite.cli import COMMANDS, main

    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    for name in COMMANDS:
        assert any(line.split()[:1] == [name] and len(line.split()) > 3 for line in listed.splitlines()), name
    assert main(["frobnicate"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "unknown command 'frobnicate'" in error and "train, generate" in error
    assert main([]) == 2 and "commands:" in capsys.readouterr().err


@ONCE
def test_help_comes_at_once_without_keras_or_its_notices():
    code = ("import sys\nfrom gptlite.cli import COMMANDS\nfor command in COMMANDS.values():\n"
            "    try:\n        command.main(['--help'])\n    except SystemExit as done:\n"
            "        assert done.code == 0\nprint('keras' in sys.modules, file=sys.stderr)")
    result = run_python("-c", code)
    assert result.returncode == 0 and result.stderr == "False\n", result.stderr
    for script in ("train.py", "generate.py"):
        result = run_python(script, "--help")
        assert result.returncode == 0 and result.stderr == "" and "usage:" in result.stdout


def test_a_run_named_by_its_mistake_leaves_nothing_behind(capsys, tmp_path, monkeypatch):
    from gptlite.cli import train_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "my.txt").write_text("x")
    for argv, message in ((["mistyped.txt"], "no such file: mistyped.txt"),
                          (["empty.txt"], "empty.txt has no text in it"),
                          (["empty.txt", "--tokenizer", "bpe"], "empty.txt has no text in it"),
                          (["--preset", "tiny", "--tensorboard-dir", "my.txt"], "my.txt, is a file")):
        assert train_main(argv) == 2
        output, error = capsys.readouterr()
        assert error.count("\n") == 1 and message in error, error
        assert "learning" not in output  # refused before any work on the text
        assert not (tmp_path / "out").exists()
