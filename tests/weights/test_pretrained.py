"""Pretrained models: GPT-2 weights in from Hugging Face and KerasHub and back out, fine-tuning, LoRA.

Every GPT-2 here is tiny, with random weights, built and saved locally:
nothing is downloaded.
"""

import hashlib
import json

import keras
import numpy as np
import pytest

import gptlite
from conftest import make_text
from gptlite.weights import gpt2

# What the JAX and torch suites leave out: the mapping of weights and the files are the same on every backend, and
# each backend's forward pass gives TensorFlow's logits for the same weights (tests/weights/test_saving.py).
SAME_ON_EVERY_BACKEND = pytest.mark.once("weights map and files read alike on every backend")
# transformers builds its GPT-2 with torch, which the dev extra leaves out: .ci/run runs these once it is there.
WITH_TRANSFORMERS_MODELS = pytest.mark.extras

# Unicode, runs of spaces, tabs, newlines, contractions, an emoji (4 UTF-8 bytes) and the end token.
TRICKY = "  Héllo\n\n  wörld 😀 it's  the cat's\that<|endoftext|>Ünïcödé — “quoted”  \n"
CORPUS = ("The quick brown fox jumps over the lazy dog. It's a cat's hat, isn't it?\n"
          "Ünïcödé wörds, 😀 emoji and\ttabs  and   spaces.\n") * 30


def _logits(model, ids):
    return keras.ops.convert_to_numpy(model(np.asarray(ids, "int32")))


@pytest.fixture(scope="module")
def bpe():
    return gptlite.BPETokenizer.train([CORPUS], 320)


