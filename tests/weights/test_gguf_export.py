"""GGUF export: one file that llama.cpp runs.

Where llama-cpp-python is installed (the `llama` extra: it builds llama.cpp from source), llama.cpp itself
loads each file, and its token ids, logits and greedy tokens are compared with gptlite's, both computed here.
Without it those tests are skipped; .ci/run installs it and runs them (-m extras). The models are tiny,
trained here for a few seconds so that their next tokens are not ties.
"""

import importlib.util
import itertools
import os

import keras
import numpy as np
import pytest

import gptlite
from conftest import make_text, run_python
from test_llama import sentencepiece_tokenizer
from test_pretrained import bpe, hugging_face_folder  # noqa: F401 (fixtures: a tiny GPT-2 saved by transformers)
from gptlite.text import templates

# What the JAX and torch suites leave out: the mapping of weights and the files are the same on every backend, and
# each backend's forward pass gives TensorFlow's logits for the same weights (tests/weights/test_saving.py).
SAME_ON_EVERY_BACKEND = pytest.mark.once("weights map and files read alike on every backend")

# Unicode, runs of spaces, tabs and newlines, quotes and an apostrophe.
TRICKY = "  Héllo\n\n  wörld — “quoted”\tit's  the cat's hat \\ back in 2024, 3.14  \n\nend"
TEXT = make_text(3000) + (TRICKY + "\n") * 20
# llama.cpp computes in float32 in another order than the backend does: a Llama-family model's next-token
# logits agree to about 1e-6 of their scale here, and a tenth of a thousandth is far from that and far below
# the gaps between a trained model's choices. Its `gpt2` looks GELU up in a table of float16 values, by its
# input rounded to float16 (ggml-cpu's GGML_GELU_FP16): each feed-forward unit is off by up to about 1e-3 of
# itself, which leaves the logits within about 2e-4 of their scale here; 1e-3 allows for other weights.
LOGIT_TOLERANCE = {"gpt2": 1e-3, "llama": 1e-4, "qwen2": 1e-4, "qwen3": 1e-4}
NEW_TOKENS = 50


def _train(model, tokenizer, steps=96, seed=0, text=TEXT):
    """A few seconds of training on `text`, so that greedy choices have margins."""
    length = model.config.block_size + 1
    ids = tokenizer.encode(text).astype("int32")
    starts = np.random.default_rng(seed).integers(0, len(ids) - length, size=steps * 32)
    windows = ids[starts[:, None] + np.arange(length)]
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(windows[:, :-1], windows[:, 1:], batch_size=32, epochs=1, verbose=0)
    return model


