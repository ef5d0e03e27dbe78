"""Llama-family Hugging Face folders (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) in and out.

Every model here is tiny, with random weights, built by transformers and saved locally with a tokenizer
trained here by the tokenizers library: nothing is downloaded. transformers builds its models with torch, so
these tests need torch.
"""

import json

import keras
import numpy as np
import pytest

import gptlite
from conftest import make_text
from gptlite.weights import llama

# What the JAX and torch suites leave out: the mapping of weights and the files are the same on every backend, and
# each backend's forward pass gives TensorFlow's logits for the same weights (tests/weights/test_saving.py).
SAME_ON_EVERY_BACKEND = pytest.mark.once("weights map and files read alike on every backend")

# transformers needs torch, which the dev extra leaves out: .ci/run runs these under TensorFlow once it is there.
pytestmark = pytest.mark.extras

# Unicode, runs of spaces, tabs and newlines, a character the vocabulary lacks (byte fallback), an emoji.
TRICKY = "  Héllo\n\n  wörld 😀 it's  the cat's\that Ünïcödé — “quoted”  \n\nend"
CORPUS = ("The quick brown fox jumps over the lazy dog. It's a cat's hat, isn't it?\n"
          "Ünïcödé wörds and\ttabs  and   spaces.\n") * 30
TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_level_tokenizer():
    """SmolLM2's and Qwen's kind: byte-level BPE, the end of text and chat markers as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([CORPUS], trainer)
    return tokenizer, "<|endoftext|>", "<|endoftext|>"


def sentencepiece_tokenizer():
    """Llama's and TinyLlama's kind: SentencePiece-style BPE over "▁"-joined words, with byte fallback for
    characters it lacks, and the beginning-of-text token put before every text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
                                  show_progress=False)
    tokenizer.train_from_iterator([line + "\n" for line in CORPUS.splitlines()], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", 1)])
    # As in Llama's files, the byte tokens are ordinary entries of the vocabulary, not added tokens.
    definition = json.loads(tokenizer.to_str())
    definition["added_tokens"] = [token for token in definition["added_tokens"] if token["content"] in
                                  ("<unk>", "<s>", "</s>")]
    return Tokenizer.from_str(json.dumps(definition)), "<s>", "</s>"


KINDS = {
    # Llama: untied head, 2 key/value heads for 4 heads, rope_theta 500, the SentencePiece-style tokenizer.
    "llama": (sentencepiece_tokenizer, dict(num_key_value_heads=2, tie_word_embeddings=False)),
    # Qwen2: tied head, multi-query attention (1 key/value head), biases on q, k and v, byte-level BPE.
    "qwen2": (byte_level_tokenizer, dict(num_key_value_heads=1, tie_word_embeddings=True)),
    # Qwen3: QK-norm, 2 key/value heads, and heads twice hidden_size / num_attention_heads wide, as in its releases.
    "qwen3": (byte_level_tokenizer, dict(num_key_value_heads=2, tie_word_embeddings=True, head_dim=16)),
}
CLASSES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}