@pytest.fixture(scope="module")
def hugging_face_folder(tmp_path_factory, bpe):
    """A tiny GPT-2 saved by transformers, with GPT-2's tokenizer files."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    # Wide initial weights make the likeliest token clearly ahead at each step, so greedy
    # decoding cannot turn on a rounding difference between the two implementations.
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=bpe.vocabulary_size,
                                     initializer_range=0.3)
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(folder)
    vocabulary, merges = gpt2.byte_level_bpe(bpe)
    (folder / "vocab.json").write_text(json.dumps(vocabulary), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return folder, reference


@pytest.fixture(scope="module")
def from_hugging_face(hugging_face_folder):
    return gptlite.from_pretrained(hugging_face_folder[0])


@WITH_TRANSFORMERS_MODELS
@SAME_ON_EVERY_BACKEND
def test_a_hugging_face_gpt2_gives_its_logits_and_token_ids(hugging_face_folder, from_hugging_face, bpe):
    import torch
    import transformers

    folder, reference = hugging_face_folder
    model = from_hugging_face
    assert model.config.block_size == 64 and model.config.bias and model.tokenizer.vocabulary_size == 320
    rng = np.random.default_rng(0)
    for length in (1, 7, 64):
        ids = rng.integers(0, 320, size=(2, length))
        with torch.no_grad():
            expected = reference(torch.tensor(ids)).logits.numpy()
        np.testing.assert_allclose(_logits(model, ids), expected, atol=1e-4)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert list(model.tokenizer.encode(TRICKY)) == hf_tokenizer(TRICKY)["input_ids"]
    assert model.tokenizer.decode(model.tokenizer.encode(TRICKY)) == TRICKY


@WITH_TRANSFORMERS_MODELS
@SAME_ON_EVERY_BACKEND
def test_greedy_text_is_transformers_greedy_text(hugging_face_folder, from_hugging_face):
    import torch

    _, reference = hugging_face_folder
    model = from_hugging_face
    prompt = "The quick brown"
    ids = model.tokenizer.encode(prompt).astype("int64")[None]
    with torch.no_grad():
        out = reference.generate(torch.tensor(ids), max_new_tokens=50, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=0)
    top_two = np.stack([np.sort(scores[0].numpy())[-2:] for scores in out.scores])
    assert (top_two[:, 1] - top_two[:, 0]).min() > 1e-3  # no step is a near tie
    new_ids = out.sequences[0, ids.shape[1]:].numpy()
    end = model.tokenizer.end_token_id
    if end in new_ids:  # gptlite's text ends before the end token
        new_ids = new_ids[:list(new_ids).index(end)]
    expected = model.tokenizer.decode(new_ids)
    assert gptlite.generate(model, prompt, max_new_tokens=50, temperature=0.0) == prompt + expected


@SAME_ON_EVERY_BACKEND
def test_a_kerashub_preset_gives_its_logits_and_token_ids(tmp_path, bpe):
    keras_hub = pytest.importorskip("keras_hub")
    vocabulary, merges = gpt2.byte_level_bpe(bpe)
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=bpe.vocabulary_size, num_layers=2, num_heads=2,
                                             hidden_dim=32, intermediate_dim=128, max_sequence_length=48)
    hub_tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(hub_tokenizer, sequence_length=48)
    keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=preprocessor).save_to_preset(str(tmp_path / "hub"))

    model = gptlite.from_pretrained(tmp_path / "hub")
    ids = np.random.default_rng(1).integers(0, bpe.vocabulary_size, size=(2, 48)).astype("int32")
    hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    expected = keras.ops.convert_to_numpy(backbone.token_embedding(hidden, reverse=True))
    np.testing.assert_allclose(_logits(model, ids), expected, atol=1e-4)
    # KerasHub's tokenizer splits a run of spaces before a word otherwise than GPT-2's own (and
    # transformers', which gptlite follows: the test above); elsewhere the ids are the same.
    text = "Héllo\n\nwörld 😀 it's the cat's\that<|endoftext|>Ünïcödé — “quoted” \n"
    assert list(model.tokenizer.encode(text)) == list(keras.ops.convert_to_numpy(hub_tokenizer(text)))


@WITH_TRANSFORMERS_MODELS
@SAME_ON_EVERY_BACKEND
def test_a_gpt_exports_to_hugging_face_and_back(tmp_path, bpe, tokenizer):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    keras.utils.set_random_seed(2)
    for name, model_tokenizer, bias in (("bpe", bpe, False), ("char", tokenizer, True)):
        model = gptlite.GPT(vocab_size=model_tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=16,
                            block_size=24, bias=bias, tokenizer=model_tokenizer)
        model.build((None, 24))
        folder = tmp_path / name
        gptlite.export_hugging_face(model, folder)
        exported = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
        ids = np.random.default_rng(3).integers(0, model_tokenizer.vocabulary_size, size=(2, 24))
        with torch.no_grad():
            expected = exported(torch.tensor(ids)).logits.numpy()
        np.testing.assert_allclose(_logits(model, ids), expected, atol=1e-4)
        text = TRICKY if name == "bpe" else "the cat sat\non a red hat"
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        assert hf_tokenizer(text)["input_ids"] == list(model_tokenizer.encode(text))
        assert hf_tokenizer.decode(model_tokenizer.encode(text)) == text
        # And back: the folder is a Hugging Face GPT-2 folder like any other.
        np.testing.assert_allclose(_logits(gptlite.from_pretrained(folder), ids), _logits(model, ids), atol=1e-5)


@WITH_TRANSFORMERS_MODELS
@SAME_ON_EVERY_BACKEND
def test_a_gpt_exports_as_a_kerashub_preset(tmp_path, from_hugging_face):
    keras_hub = pytest.importorskip("keras_hub")
    gptlite.export_kerashub(from_hugging_face, tmp_path / "hub")
    causal_lm = keras_hub.models.GPT2CausalLM.from_preset(str(tmp_path / "hub"))
    ids = np.random.default_rng(4).integers(0, 320, size=(2, 20)).astype("int32")
    expected = causal_lm({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    np.testing.assert_allclose(_logits(from_hugging_face, ids), keras.ops.convert_to_numpy(expected), atol=1e-4)


@SAME_ON_EVERY_BACKEND
def test_exports_gpt2_cannot_express_are_refused(tmp_path, tiny_model, tokenizer):
    untied = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                         tie_weights=False, tokenizer=tokenizer)
    untied.build((None, 16))
    with pytest.raises(gptlite.ConfigError, match="tie_weights=False"):
        gptlite.export_hugging_face(untied, tmp_path / "untied")
    with pytest.raises(gptlite.ConfigError, match="byte-level BPE"):
        gptlite.export_kerashub(tiny_model, tmp_path / "char")
    post_norm = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                            norm_position="post", tokenizer=tokenizer)
    post_norm.build((None, 16))
    for export in (gptlite.export_hugging_face, gptlite.export_kerashub):
        with pytest.raises(gptlite.ConfigError, match="post-norm blocks"):
            export(post_norm, tmp_path / "post")
    (tmp_path / "taken").mkdir()
    with pytest.raises(gptlite.RunExistsError):
        gptlite.export_hugging_face(tiny_model, tmp_path / "taken")
    assert not any((tmp_path / name).exists() for name in ("untied", "char", "post"))


@WITH_TRANSFORMERS_MODELS
@SAME_ON_EVERY_BACKEND
def test_folders_gptlite_cannot_read_say_why(tmp_path, hugging_face_folder):
    folder = tmp_path / "gelu"
    folder.mkdir()
    config = json.loads((hugging_face_folder[0] / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    with pytest.raises(gptlite.InputError, match="activation 'relu'"):
        gptlite.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(gptlite.MissingFileError, match="no tokenizer"):
        gptlite.from_pretrained(folder)
    with pytest.raises(gptlite.MissingFileError, match="no such model file"):
        gptlite.from_pretrained(tmp_path / "missing.keras")
    with pytest.raises(gptlite.MissingFileError, match="no such model: gpt2_no_such_size .* gpt2_base_en"):
        gptlite.from_pretrained("gpt2_no_such_size")
    (tmp_path / "empty").mkdir()
    with pytest.raises(gptlite.MissingFileError, match="empty has no config.json"):
        gptlite.from_pretrained(tmp_path / "empty")
    (folder / "config.json").write_text('{"model_type": "gpt2", ')
    with pytest.raises(gptlite.InputError, match=r"gelu/config.json is not valid JSON"):
        gptlite.from_pretrained(folder)


@pytest.fixture(scope="module")
def exported_folders(tmp_path_factory, bpe, tokenizer):
    """A small BPE GPT and a small char GPT, each exported by gptlite as a Hugging Face folder."""
    keras.utils.set_random_seed(6)
    folders = {}
    for name, model_tokenizer in (("bpe", bpe), ("char", tokenizer)):
        model = gptlite.GPT(vocab_size=model_tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16,
                            block_size=32, tokenizer=model_tokenizer)
        model.build((None, 32))
        folders[name] = (tmp_path_factory.mktemp(name) / "hf", model)
        gptlite.export_hugging_face(model, folders[name][0])
    return folders


@pytest.mark.slow
def test_a_char_models_hugging_face_export_comes_back_exactly_and_fine_tunes(tmp_path, exported_folders, text):
    folder, model = exported_folders["char"]
    back = gptlite.from_pretrained(folder)
    assert isinstance(back.tokenizer, gptlite.CharTokenizer)
    sample = "the cat sat\non  a red hat\n"
    assert list(back.tokenizer.encode(sample)) == list(model.tokenizer.encode(sample))
    assert back.tokenizer.decode(back.tokenizer.encode(sample)) == sample
    ids = model.tokenizer.encode(sample)[None]
    np.testing.assert_allclose(_logits(back, ids), _logits(model, ids), atol=1e-5)
    text_file = tmp_path / "words.txt"
    text_file.write_text(text)
    run = gptlite.train_on_text([text_file], tmp_path / "tuned", {**FINE_TUNE, "max_iters": 10}, init_from=folder,
                                verbose=0)
    assert run.best["val_loss"] > 0 and (tmp_path / "tuned" / "model.keras").exists()


@SAME_ON_EVERY_BACKEND
def test_a_tokenizer_json_with_the_end_token_among_its_added_tokens_reads(tmp_path, exported_folders, bpe):
    """transformers 5 saves GPT-2's tokenizer as tokenizer.json alone, the end of text an added token."""
    import shutil

    source, model = exported_folders["bpe"]
    folder = tmp_path / "hf5"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(source / name, folder)
    definition = json.loads(bpe.definition)
    end = definition["model"]["vocab"].pop(gptlite.BPETokenizer.END_TOKEN)
    definition["added_tokens"] = [{"id": end, "content": gptlite.BPETokenizer.END_TOKEN, "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": False, "special": True}]
    (folder / "tokenizer.json").write_text(json.dumps(definition), encoding="utf-8")
    back = gptlite.from_pretrained(folder)
    assert back.tokenizer.end_token_id == end == model.tokenizer.end_token_id
    assert list(back.tokenizer.encode(TRICKY)) == list(bpe.encode(TRICKY))


