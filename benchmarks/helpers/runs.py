"""One training run of gptlite and of the PyTorch reference, timed step by step, as benchmarks/train.py runs them,
and the recipes benchmarks/architectures.py compares (`VARIANTS`): what several training benchmarks share."""

import pathlib
import statistics
import tempfile
import time

from gptlite.training.settings import PRESETS

from helpers import peak_rss_mb, time_training

# GPT-2 small, as the fine-tuning benchmarks train it.
GPT2_SMALL = dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257)
WARMUP_STEPS = 2
DEFAULT_TEXT = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare.txt"
MATMUL_SIZE = 2048
REFERENCE_LR = 1e-3


def settings_for(preset, overrides):
    """The preset's settings with the command line's overrides, as one flat dict."""
    settings = dict(PRESETS[preset])
    settings.update({name: value for name, value in overrides.items() if value is not None})
    return settings


def flops_per_iteration(settings, parameters):
    layers, width, length = settings["n_layer"], settings["n_embd"], settings["block_size"]
    per_token = 6 * parameters + 12 * layers * length * width
    return per_token * length * settings["batch_size"]


def summarise(step_times, settings, parameters, matmul_flops_per_s):
    median = statistics.median(step_times[1:])
    return {
        "ms_per_iter": median * 1000,
        "tokens_per_s": settings["batch_size"] * settings["block_size"] / median,
        "compile_s": max(step_times[0] - median, 0.0),
        "peak_rss_mb": peak_rss_mb(),
        "mfu": flops_per_iteration(settings, parameters) / median / matmul_flops_per_s,
    }


def time_matmul(multiply, make_operand, repeats=5):
    a, b = make_operand(), make_operand()
    multiply(a, b)
    best = min(_timed(multiply, a, b) for _ in range(repeats))
    return 2 * MATMUL_SIZE**3 / best


def _timed(function, *args):
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def run_reference(text_path, settings, precision, seed):
    import torch

    from helpers.torch_reference import ReferenceTrainer, character_splits

    train_ids, validation_ids, vocabulary_size = character_splits(text_path.read_text(encoding="utf-8"))
    # nanoGPT's own learning rate for Tiny Shakespeare, whatever gptlite's preset uses.
    settings = {**settings, "lr": REFERENCE_LR}
    trainer = ReferenceTrainer(train_ids, validation_ids, vocabulary_size, settings, precision, seed)
    step_times = []
    for _ in range(settings["max_iters"]):
        start = time.perf_counter()
        trainer.step()
        step_times.append(time.perf_counter() - start)
    val_loss = trainer.validation_loss(settings["eval_iters"])
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    ceiling = time_matmul(torch.matmul, lambda: torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype))
    return {**summarise(step_times, settings, trainer.parameter_count(), ceiling), "val_loss": val_loss}


def run_gptlite(text_path, settings, precision, seed, vocab_size=None):
    """One training run as train.py trains; with `vocab_size`, on a byte-level BPE vocabulary of that many tokens
    learned from the text as train.py learns it (otherwise on its characters)."""
    import keras
    import numpy as np

    import gptlite
    from gptlite import files
    from gptlite.data import lm
    from gptlite.training import fit
    from gptlite.training.settings import dtype_policy, split_settings

    class StepClock(keras.callbacks.Callback):
        """Step times within each fit call, the first of each call (the one after an evaluation) left out."""

        def __init__(self):
            super().__init__()
            self.times, self.first = [], None

        def on_train_begin(self, logs=None):
            self.last = None

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.first is None:
                self.first = now - self.started
            elif self.last is not None:
                self.times.append(now - self.last)
            self.last = now

    text = files.read_text(text_path)
    if vocab_size:
        tokenizer = gptlite.BPETokenizer.train(lm.Corpus.from_text(text).sample(lm.BPE_SAMPLE_BYTES), vocab_size)
    else:
        tokenizer = gptlite.CharTokenizer.from_text(text)
    train_ids, validation_ids = lm.split(tokenizer.encode(text))
    model_settings, training_settings = split_settings(
        {**settings, "seed": seed, "precision": precision}
    )
    config = gptlite.TrainingConfig(**training_settings)
    keras.utils.set_random_seed(seed)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer,
                        dtype=dtype_policy(config.precision), **model_settings)
    model.build((None, model.config.block_size))
    clock = StepClock()
    clock.started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out_dir:
        rows = fit.train(model, train_ids, validation_ids, config, out_dir, "lm", verbose=0, callbacks=[clock])
        # The whole validation split, as `gptlite eval` scores a text (windows of the context overlapping by
        # half): the run's own validation loss is a mean over a few random windows, every position of each
        # counted, so it reads lower for a longer context whatever the model, and ranks close recipes by chance.
        validation_text = pathlib.Path(out_dir) / "validation.txt"
        validation_text.write_text(tokenizer.decode(list(validation_ids)), encoding="utf-8")
        held_out = gptlite.evaluate(model, validation_text).total
    # Without a position table, which is looked up rather than multiplied.
    table = model.config.block_size * model.config.n_embd if model.config.position != "rotary" else 0
    parameters = model.count_params() - table
    compute_dtype = "bfloat16" if precision == "bf16" else "float16" if precision == "fp16" else "float32"
    ceiling = time_matmul(
        lambda a, b: keras.ops.convert_to_numpy(keras.ops.cast(keras.ops.matmul(a, b)[0, 0], "float32")),
        lambda: keras.ops.cast(np.random.default_rng(0).normal(size=(MATMUL_SIZE, MATMUL_SIZE)), compute_dtype),
    )
    return {**summarise([clock.first, *clock.times], settings, parameters, ceiling),
            "val_loss": rows[-1]["val_loss"], "held_out_loss": held_out.loss,
            "held_out_bits_per_byte": held_out.bits_per_byte, "parameters": parameters,
            "train_s": rows[-1]["elapsed_s"]}