# Reading and writing the folders is numpy, the same on every backend; the switches that set the three kinds apart
# (biases, a tied head, QK-norm, grouped queries, wide heads) run on each backend in test_architectures. So the
# TensorFlow suite checks every kind, and the others Llama alone.
@pytest.fixture(scope="module", params=sorted(KINDS) if keras.backend.backend() == "tensorflow" else ["llama"])
def folder(request, tmp_path_factory):
    """A tiny model saved by transformers as transformers 5 saves it, its tokenizer and chat template too."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    make_tokenizer, settings = KINDS[request.param]
    library_tokenizer, begin, end = make_tokenizer()
    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=library_tokenizer, bos_token=begin,
                                                        eos_token=end)
    hf_tokenizer.chat_template = TEMPLATE
    config_class = getattr(transformers, f"{CLASSES[request.param]}Config")
    # Wide initial weights make the likeliest token clearly ahead at each step, so greedy
    # decoding cannot turn on a rounding difference between the two implementations.
    config = config_class(vocab_size=library_tokenizer.get_vocab_size() + (12 if request.param == "qwen2" else 0),
                          hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                          max_position_embeddings=64, rope_theta=500.0, initializer_range=0.3,
                          bos_token_id=hf_tokenizer.bos_token_id, eos_token_id=hf_tokenizer.eos_token_id, **settings)
    torch.manual_seed(0)
    reference = getattr(transformers, f"{CLASSES[request.param]}ForCausalLM")(config)
    reference.eval()
    path = tmp_path_factory.mktemp(request.param)
    reference.save_pretrained(path)
    hf_tokenizer.save_pretrained(path)
    return request.param, path, reference, hf_tokenizer


@pytest.fixture(scope="module")
def model(folder):
    return gptlite.from_pretrained(folder[1])


def _logits(model, ids):
    return keras.ops.convert_to_numpy(model(np.asarray(ids, "int32")))


def _reference_logits(reference, ids):
    import torch

    with torch.no_grad():
        return reference(torch.tensor(np.asarray(ids, "int64"))).logits.numpy()


@SAME_ON_EVERY_BACKEND
def test_the_configuration_maps_to_gptlites_settings(folder, model):
    kind, _, reference, _ = folder
    config = model.config
    assert (config.position, config.norm, config.mlp, config.rope_theta) == ("rotary", "rms", "swiglu", 500.0)
    assert config.kv_heads == reference.config.num_key_value_heads < config.n_head == 4
    assert config.tie_weights == (kind != "llama")
    assert config.qkv_bias == (True if kind == "qwen2" else None) and not config.bias
    assert config.qk_norm == (kind == "qwen3")
    assert config.head_size == (16 if kind == "qwen3" else 8) and config.head_dim == (16 if kind == "qwen3" else None)
    assert config.mlp_hidden_size == 48 and config.block_size == 64
    assert model.config.vocab_size == reference.config.vocab_size


@SAME_ON_EVERY_BACKEND
def test_logits_equal_transformers(folder, model):
    reference = folder[2]
    rng = np.random.default_rng(0)
    for length in (1, 9, 64):
        ids = rng.integers(0, model.config.vocab_size, size=(2, length))
        np.testing.assert_allclose(_logits(model, ids), _reference_logits(reference, ids), atol=1e-4)


@SAME_ON_EVERY_BACKEND
def test_token_ids_equal_transformers_on_unicode_spaces_and_newlines(folder, model):
    hf_tokenizer = folder[3]
    tokenizer = model.tokenizer
    assert list(tokenizer.encode(TRICKY)) == hf_tokenizer(TRICKY, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(tokenizer.encode(TRICKY)) == TRICKY
    # A text starts with the beginning token where the tokenizer's own processing puts one there.
    with_specials = hf_tokenizer("a cat")["input_ids"]
    assert tokenizer.text_start_ids == with_specials[:len(with_specials) - len(tokenizer.encode("a cat"))]
    assert tokenizer.end_token_id == hf_tokenizer.eos_token_id
    assert tokenizer.chat_template == TEMPLATE
    assert tokenizer.character_count(tokenizer.encode(TRICKY)) == len(TRICKY)


@SAME_ON_EVERY_BACKEND
def test_greedy_ids_equal_transformers_generate(folder, model):
    import torch

    _, _, reference, hf_tokenizer = folder
    prompt = "The quick brown"
    ids = hf_tokenizer(prompt)["input_ids"]  # with the beginning token where the tokenizer adds one
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=50, min_new_tokens=50, do_sample=False,
                                 output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    top_two = np.stack([np.sort(scores[0].numpy())[-2:] for scores in out.scores])
    assert (top_two[:, 1] - top_two[:, 0]).min() > 1e-3  # no step is a near tie
    expected = out.sequences[0, len(ids):].numpy()
    end = model.tokenizer.end_token_id
    if end in expected:  # gptlite's text ends before the end token
        expected = expected[:list(expected).index(end)]
    text = gptlite.generate(model, prompt, max_new_tokens=50, temperature=0.0)
    assert text == prompt + model.tokenizer.decode_after(expected)
    assert text.startswith(prompt) and len(expected) > 10


@SAME_ON_EVERY_BACKEND
def test_export_and_reimport_give_the_same_logits_and_transformers_loads_the_export(folder, model, tmp_path):
    transformers = pytest.importorskip("transformers")
    gptlite.export_hugging_face(model, tmp_path / "out")
    again = gptlite.from_pretrained(tmp_path / "out")
    assert again.config == model.config
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, size=(1, 20))
    np.testing.assert_allclose(_logits(again, ids), _logits(model, ids), atol=1e-5)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(reloaded).__name__ == type(folder[2]).__name__
    np.testing.assert_allclose(_reference_logits(reloaded, ids), _logits(model, ids), atol=1e-4)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert hf_tokenizer(TRICKY)["input_ids"] == folder[3](TRICKY)["input_ids"]
    assert hf_tokenizer.chat_template == TEMPLATE


@SAME_ON_EVERY_BACKEND
def test_bf16_and_sharded_weights_read(folder, model, tmp_path):
    import ml_dtypes
    from safetensors.numpy import save_file

    arrays = llama.hugging_face_arrays(model)
    names = sorted(arrays)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    out = tmp_path / "sharded"
    out.mkdir()
    for file in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (folder[1] / file).exists():
            (out / file).write_bytes((folder[1] / file).read_bytes())
    for shard, shard_names in shards.items():
        save_file({name: arrays[name].astype(ml_dtypes.bfloat16) for name in shard_names}, str(out / shard))
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: shard for shard, shard_names in shards.items()
                                        for name in shard_names}}))
    halved = gptlite.from_pretrained(out)
    for name, value in llama.hugging_face_arrays(halved).items():
        np.testing.assert_array_equal(value, arrays[name].astype(ml_dtypes.bfloat16).astype(np.float32))
    (out / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(gptlite.MissingFileError, match="lacks model-00002-of-00002.safetensors"):
        gptlite.from_pretrained(out)


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling of type 'yarn'"),
    ({"use_sliding_window": True}, "sliding-window attention"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window attention"),
    ({"num_local_experts": 8}, "a mixture of experts"),
    ({"hidden_act": "gelu"}, "the activation 'gelu'"),
    ({"head_dim": 15}, "the head size .* must be even"),
    ({"model_type": "mistral"}, "holds a mistral model; gptlite reads GPT-2, Llama, Qwen2 and Qwen3 models"),
])
@SAME_ON_EVERY_BACKEND
def test_configurations_gptlite_cannot_express_are_refused_naming_what_is_missing(folder, tmp_path, change,
                                                                                  message):
    out = tmp_path / "changed"
    out.mkdir()
    for file in folder[1].iterdir():
        out.joinpath(file.name).write_bytes(file.read_bytes())
    config = json.loads((folder[1] / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(gptlite.InputError, match=message):
        gptlite.from_pretrained(out)


@SAME_ON_EVERY_BACKEND
def test_a_model_neither_layout_holds_is_refused_on_export(tmp_path, tokenizer):
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        position="rotary", norm="layer", tokenizer=tokenizer)
    model.build((None, 16))
    with pytest.raises(gptlite.ConfigError, match=r"GPT-2 cannot hold rotary positions.*LayerNorm"):
        gptlite.export_hugging_face(model, tmp_path / "out")
    # The Llama family's layout but for post-norm blocks.
    post_norm = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                            position="rotary", norm="rms", mlp="swiglu", norm_position="post", tokenizer=tokenizer)
    post_norm.build((None, 16))
    with pytest.raises(gptlite.ConfigError, match=r"Llama, Qwen2 or Qwen3 folder cannot hold post-norm blocks"):
        gptlite.export_hugging_face(post_norm, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_fine_tuning_a_llama_folder_with_lora_keeps_its_tokenizer_and_chat_template(folder, tmp_path):
    kind, path, _, _ = folder
    (tmp_path / "new.txt").write_text(make_text(3000), encoding="utf-8")
    settings = {"max_iters": 6, "eval_interval": 3, "eval_iters": 2, "checkpoint_interval": 3, "batch_size": 2,
                "block_size": 32, "lora_rank": 2, "warmup_iters": 1}
    run = gptlite.train_on_text([tmp_path / "new.txt"], tmp_path / "run", settings, init_from=str(path), verbose=0)
    adapted = [w for w in run.model.trainable_weights]
    # Every block: the fused q/k/v, the output, gate-and-up and down projections, two matrices each.
    assert len(adapted) == 2 * 4 * 2 and all(w.name in ("lora_a", "lora_b") for w in adapted)
    saved = gptlite.load(tmp_path / "run" / "model.keras")
    assert saved.config.block_size == 32 and saved.config.position == "rotary"
    assert isinstance(saved.tokenizer, gptlite.PretrainedTokenizer)
    assert saved.tokenizer.chat_template == TEMPLATE
    assert saved.tokenizer.encode(TRICKY).tolist() == run.model.tokenizer.encode(TRICKY).tolist()
    text = gptlite.generate(saved, "The quick", max_new_tokens=5, temperature=0.0)
    assert text.startswith("The quick")


@SAME_ON_EVERY_BACKEND
def test_a_folder_with_a_chat_template_chats_with_it(folder, model):
    from gptlite.decode import chat
    from gptlite.text import templates

    _, _, _, hf_tokenizer = folder
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick brown fox?"}]
    assert gptlite.chat_ready(model) is model  # its own template: no tokens added
    rendered = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The text transformers renders, as the model reads any text: after its beginning token, where it has one.
    assert templates.answer_prompt_ids(model.tokenizer, messages) == \
        [*model.tokenizer.text_start_ids, *model.tokenizer.encode(rendered).tolist()]
    answer = chat.reply(model, messages, max_new_tokens=6, temperature=0.0)
    assert "<|im_end|>" not in answer  # the answer ends before the template's end of turn, if it writes one