@SAME_ON_EVERY_BACKEND
def test_a_damaged_weights_file_is_named(tmp_path, exported_folders):
    import shutil

    source, _ = exported_folders["bpe"]
    folder = tmp_path / "cut"
    shutil.copytree(source, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(gptlite.InputError, match=r"cut/model.safetensors cannot be read .* cut short"):
        gptlite.from_pretrained(folder)


@SAME_ON_EVERY_BACKEND
def test_a_fine_tuning_run_writes_nowhere_near_its_source_and_keeps_its_tokenizer(tmp_path, exported_folders, text):
    folder, _ = exported_folders["char"]
    text_file = tmp_path / "words.txt"
    text_file.write_text(text)
    before = sorted(path.name for path in folder.iterdir())
    with pytest.raises(gptlite.ConfigError, match="is the folder of `init_from`"):
        gptlite.train_on_text([text_file], folder, FINE_TUNE, init_from=folder, verbose=0)
    with pytest.raises(gptlite.ConfigError, match="keeps its own tokenizer: leave out `tokenizer=char`"):
        gptlite.train_on_text([text_file], tmp_path / "run", FINE_TUNE, init_from=folder, tokenizer="char",
                              verbose=0)
    assert sorted(path.name for path in folder.iterdir()) == before and not (tmp_path / "run").exists()


# --- fine-tuning and LoRA, through the library pipeline

FINE_TUNE = {"max_iters": 30, "eval_interval": 10, "eval_iters": 4, "checkpoint_interval": 10, "batch_size": 8,
             "lr": 3e-3, "warmup_iters": 2}


@pytest.fixture(scope="module")
def base_model_file(tmp_path_factory, tokenizer):
    """A saved char-level GPT with random weights, and its file's digest."""
    keras.utils.set_random_seed(5)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=16, block_size=32,
                        tokenizer=tokenizer)
    model.build((None, 32))
    path = tmp_path_factory.mktemp("base") / "model.keras"
    gptlite.save(model, path)
    return path