def beyond_cpu(preset):
    """What a preset sets beyond the cpu preset's: the settings that make it a variant of it."""
    return {name: value for name, value in PRESETS[preset].items() if PRESETS["cpu"].get(name) != value}


# Each variant's settings over the preset's. n_kv_head 2 of the cpu preset's 4 heads halves the cache.
# "modern" is what the modern preset sets beyond the cpu preset's: all five switches.
VARIANTS = {
    "gpt2": {},
    "rotary": {"position": "rotary"},
    "rms": {"norm": "rms"},
    "swiglu": {"mlp": "swiglu"},
    "relu2": {"mlp": "relu2"},
    "gqa": {"n_kv_head": 2},
    "qk_norm": {"qk_norm": True},
    "llama": {"position": "rotary", "norm": "rms", "mlp": "swiglu"},
    "modern": beyond_cpu("modern"),
}
# The optimizer beside each layout: Keras's Muon for the blocks' matrices (see docs/training.md), at the
# preset's steps, and at the steps its slower step fits in AdamW's wall time (its step measured at about
# 1.33x AdamW's on 2 cores: benchmarks/journal.md), its schedule over those; modern_muon_1500 was the laptop
# preset until its Newton-Schulz iterations went from 5 to 3 (below).
VARIANTS.update({"muon": {"optimizer": "muon"}, "modern_muon": {**VARIANTS["modern"], "optimizer": "muon"},
                 "muon_1500": {"optimizer": "muon", "max_iters": 1500},
                 "modern_muon_1500": {**VARIANTS["modern"], "optimizer": "muon", "max_iters": 1500}})
# Beside the best of those: ReLU² for SwiGLU, and Muon at twice the peak learning rate.
VARIANTS.update({"modern_relu2": {**VARIANTS["modern"], "mlp": "relu2"},
                 "modern_relu2_muon_1500": {**VARIANTS["modern_muon_1500"], "mlp": "relu2"},
                 "modern_muon_1500_lr6e-3": {**VARIANTS["modern_muon_1500"], "lr": 6e-3}})
# modern_muon_1500 with an output head of its own, and with a smaller or larger batch for the steps its step
# fits in the same time (Muon's share of a step does not change with the batch: about 1,950 steps of 8 rows,
# 840 of 24, 500 of 48).
VARIANTS.update({"laptop_untied": {**VARIANTS["modern_muon_1500"], "tie_weights": False},
                 "laptop_batch8": {**VARIANTS["modern_muon_1500"], "batch_size": 8, "max_iters": 1950},
                 "laptop_batch24": {**VARIANTS["modern_muon_1500"], "batch_size": 24, "max_iters": 840},
                 "laptop_batch48": {**VARIANTS["modern_muon_1500"], "batch_size": 48, "max_iters": 500}})
# The same at longer contexts, its rows fewer so that a step holds as many tokens (12 x 64): each
# position then sees more of the text before it, at a little more attention per token.
VARIANTS.update({"laptop_ctx128": {**VARIANTS["modern_muon_1500"], "block_size": 128, "batch_size": 6},
                 "laptop_ctx256": {**VARIANTS["modern_muon_1500"], "block_size": 256, "batch_size": 3}})
# Muon with 3 Newton-Schulz iterations for Keras's 5 (fewer products a step), at two of those contexts.
VARIANTS.update({f"{name}_ns3": {**VARIANTS[name], "newton_schulz_steps": 3}
                 for name in ("modern_muon_1500", "laptop_ctx128")})
