"""The running backend's `Runtime`: what the decode path, the model, the data, the export and the training ask
instead of the backend's name."""

import keras
import numpy as np
import pytest

from gptlite.backend import program_bytes
import gptlite
from gptlite.backend.runtime import check_split, running, RUNTIMES


def test_the_running_backends_runtime_answers_for_it():
    runtime = running()
    assert runtime.name == keras.backend.backend() and running() is runtime
    assert set(RUNTIMES) == {"tensorflow", "jax", "torch"}
    assert runtime.version() and runtime.compiles == (runtime.name != "torch")
    assert runtime.compiles_prefill_aside == (runtime.name == "tensorflow")
    assert runtime.run_eagerly(lambda a, b: a + b, (2, 3)) == 5


def test_a_program_the_runtime_traced_loads_from_its_bytes_and_gives_the_functions_result():
    runtime = running()
    if not runtime.compiles or runtime.traces_each_process():
        pytest.skip(f"{runtime.name} keeps no program as bytes here")
    weight = keras.Variable(np.array([1.0, 2.0], "float32"), trainable=False, name="weight_for_a_test")
    holder = type("Holder", (), {"variables": [weight]})()
    header, payload = runtime.trace(lambda x: [x * 2.0 + weight.value], holder, [((2,), "float32")], False)
    program = runtime.load(dict(header, outputs_layout={"list": [0]}), payload)
    # A program reads the weights at each call, as `decode.compiled.Compiled` gives them.
    assert np.allclose(keras.ops.convert_to_numpy(program([weight], [np.array([3.0, 4.0], "float32")])[0]),
                       [7.0, 10.0])
    assert program_bytes.load(runtime.name, dict(header, outputs_layout={"list": [0]}), payload) is not None


def test_each_runtime_says_what_the_model_the_data_and_the_export_do_their_own_way():
    tensorflow, jax, torch = (RUNTIMES[name]() for name in ("tensorflow", "jax", "torch"))
    assert [runtime.attends_grouped_heads for runtime in (tensorflow, jax, torch)] == [False, True, False]
    assert [runtime.recomputes_gelu_gradient for runtime in (tensorflow, jax, torch)] == [True, False, False]
    assert [runtime.reads_batches_through_tf_data for runtime in (tensorflow, jax, torch)] == [True, False, False]
    assert [runtime.exports_saved_model for runtime in (tensorflow, jax, torch)] == [True, True, False]
    assert tensorflow.saved_model_options(64) == {} and torch.fused_attention_is_faster("float32")
    assert "length <= 64" in jax.saved_model_options(64)["jax2tf_kwargs"]["polymorphic_constraints"]


def test_each_runtime_says_how_it_trains():
    tensorflow, jax, torch = (RUNTIMES[name]() for name in ("tensorflow", "jax", "torch"))
    assert [runtime.runs_steps_one_by_one for runtime in (tensorflow, jax, torch)] == [False, False, True]
    assert jax.trains_with_xla(None, lora=True) and not torch.trains_with_xla(None, lora=False)
    assert jax.process_part() == (0, 1) == torch.process_part()  # no distribution set
    with pytest.raises(gptlite.ConfigError, match="grad_accum.*jax backend"):
        tensorflow.check_accumulation(2)
    tensorflow.check_accumulation(1), jax.check_accumulation(4)
    with pytest.raises(gptlite.ConfigError, match="tensorflow or jax"):
        with torch.data_parallel(8):
            pass
    runtime = running()
    runtime.check_precision("fp32")
    assert runtime.peak_flops() == (312e12 if runtime.on_gpu() else None)
    assert not runtime.mirrors_variables()


def test_a_batch_that_does_not_split_evenly_is_refused():
    with pytest.raises(gptlite.ConfigError, match="does not split evenly across 3 devices"):
        check_split(8, 3)
    check_split(8, 2)