def _assert_same(weight, expected):
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(weight), keras.ops.convert_to_numpy(expected))


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mean_loss(model, text):
    """The model's mean next-token loss over windows of `text`."""
    ids = model.tokenizer.encode(text).astype("int32")
    size = model.config.block_size
    windows = np.stack([ids[i:i + size + 1] for i in range(0, len(ids) - size - 1, size)])
    logits = _logits(model, windows[:, :-1])
    losses = keras.ops.sparse_categorical_crossentropy(windows[:, 1:], logits, from_logits=True)
    return float(np.mean(keras.ops.convert_to_numpy(losses)))


@pytest.mark.slow
def test_fine_tuning_a_saved_model_learns_the_new_text_and_leaves_the_source_alone(tmp_path, base_model_file):
    new_text = make_text(3000, seed=7).replace("cat", "cot")
    (tmp_path / "new.txt").write_text(new_text)
    digest = _digest(base_model_file)
    before = _mean_loss(gptlite.load(base_model_file), new_text[-2000:])

    run = gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "tuned", {**FINE_TUNE, "max_iters": 60,
                                                                              "block_size": 16},
                                init_from=base_model_file, verbose=0)
    assert run.model.config.block_size == 16 and run.model.config.n_embd == 16
    assert run.model.tokenizer.vocabulary == gptlite.load(base_model_file).tokenizer.vocabulary
    tuned = gptlite.load(tmp_path / "tuned" / "model.keras")
    assert tuned.embedding.position_embeddings.shape == (16, 16)
    assert _mean_loss(tuned, new_text[-2000:]) < before - 0.2
    assert _digest(base_model_file) == digest
    assert len(gptlite.generate(tuned, "the", max_new_tokens=40, seed=0)) == 43  # past its 16-token window


@pytest.mark.parametrize("settings, message", [
    ({"n_layer": 3}, "`n_layer` is 2 in the pretrained model"),
    ({"block_size": 64}, "may only shrink"),
])
@SAME_ON_EVERY_BACKEND
def test_fine_tuning_refuses_to_change_the_shape(tmp_path, base_model_file, settings, message):
    (tmp_path / "new.txt").write_text(make_text(500))
    with pytest.raises(gptlite.ConfigError, match=message):
        gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "tuned", settings, init_from=base_model_file,
                              verbose=0)
    assert not (tmp_path / "tuned").exists()