def _byte_level_tokenizer(splitting):
    """Qwen's kind (Qwen2's splitting) or SmolLM2's (each digit apart, then GPT-2's splitting): byte-level BPE, the
    end of text a special token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from gptlite.weights.gguf_export import QWEN2_SPLIT

    tokenizer = Tokenizer(models.BPE())
    if splitting == "qwen2":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                           pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TEXT], trainer)
    return gptlite.PretrainedTokenizer(tokenizer.to_str(), end_token="<|endoftext|>")


SHAPE = dict(n_layer=2, n_head=4, n_embd=64, block_size=64)
# Each kind of model llama.cpp runs: its settings and tokenizer, and the architecture it is written as.
KINDS = {
    "char": (dict(), "char", "gpt2"),
    "bpe": (dict(bias=True, tie_weights=False, position="sinusoidal"), "bpe", "gpt2"),
    "modern": (dict(position="rotary", norm="rms", mlp="swiglu", n_kv_head=2, qk_norm=True), "char", "qwen3"),
    "llama": (dict(position="rotary", norm="rms", mlp="swiglu", n_kv_head=1, tie_weights=False, rope_theta=500.0),
              "char", "llama"),
    "qwen2": (dict(position="rotary", norm="rms", mlp="swiglu", n_kv_head=2, qkv_bias=True), "qwen2", "qwen2"),
    # SmolLM2's kind: grouped-query, tied, byte-level BPE that splits digits apart.
    "smollm2": (dict(position="rotary", norm="rms", mlp="swiglu", n_kv_head=2), "smollm", "llama"),
    # TinyLlama's kind: grouped-query, untied, SentencePiece-style BPE with byte fallback and a beginning token.
    "tinyllama": (dict(position="rotary", norm="rms", mlp="swiglu", n_kv_head=2, tie_weights=False),
                  "sentencepiece", "llama"),
    # GPT-2's layout with trained LoRA adapters beside its weights, which the file holds merged.
    "lora": (dict(), "char", "gpt2"),
    # Conversations in the default template, its turn markers added tokens.
    "chat": (dict(position="rotary", norm="rms", mlp="swiglu"), "chat", "llama"),
    # A chat run's own from scratch where its answers are words: the chat defaults' model, gptlite's BPE with each
    # digit apart, the turn markers added tokens.
    "chat_bpe": (dict(position="rotary", norm="rms", mlp="swiglu", n_kv_head=2, qk_norm=True), "chat_bpe", "qwen3"),
}


def _conversations(count=400, seed=0):
    """Sums asked and answered in the default template: learnable in seconds, each answer ended by <|end|>."""
    rng = np.random.default_rng(seed)
    turns = []
    for left, right in rng.integers(0, 50, size=(count, 2)):
        turns.append(templates.render(templates.DEFAULT_TEMPLATE, [
            {"role": "user", "content": f"{left}+{right}"}, {"role": "assistant", "content": str(left + right)}]))
    return "".join(turns)


def _tokenizer(kind):
    if kind == "char":
        return gptlite.CharTokenizer.from_text(TEXT)
    if kind == "chat":
        return gptlite.CharTokenizer.from_text("0123456789+").with_chat_tokens(templates.TURN_MARKERS,
                                                                             templates.DEFAULT_TEMPLATE)
    if kind == "bpe":
        return gptlite.BPETokenizer.train([TEXT], 360)
    if kind == "chat_bpe":
        return gptlite.BPETokenizer.train([TEXT], 400, digits_apart=True).with_chat_tokens(
            templates.TURN_MARKERS, templates.DEFAULT_TEMPLATE)
    if kind == "sentencepiece":
        tokenizer, begin, end = sentencepiece_tokenizer()
        return gptlite.PretrainedTokenizer(tokenizer.to_str(), begin_token=begin, end_token=end)
    return _byte_level_tokenizer(kind)


@pytest.fixture(scope="module")
def models():
    """kind -> a trained model, built the first time a test asks for it."""
    built = {}

    def get(kind):
        if kind not in built:
            model = _untrained(kind)
            tokenizer = model.tokenizer
            text = _conversations() if KINDS[kind][1] == "chat" else TEXT
            _train(model, tokenizer, text=text)
            if kind == "lora":
                model.enable_lora(4)
                _train(model, tokenizer, steps=32, seed=1)
            built[kind] = model
        return built[kind]

    return get


def _untrained(kind):
    """A model of that kind with its first weights: enough for what the file holds, and quick under any backend."""
    settings, tokenizer_kind, _ = KINDS[kind]
    tokenizer = _tokenizer(tokenizer_kind)
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, **SHAPE, **settings)
    model.build((None, SHAPE["block_size"]))
    return model


@pytest.fixture(scope="module")
def exported(models, tmp_path_factory):
    """(kind, outtype) -> the GGUF file of that model."""
    folder = tmp_path_factory.mktemp("gguf")
    written = {}

    def get(kind, outtype="f32"):
        if (kind, outtype) not in written:
            path = folder / f"{kind}-{outtype}.gguf"
            gptlite.export_gguf(models(kind), path, outtype)
            written[kind, outtype] = path
        return written[kind, outtype]

    return get


def in_llama_cpp(test):
    """A test that runs the files in llama.cpp: where llama-cpp-python is installed, under TensorFlow. Decided
    before any model is trained for it."""
    marks = [pytest.mark.extras, pytest.mark.slow,
             pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                reason="needs llama-cpp-python (the `llama` extra) to check the files"),
             pytest.mark.once("llama.cpp reads the same file whichever backend wrote it")]
    for mark in marks:
        test = mark(test)
    return test


def _llama(path, context, repack=True):
    import llama_cpp

    if not repack:
        # llama.cpp 0.3.36 (llama-cpp-python's build) crashes multiplying these small q8_0 matrices on machine D
        # (AMX) when it repacks the weights for its CPU kernels; `llama-cli --no-repack` is the same switch.
        defaults = llama_cpp.llama_cpp.llama_model_default_params

        def without_repacking():
            params = defaults()
            params.use_extra_bufts = False
            return params

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(llama_cpp.llama.llama_cpp, "llama_model_default_params", without_repacking)
            return _llama(path, context)
    # Float32 keys and values, as gptlite keeps them; llama.cpp's default f16 cache would round them.
    return llama_cpp.Llama(model_path=str(path), n_ctx=context, n_batch=context, logits_all=True, verbose=False,
                           n_threads=2, seed=0, type_k=0, type_v=0, flash_attn=False)


def _logits(model, ids):
    """gptlite's next-token logits after each of `ids` (one window), (T, V)."""
    return np.asarray(model.predict_on_batch(np.asarray([ids], "int32")))[0]


def _llama_logits(llm, ids):
    llm.reset()
    llm.eval(list(ids))
    return np.asarray(llm.scores[:len(ids)], np.float32)


# --- the file itself: written with or without llama.cpp at hand


