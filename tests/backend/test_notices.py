"""`gptlite.quiet()`: a Python program's way to start Keras without TensorFlow's start-up notices."""

import os
import subprocess
import sys

import keras
import pytest

from conftest import REPO
from gptlite.backend import notices
from gptlite.backend.notices import NATIVE_LOG_LINE

TENSORFLOW_ONLY = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's notices")


@pytest.mark.slow
@TENSORFLOW_ONLY
def test_quiet_keeps_tensorflows_start_up_notices_out_and_import_alone_changes_nothing():
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}

    def start(code):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                                env=environment)
        assert result.returncode == 0, result.stderr
        return result.stderr

    def notices(stderr):  # TensorFlow's informational and warning lines
        return [line for line in stderr.splitlines()
                if (match := NATIVE_LOG_LINE.fullmatch(line)) and match.group(1) in "IW"]

    # TensorFlow writes some as it starts on a CPU machine ("oneDNN custom operations are on", "Could not find
    # cuda drivers"); import gptlite leaves its log level alone, so they come...
    assert notices(start("import gptlite, keras; keras.ops.ones(1)"))
    # ... and quiet() keeps them out.
    assert notices(start("import gptlite; gptlite.quiet(); import keras; keras.ops.ones(1)")) == []


def test_false_alarms_written_while_held_back_are_dropped_and_the_rest_written_after(capfd, monkeypatch):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # a Python program's default
    alarm = (b"E0000 00:00:1795571026.156186   15688 text_format.cc:378] Error parsing text-format "
             b"tensorflow.XlaSerializedCacheEntry: 2:1: Expected identifier, got: 4\n")
    error = b"E0000 00:00:1795499817.823238   23792 some_kernel.cc:12] could not allocate memory\n"
    with notices.false_alarms_held_back():
        with notices.false_alarms_held_back():  # another thread's first run, meanwhile
            os.write(2, alarm + error)
        os.write(2, alarm)
        assert capfd.readouterr().err == ""  # held until the last one closes
    assert capfd.readouterr().err == error.decode()