@pytest.mark.slow
@SAME_ON_EVERY_BACKEND
def test_characters_a_pretrained_char_model_never_saw_are_refused_or_handled(tmp_path, base_model_file):
    (tmp_path / "new.txt").write_text(make_text(3000).replace("cat", "çat"))
    with pytest.raises(gptlite.InputError, match="`unknown='skip'`"):
        gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "a", FINE_TUNE, init_from=base_model_file,
                              verbose=0)
    run = gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "b", {**FINE_TUNE, "max_iters": 10},
                                init_from=base_model_file, unknown="replace", verbose=0)
    assert run.history[-1]["step"] == 10


@pytest.mark.slow
def test_lora_trains_only_the_adapters_and_saves_merged_weights(tmp_path, base_model_file):
    (tmp_path / "new.txt").write_text(make_text(3000, seed=8))
    source = gptlite.load(base_model_file)
    settings = {**FINE_TUNE, "max_iters": 20, "lora_rank": 2, "lora_alpha": 4.0, "lora_targets": "qkv,expand"}
    run = gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "lora", settings, init_from=base_model_file,
                                verbose=0)
    model = run.model
    adapters = [w for w in model.trainable_weights]
    # Two blocks, two projections each, A (16, 2) and B (2, 48 or 64).
    assert sum(int(np.prod(w.shape)) for w in adapters) == 2 * (16 * 2 + 2 * 48 + 16 * 2 + 2 * 64)
    assert all(w.name in ("lora_a", "lora_b") for w in adapters)
    assert all(np.any(keras.ops.convert_to_numpy(w)) for w in adapters)
    for block, source_block in zip(model.blocks, source.blocks):  # the frozen kernels, not their merged view
        for name in ("qkv_projection", "output_projection"):
            _assert_same(getattr(block.attention, name).kernel, getattr(source_block.attention, name).kernel)
        for name in ("expand", "contract"):
            _assert_same(getattr(block.feed_forward, name).kernel, getattr(source_block.feed_forward, name).kernel)
        _assert_same(block.attention_norm.gamma, source_block.attention_norm.gamma)
    _assert_same(model.embedding.token_embedding.embeddings, source.embedding.token_embedding.embeddings)
    assert not model.blocks[0].attention.output_projection.lora_enabled

    # The last step's model, saved: the adapters merged into plain kernels, the same logits.
    gptlite.save(model, tmp_path / "merged.keras")
    merged = gptlite.load(tmp_path / "merged.keras")
    assert len(merged.weights) == len(source.weights)
    ids = model.tokenizer.encode("the cat sat on the mat").astype("int32")[None]
    np.testing.assert_allclose(_logits(merged, ids), _logits(model, ids), atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="only TensorFlow's LoRA step may go without XLA")
def test_a_small_models_lora_step_runs_under_xla_and_trains_as_without(tmp_path, base_model_file, monkeypatch):
    from gptlite.backend.runtime import TensorFlowRuntime

    (tmp_path / "new.txt").write_text(make_text(3000, seed=11))
    settings = {**FINE_TUNE, "max_iters": 10, "eval_interval": 5, "lora_rank": 2,
                "lora_targets": "qkv,attention_output,expand,contract,embedding"}
    small = gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "xla", settings, init_from=base_model_file,
                                  verbose=0)
    monkeypatch.setattr(TensorFlowRuntime, "lora_xla_max_parameters", 0)  # as a large model's step runs
    large = gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "plain", settings, init_from=base_model_file,
                                  verbose=0)
    assert small.model.jit_compile and not large.model.jit_compile
    # The same steps, up to the order in which XLA adds things up.
    for fused, plain in zip(small.history, large.history):
        np.testing.assert_allclose([fused["train_loss"], fused["val_loss"]], [plain["train_loss"], plain["val_loss"]],
                                   rtol=1e-3)