@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("kind", ["char", "modern"])
def test_the_file_holds_the_settings_and_the_weights_as_gptlite_has_them(kind, tmp_path):
    import gguf

    model = _untrained(kind)
    gptlite.export_gguf(model, tmp_path / "model.gguf", "f32")
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    architecture = KINDS[kind][2]
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == architecture
    assert int(fields[f"{architecture}.block_count"].parts[-1][0]) == SHAPE["n_layer"]
    assert int(fields[f"{architecture}.context_length"].parts[-1][0]) == SHAPE["block_size"]
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    embeddings = keras.ops.convert_to_numpy(model.embedding.token_embedding.embeddings)
    np.testing.assert_array_equal(np.asarray(tensors["token_embd.weight"].data), embeddings)
    assert len(fields["tokenizer.ggml.tokens"].data) == model.config.vocab_size


@SAME_ON_EVERY_BACKEND
def test_f16_and_q8_0_files_are_half_and_about_a_quarter_of_f32(tmp_path):
    # Wide enough that the matrices are most of the file, as in any model worth running (a cpu preset's too).
    tokenizer = gptlite.CharTokenizer.from_text(TEXT)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=4, n_embd=256, block_size=64,
                        tokenizer=tokenizer)
    model.build((None, 64))
    sizes = {}
    for outtype in ("f32", "f16", "q8_0"):
        gptlite.export_gguf(model, tmp_path / f"{outtype}.gguf", outtype)
        sizes[outtype] = os.path.getsize(tmp_path / f"{outtype}.gguf")
    assert sizes["f16"] <= 0.52 * sizes["f32"] and sizes["q8_0"] <= 0.30 * sizes["f32"], sizes


@SAME_ON_EVERY_BACKEND
def test_what_llama_cpp_cannot_run_is_refused_in_one_line_and_an_existing_file_is_kept(tmp_path, tiny_seq2seq):
    path = tmp_path / "out.gguf"
    model = _untrained("char")
    with pytest.raises(gptlite.ConfigError, match="decoder-only"):
        gptlite.export_gguf(tiny_seq2seq, path)
    tokenizer = gptlite.CharTokenizer.from_text("abc ")

    def refusal(match, **switches):
        odd = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=32, block_size=8,
                          tokenizer=tokenizer, **switches)
        odd.build((None, 8))
        with pytest.raises(gptlite.ConfigError, match=match) as refused:
            gptlite.export_gguf(odd, path)
        return str(refused.value)

    assert "\n" not in refusal("RMSNorm with table positions", norm="rms")
    refusal("a ReLU² feed-forward", position="rotary", norm="rms", mlp="relu2")
    refusal("post-norm blocks", norm_position="post")  # gpt2's layout otherwise
    refusal("post-norm blocks", position="rotary", norm="rms", mlp="swiglu", norm_position="post")  # llama's
    with pytest.raises(gptlite.ConfigError, match="outtype"):
        gptlite.export_gguf(model, path, outtype="q4_0")
    assert not path.exists()
    path.write_text("an earlier file")
    with pytest.raises(gptlite.RunExistsError, match="already exists"):
        gptlite.export_gguf(model, path)
    assert path.read_text() == "an earlier file"


@pytest.mark.slow
@SAME_ON_EVERY_BACKEND
def test_the_export_command_writes_gguf_and_refuses_outtype_elsewhere(tmp_path):
    model_path = tmp_path / "model.keras"
    _untrained("char").save(model_path)
    written = run_python("-m", "gptlite", "export", "--model", str(model_path), "--format", "gguf",
                         "--outtype", "q8_0", "--out", str(tmp_path / "mine.gguf"))
    assert written.returncode == 0, written.stderr
    assert "llama-cli -m" in written.stdout and (tmp_path / "mine.gguf").stat().st_size > 0
    refused = run_python("-m", "gptlite", "export", "--model", str(model_path), "--format", "hf",
                         "--outtype", "f16", "--out", str(tmp_path / "folder"))
    assert refused.returncode == 2 and "--outtype is for --format gguf" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "folder").exists()


# --- llama.cpp runs the files


@in_llama_cpp
@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "chat"])
def test_llama_cpp_tokenizes_as_gptlite(kind, tmp_path):
    # The file's tokenizer is the model's, trained or not: an untrained model's file will do.
    model = _untrained(kind)
    gptlite.export_gguf(model, tmp_path / "model.gguf", "f32")
    llm = _llama(tmp_path / "model.gguf", model.config.block_size)
    for text in (TRICKY, TEXT[:300], " ", "\n\n\n", "cat's   hat"):
        expected = model.tokenizer.encode(text).tolist()
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == expected, text
        decoded = llm.detokenize(expected).decode()
        if KINDS[kind][1] == "sentencepiece":
            # SentencePiece puts "▁" before a text; llama-cpp-python's detokenize keeps the space it stands for.
            decoded = decoded.removeprefix(" ")
        assert decoded == text


