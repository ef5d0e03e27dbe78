"""`gptlite.quiet()`: a Python program's way to start Keras without TensorFlow's start-up notices."""

import os
import subprocess
import sys

import keras
import pytest

from conftest import REPO
from gptlite.backend.notices import NATIVE_LOG_LINE

TENSORFLOW_ONLY = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's notices")


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
