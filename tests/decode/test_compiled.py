import keras
import pytest

import gptlite
from conftest import assert_greedy
from gptlite.decode.programs import programs_for

pytestmark = pytest.mark.skipif(keras.backend.backend() == "torch", reason="torch decodes eagerly: no programs")


def _model(tokenizer, seed, **settings):
    keras.utils.set_random_seed(seed)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=8, block_size=16,
                        tokenizer=tokenizer, **settings)
    model.build((None, 16))
    return model


def test_models_of_one_architecture_share_their_programs_and_another_setting_has_its_own(tokenizer):
    first = _model(tokenizer, 0, norm_epsilon=2e-5)
    gptlite.generate(first, "the", 5, temperature=0)
    # Other weights, the same architecture: the programs this process made for the first are used as they are.
    same = _model(tokenizer, 1, norm_epsilon=2e-5)
    text = gptlite.generate(same, "the", 5, temperature=0)
    programs = programs_for(same)
    assert programs.built > 0 and programs.traces == 0 and programs.loads == 0
    # They read the model's own weights at each call: its greedy text is its own.
    assert_greedy(same, "the", text)
    # Another setting of the same shapes: programs of its own, traced here or found on disk.
    other = _model(tokenizer, 0, norm_epsilon=3e-3)
    gptlite.generate(other, "the", 5, seed=1)
    assert programs_for(other).traces + programs_for(other).loads > 0


def test_a_model_that_gains_adapters_after_decoding_decodes_with_them(tokenizer):
    import numpy as np

    model = _model(tokenizer, 2)
    gptlite.generate(model, "the", 5, temperature=0)
    model.enable_lora(2, targets="qkv,contract")
    for layer in model._flatten_layers():
        if getattr(layer, "lora_enabled", False):  # adapters that change the logits: B starts at zero
            layer.lora_b.assign(np.random.default_rng(0).normal(0, 0.5, layer.lora_b.shape).astype("float32"))
    text = gptlite.generate(model, "the", 5, temperature=0)
    # Greedy by the model as it is now, adapters and all: its programs read its new weights.
    assert_greedy(model, "the", text)
    assert programs_for(model).variables == model.variables


def test_a_decode_stopped_before_its_first_step_leaves_no_program_running_beside_the_next(tokenizer, monkeypatch):
    import threading
    import time

    from gptlite.decode.compiled import Compiled

    # Each program's run on a preparing thread takes a while: long enough that a decode stopped at its first piece
    # is over before the run it started.
    running, most = [], []
    make_program = Compiled._program

    def slow_program(self, layout, shapes):
        program = make_program(self, layout, shapes)

        def run(variables, inputs):
            if threading.current_thread() is threading.main_thread():
                return program(variables, inputs)
            running.append(1)
            most.append(len(running))
            time.sleep(0.5)
            try:
                return program(variables, inputs)
            finally:
                running.pop()

        return run

    monkeypatch.setattr(Compiled, "_program", slow_program)
    # Settings no other test uses, so that this process has no programs for them yet.
    first, second = (_model(tokenizer, 0, norm_epsilon=epsilon) for epsilon in (4e-4, 5e-4))
    stopped = gptlite.stream(first, "the", 20, seed=1)
    next(stopped)
    stopped.close()  # its first step's program is still being prepared
    text = "".join(gptlite.stream(second, "the cat", 20, seed=1))
    assert most and max(most) == 1 and isinstance(text, str)