# 3 iterations for the steps their quicker step fits in the time of 5's 1,500 (0.80x-0.91x its step on 2
# cores: benchmarks/journal.md): the laptop preset; and for the steps of the 0.80x.
# 2 iterations for the steps of their step (0.92x of 3's by a 200-step probe).
VARIANTS.update({"laptop": beyond_cpu("laptop"), "laptop_1870": {**beyond_cpu("laptop"), "max_iters": 1870},
                 "laptop_ns2_1840": {**beyond_cpu("laptop"), "newton_schulz_steps": 2, "max_iters": 1840}})
# The longer contexts for the steps their slower steps fit in modern_muon_1500's time (1.05x and 1.27x its
# step on 2 cores: benchmarks/journal.md).
VARIANTS.update({"laptop_ctx128_1400": {**VARIANTS["laptop_ctx128"], "max_iters": 1400},
                 "laptop_ctx256_1200": {**VARIANTS["laptop_ctx256"], "max_iters": 1200}})
# Muon's momentum at 0.9 for Keras's 0.95: the step's cost is the same.
VARIANTS["laptop_momentum09"] = {**beyond_cpu("laptop"), "muon_momentum": 0.9}
# The model's shape, one dimension at a time (4 heads and 2 key/value heads kept), for the steps each one's step
# fits in laptop's 1,700 (its step 0.77x, 1.49x, 0.69x and 1.98x laptop's on 2 cores: `step_times.py`).
VARIANTS.update({"laptop_layers3": {**beyond_cpu("laptop"), "n_layer": 3, "max_iters": 2210},
                 "laptop_layers6": {**beyond_cpu("laptop"), "n_layer": 6, "max_iters": 1145},
                 "laptop_width96": {**beyond_cpu("laptop"), "n_embd": 96, "max_iters": 2460},
                 "laptop_width192": {**beyond_cpu("laptop"), "n_embd": 192, "max_iters": 857}})
# Weight decay at twice the preset's 0.1.
VARIANTS["laptop_decay02"] = {**beyond_cpu("laptop"), "weight_decay": 0.2}
# AdamW's beta2 at 0.95 (nanoGPT's for GPT-2) for the preset's 0.99 (its for Tiny Shakespeare); the floor of the
# schedule at 3e-4 or 1e-5 for 1e-4; 200 warm-up steps for 100.
VARIANTS.update({"laptop_beta2_095": {**beyond_cpu("laptop"), "beta2": 0.95},
                 "laptop_min_lr3e-4": {**beyond_cpu("laptop"), "min_lr": 3e-4},
                 "laptop_min_lr1e-5": {**beyond_cpu("laptop"), "min_lr": 1e-5},
                 "laptop_warmup200": {**beyond_cpu("laptop"), "warmup_iters": 200}})
# Full multi-head attention (4 key/value heads for 2); the steps of 1.15x nanoGPT's wall time on a Zen 4, where
# laptop's 1,700 take 0.85x (the Tiny Shakespeare target's allowance: benchmarks/journal.md).
VARIANTS.update({"laptop_kv4": {**beyond_cpu("laptop"), "n_kv_head": 4},
                 "laptop_2300": {**beyond_cpu("laptop"), "max_iters": 2300}})
# Post-norm blocks (the original Transformer's: each sum normalised, no final norm) in GPT-2's layout, in the
# laptop preset's, and in each of its two halves (the modern switches by AdamW; GPT-2's layout by Muon); with and
# without warm-up, `norm_position.py`.
VARIANTS.update({"post_norm": {"norm_position": "post"},
                 "laptop_post_norm": {**beyond_cpu("laptop"), "norm_position": "post"},
                 "modern_post_norm": {**VARIANTS["modern"], "norm_position": "post"},
                 "muon_1500_post_norm": {**VARIANTS["muon_1500"], "norm_position": "post"}})


def measure_gptlite(args, rank):
    import keras

    import gptlite
    from gptlite.training.settings import dtype_policy, TrainingConfig

    config = TrainingConfig(batch_size=args.batch_size, max_iters=WARMUP_STEPS + args.steps, lr=1e-4, min_lr=1e-5,
                            warmup_iters=1, eval_interval=10_000, checkpoint_interval=10_000, eval_iters=1,
                            precision=args.precision, lora_rank=rank)
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(block_size=args.block_size, bias=True, dtype=dtype_policy(args.precision), **GPT2_SMALL)
    model.build((None, args.block_size))
    if rank:
        model.enable_lora(rank)
    return time_training(model, config, GPT2_SMALL["vocab_size"], WARMUP_STEPS)