@pytest.mark.slow
def test_lora_may_train_the_token_embedding_whole_beside_the_adapters(tmp_path, base_model_file):
    (tmp_path / "new.txt").write_text(make_text(3000, seed=10))
    source = gptlite.load(base_model_file)
    settings = {**FINE_TUNE, "max_iters": 10, "lora_rank": 2, "lora_targets": "contract,embedding"}
    run = gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "lora", settings, init_from=base_model_file,
                                verbose=0)
    model = run.model
    table = model.embedding.token_embedding.embeddings
    assert sorted(w.name for w in model.trainable_weights) == sorted(["embeddings"] + ["lora_a", "lora_b"] * 2)
    assert not np.allclose(keras.ops.convert_to_numpy(table),
                           keras.ops.convert_to_numpy(source.embedding.token_embedding.embeddings))
    _assert_same(model.blocks[0].attention.qkv_projection.kernel, source.blocks[0].attention.qkv_projection.kernel)
    _assert_same(model.embedding.position_embeddings, source.embedding.position_embeddings)
    with pytest.raises(gptlite.ConfigError, match="lora_targets must name"):
        gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "bad", {**settings, "lora_targets": "embeddings"},
                              init_from=base_model_file, verbose=0)


@pytest.mark.slow
def test_lora_may_train_every_norm_whole_beside_the_adapters(tmp_path, base_model_file):
    (tmp_path / "new.txt").write_text(make_text(3000, seed=12))
    source = gptlite.load(base_model_file)
    settings = {**FINE_TUNE, "max_iters": 10, "lora_rank": 2, "lora_targets": "contract,norms"}
    model = gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "lora", settings, init_from=base_model_file,
                                  verbose=0).model
    norms = [weight.path for weight in model.weights if "norm" in weight.path]
    adapters = [weight.path for weight in model.trainable_weights if weight.name.startswith("lora_")]
    assert len(norms) >= 2 * len(model.blocks) + 1  # two in each block and the final one, at least
    assert sorted(weight.path for weight in model.trainable_weights) == sorted(norms + adapters)
    assert not np.allclose(keras.ops.convert_to_numpy(model.final_norm.weights[0]),
                           keras.ops.convert_to_numpy(source.final_norm.weights[0]))
    _assert_same(model.embedding.token_embedding.embeddings, source.embedding.token_embedding.embeddings)
    _assert_same(model.blocks[0].attention.qkv_projection.kernel, source.blocks[0].attention.qkv_projection.kernel)
    # The saved model keeps the trained norms, as it keeps the merged kernels.
    saved = gptlite.load(tmp_path / "lora" / "model.keras")
    _assert_same(saved.final_norm.weights[0], model.final_norm.weights[0])


@pytest.mark.slow
def test_a_resumed_lora_run_keeps_its_adapters_apart(tmp_path, base_model_file):
    (tmp_path / "new.txt").write_text(make_text(3000, seed=9))
    settings = {**FINE_TUNE, "lora_rank": 2}
    gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "run", {**settings, "max_iters": 10},
                          init_from=base_model_file, verbose=0)
    run = gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "run", {**settings, "max_iters": 20},
                                init_from=base_model_file, resume=True, verbose=0)
    assert [row["step"] for row in run.history] == [10, 20]
    layer = run.model.blocks[1].feed_forward.contract
    _assert_same(layer.kernel, gptlite.load(base_model_file).blocks[1].feed_forward.contract.kernel)
    assert np.any(keras.ops.convert_to_numpy(layer.lora_b))
    with pytest.raises(gptlite.ConfigError, match="`lora_rank` is 2 in the checkpoint"):
        gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "run", {**settings, "lora_rank": 4,
                                                                         "max_iters": 30}, resume=True, verbose=0)


@WITH_TRANSFORMERS_MODELS
@SAME_ON_EVERY_BACKEND
def test_other_hugging_face_files_read_the_same(tmp_path, hugging_face_folder, from_hugging_face, bpe):
    """pytorch_model.bin for the weights, tokenizer.json for the tokenizer."""
    import shutil

    import torch

    folder, reference = hugging_face_folder
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(folder / "config.json", other)
    torch.save(reference.state_dict(), other / "pytorch_model.bin")
    (other / "tokenizer.json").write_text(bpe.definition, encoding="utf-8")
    model = gptlite.from_pretrained(other)
    ids = np.arange(30)[None] % 320
    np.testing.assert_array_equal(_logits(model, ids), _logits(from_hugging_face, ids))
    assert list(model.tokenizer.encode(TRICKY)) == list(from_hugging_face.tokenizer.encode(TRICKY))
