"""The command line's start: --backend before Keras is imported, and Keras's native notices held back."""

import os
import sys

import keras
import pytest

OTHER_BACKEND = "jax" if keras.backend.backend() != "jax" else "tensorflow"


def test_a_backend_that_is_not_installed_is_named_with_its_install_command(monkeypatch):
    from gptlite.cli import startup

    monkeypatch.setenv("KERAS_BACKEND", keras.backend.backend())
    monkeypatch.setattr(startup.importlib.util, "find_spec", lambda name: None)
    monkeypatch.delitem(startup.sys.modules, "keras")  # as in a new process, where Keras is not running yet
    with pytest.raises(SystemExit) as exit_info:
        startup.choose_backend("gptlite-train", "jax")
    assert str(exit_info.value) == ("gptlite-train: error: --backend jax needs jax installed "
                                    "(pip install \"gptlite[jax]\", or pip install -e \".[jax]\" in a checkout)")
    assert os.environ["KERAS_BACKEND"] == keras.backend.backend()


def test_a_backend_flag_after_keras_is_running_is_refused(capsys):
    from gptlite.cli import train_main

    assert train_main(["--preset", "tiny", "--backend", OTHER_BACKEND]) == 2
    assert f"--backend {OTHER_BACKEND} came too late" in capsys.readouterr().err


def test_the_backends_start_up_notices_are_held_back_and_other_lines_kept(monkeypatch):
    from gptlite.cli.startup import is_start_up_notice

    info = "I0000 00:00:1795499815.515361   23792 port.cc:153] oneDNN custom operations are on."
    error = "E0000 00:00:1795499817.823238   23792 some_kernel.cc:12] could not allocate memory"
    no_driver = "E0000 00:00:1795499817.823238   23792 cuda_platform.cc:52] failed call to cuInit: INTERNAL"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    assert is_start_up_notice(info) and is_start_up_notice(no_driver)
    assert is_start_up_notice("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR")
    assert not is_start_up_notice(error)
    assert not is_start_up_notice("UserWarning: something Python said")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # a user who asks for everything gets it
    assert not any(is_start_up_notice(line) for line in (info, error, no_driver))


def test_tensorflow_s_false_alarms_about_its_compile_cache_are_dropped_and_other_errors_kept(monkeypatch):
    from gptlite.backend.notices import is_false_alarm

    refusal = ("E0000 00:00:1795546615.845089   29239 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target "
               "machine feature +prefer-no-gather is not  supported on the host machine.")
    error = "E0000 00:00:1795499817.823238   23792 some_kernel.cc:12] could not allocate memory"
    # TensorFlow reads each cache entry as text before reading it as the binary it is.
    text_first = ("E0000 00:00:1795571026.156186   15688 text_format.cc:378] Error parsing text-format "
                  "tensorflow.XlaSerializedCacheEntry: 2:1: Expected identifier, got: 4")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    assert is_false_alarm(refusal) and is_false_alarm(text_first)
    assert not is_false_alarm(error) and not is_false_alarm("a line of text")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")  # a Python program's default
    assert is_false_alarm(refusal) and is_false_alarm(text_first)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # a user who asks for everything gets it
    assert not is_false_alarm(refusal) and not is_false_alarm(text_first)


def test_a_command_drops_start_up_notices_that_come_late_as_under_another_backend(monkeypatch):
    from gptlite.cli.startup import is_held_back

    # Under torch or JAX, TensorFlow starts when Keras seeds every library, after `start_keras`.
    late = "I0000 00:00:1795567727.491895    5263 port.cc:153] oneDNN custom operations are on."
    error = "E0000 00:00:1795499817.823238   23792 some_kernel.cc:12] could not allocate memory"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    assert is_held_back(late) and not is_held_back(error) and not is_held_back("a line of text")


def test_gptlite_command_tells_the_command_whether_the_process_is_its_own(monkeypatch):
    import sys

    from gptlite import cli

    seen = []
    monkeypatch.setattr(cli.COMMANDS["eval"], "main", lambda argv, whole_process: seen.append(whole_process) or 0)
    monkeypatch.setattr(sys, "argv", ["gptlite", "eval", "model.keras"])
    assert cli.main() == 0  # `gptlite eval ...`: the process is the command's, so it may filter XLA's false alarms
    assert cli.main(["eval", "model.keras"]) == 0  # called from a program: its standard error is left alone
    assert seen == [True, False]


def test_a_command_s_automatic_backend_applies_when_none_is_named_and_says_why(monkeypatch):
    from gptlite.cli import startup

    monkeypatch.setenv("KERAS_BACKEND", "")
    monkeypatch.delitem(startup.sys.modules, "keras")  # as in a new process, where Keras is not running yet
    why = startup.choose_backend("gptlite-train", None, lambda: ("tensorflow", "backend: tensorflow, why"))
    assert os.environ["KERAS_BACKEND"] == "tensorflow" and why == "backend: tensorflow, why"
    assert startup.choose_backend("gptlite-train", "tensorflow",
                                  lambda: pytest.fail("a named backend needs no choice")) is None


def test_the_backend_s_note_comes_before_a_run_s_first_words_and_never_before_a_mistake_alone(capsys):
    from gptlite.cli.startup import NoteBeforeFirstWords

    with NoteBeforeFirstWords("backend: jax, why") as note:
        print("some text")
        print("more", file=sys.stderr)
    assert capsys.readouterr() == ("some text\n", "backend: jax, why\nmore\n")
    with NoteBeforeFirstWords("backend: jax, why") as note:
        note.drop()
        print("gptlite-eval: error: a mistake", file=sys.stderr)
    assert capsys.readouterr() == ("", "gptlite-eval: error: a mistake\n")
    with NoteBeforeFirstWords("backend: jax, why") as note:
        note.say()  # a quiet run that ends well says it still
    assert capsys.readouterr().err == "backend: jax, why\n"


def test_a_crash_s_stacks_reach_standard_error_while_native_lines_are_held_back():
    import subprocess
    import sys

    # Under `python -X faulthandler`, a process killed by SIGABRT writes its threads' stacks: past the pipe that
    # native lines go through, whose reader dies with the process.
    crash = ("import os, signal; from gptlite.cli.startup import hold_back_false_alarms; hold_back_false_alarms(); "
             "os.kill(os.getpid(), signal.SIGABRT)")
    result = subprocess.run([sys.executable, "-X", "faulthandler", "-c", crash], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == -6 and "Fatal Python error: Aborted" in result.stderr, result.stderr