@in_llama_cpp
@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "chat"])
def test_f32_logits_equal_gptlites_and_llama_cpps_greedy_tokens_are_gptlites(kind, models, exported):
    model = models(kind)
    context = model.config.block_size
    llm = _llama(exported(kind), context)
    prompt = model.tokenizer.encode(TRICKY).tolist()[:context - NEW_TOKENS]
    expected = _logits(model, prompt)
    got = _llama_logits(llm, prompt)
    tolerance = LOGIT_TOLERANCE[KINDS[kind][2]] * np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance)

    ids = prompt + list(itertools.islice(llm.generate(prompt, temp=0.0, top_k=1, reset=True), NEW_TOKENS))
    assert len(ids) == len(prompt) + NEW_TOKENS
    # Each of llama.cpp's tokens is gptlite's likeliest after the tokens before it, up to the tolerance.
    logits = _logits(model, ids[:-1])
    for position in range(len(prompt), len(ids)):
        row = logits[position - 1]
        assert row[ids[position]] >= row.max() - tolerance, position


@in_llama_cpp
@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_f16_and_q8_0_agree_with_gptlite_on_the_next_token_almost_everywhere(outtype, models, exported):
    model = models("char")
    context = model.config.block_size
    llm = _llama(exported("char", outtype), context, repack=outtype != "q8_0")
    agree = total = 0
    text_ids = model.tokenizer.encode(make_text(400, seed=5)).tolist()  # text the model did not train on
    for start in range(0, len(text_ids) - context, context):
        window = text_ids[start:start + context]
        agree += int((_llama_logits(llm, window).argmax(-1) == _logits(model, window).argmax(-1)).sum())
        total += context
    assert agree >= 0.95 * total, f"{agree} of {total}"


@in_llama_cpp
def test_llama_cpps_chat_completion_renders_as_gptlite_answers_greedily_and_stops_at_the_end_of_the_turn(
        models, exported):
    model = models("chat")
    tokenizer = model.tokenizer
    llm = _llama(exported("chat"), model.config.block_size)
    end_of_turn = int(tokenizer.encode(templates.END_OF_TURN)[0])
    assert llm.token_eos() == end_of_turn
    for left, right in ((12, 7), (30, 41), (5, 5)):
        messages = [{"role": "user", "content": f"{left}+{right}"}]
        prompt = templates.render_for(tokenizer, messages, add_generation_prompt=True)
        prompt_ids = tokenizer.encode(prompt).tolist()
        assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == prompt_ids
        answer = llm.create_chat_completion(messages, temperature=0.0, max_tokens=8, repeat_penalty=1.0)
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "stop", choice  # at <|end|>, which the text leaves out
        ids = prompt_ids + tokenizer.encode(choice["message"]["content"]).tolist() + [end_of_turn]
        logits = _logits(model, ids[:-1])
        tolerance = LOGIT_TOLERANCE["llama"] * np.abs(logits).max()
        for position in range(len(prompt_ids), len(ids)):
            assert logits[position - 1][ids[position]] >= logits[position - 1].max() - tolerance, (position, choice)


@in_llama_cpp
def test_q8_0_weights_are_byte_for_byte_llama_cpps_own_quantization_of_the_f32_file(exported, tmp_path):
    import ctypes

    import gguf

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(gguf.LlamaFileType.MOSTLY_Q8_0)
    theirs = tmp_path / "theirs.gguf"
    assert llama_cpp.llama_model_quantize(str(exported("char")).encode(), str(theirs).encode(),
                                          ctypes.byref(params)) == 0
    ours = {tensor.name: tensor for tensor in gguf.GGUFReader(exported("char", "q8_0")).tensors}
    quantized = {tensor.name: tensor for tensor in gguf.GGUFReader(theirs).tensors}
    assert set(ours) == set(quantized)
    for name, tensor in quantized.items():
        assert ours[name].tensor_type == tensor.tensor_type, name
        np.testing.assert_array_equal(np.asarray(ours[name].data), np.asarray(tensor.data), err_msg=name)


@in_llama_cpp
def test_a_gpt2_imported_from_a_hugging_face_folder_runs_in_llama_cpp_as_in_gptlite(hugging_face_folder, tmp_path):
    model = gptlite.from_pretrained(hugging_face_folder[0])
    path = tmp_path / "gpt2.gguf"
    gptlite.export_gguf(model, path, "f32")
    llm = _llama(path, model.config.block_size)
    ids = model.tokenizer.encode(TRICKY).tolist()
    assert llm.tokenize(TRICKY.encode(), add_bos=False, special=False) == ids
    window = ids[:model.config.block_size]
    expected = _logits(model, window)
    np.testing.assert_allclose(_llama_logits(llm, window), expected, rtol=0,
                               atol=LOGIT_TOLERANCE["gpt2"] * np.abs(expected).max())
