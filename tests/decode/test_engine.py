"""The decode engine: its text against a plain full-forward decoder run beside it."""

import json
import os

import keras
import numpy as np
import pytest

import gptlite
from conftest import NEEDS_THE_PRIVATE_LAYER, TIE, assert_greedy, last_logits, run_python
from gptlite.decode.engine import Engine
from gptlite.decode.programs import RECOMPUTE
from gptlite.decode.sampling import RowSettings, sample_next_token, SamplingConfig, uniform_noise


def noise_of(model, seed, index):
    """The uniform noise (V,) the engine draws for a row's token `index`."""
    noise = uniform_noise(np.int32(seed % 2**31), np.int32(index), model.config.vocab_size)
    return keras.ops.convert_to_numpy(noise)


def reference_tokens(model, ids, config, count):
    """`count` tokens sampled after `ids` by a plain decoder: a whole forward pass for every token over the last
    block_size tokens, and the sampler on the noise the engine draws for (seed, token index)."""
    block_size, vocabulary_size = model.config.block_size, model.config.vocab_size
    ids = list(ids)
    tokens = []
    for index in range(count):
        logits = last_logits(model, [ids[-block_size:]])  # (1, V)
        noise = noise_of(model, config.seed, index)[None]
        token = int(keras.ops.convert_to_numpy(
            sample_next_token(logits, RowSettings.of([config], vocabulary_size), noise))[0])
        tokens.append(token)
        ids.append(token)
    return tokens


def engine_tokens(engine, drawn, rows, count):
    """Step the engine until each of `rows` (engine row handles) has `count` tokens; {row: tokens}."""
    tokens = {row: list(drawn[row].ids) for row in rows}
    while min(len(found) for found in tokens.values()) < count:
        for row, new in engine.step(8).items():
            tokens.setdefault(row, []).extend(new.ids)
    return {row: found[:count] for row, found in tokens.items() if row in rows}


def ids_of(model, prompt):
    return [int(i) for i in model.tokenizer.encode(prompt)]


def recomputing_loops_called(engine, monkeypatch):
    """The kinds of steps of the loops `engine` asks its programs for, from now on (a list that grows)."""
    kinds, loop = [], engine.programs.loop

    def recorded(kind, steps_kind, *args, **kwargs):
        kinds.append(steps_kind)
        return loop(kind, steps_kind, *args, **kwargs)

    monkeypatch.setattr(engine.programs, "loop", recorded)
    return kinds


@pytest.mark.parametrize("by_prefill", [False, True], ids=["recomputing loop", "recomputed by prefill"])
def test_the_engine_samples_what_a_plain_full_forward_decoder_samples(fluent_model, by_prefill, monkeypatch):
    # Across the window's end (block 16), with its recomputing steps; both sides draw the same noise.
    config = SamplingConfig(temperature=0.9, top_k=20, seed=5)
    engine = Engine(fluent_model, recompute_by_prefill=by_prefill)
    kinds = recomputing_loops_called(engine, monkeypatch)
    prompt = ids_of(fluent_model, "the dog ran to ")
    drawn = engine.admit([prompt], [config])
    (row,) = drawn
    found = engine_tokens(engine, drawn, [row], 40)[row]
    expected = reference_tokens(fluent_model, prompt, config, 40)
    # Two computations of the same logits may break a near-tie differently: where the texts part, the two
    # tokens' scores (scaled logit plus Gumbel noise) must be that close; past it the texts differ.
    for index, (got, want) in enumerate(zip(found, expected)):
        if got != want:
            window = (prompt + found[:index])[-fluent_model.config.block_size:]
            logits = last_logits(fluent_model, [window])[0] / config.temperature
            scores = logits - np.log(-np.log(noise_of(fluent_model, config.seed, index)))
            assert abs(scores[got] - scores[want]) < 1e-3, (index, found, expected)
            break
    assert (RECOMPUTE in kinds) != by_prefill  # the window's end was passed one way or the other


@pytest.mark.parametrize("as_on_a_gpu", [False, True], ids=["placed with NumPy", "placed by a program"])
def test_a_row_admitted_into_a_running_batch_gets_the_text_it_gets_alone(fluent_model, as_on_a_gpu, monkeypatch):
    # A CPU places joining rows with NumPy, a GPU by one program of the backend's: both run here.
    from gptlite.backend.runtime import running

    monkeypatch.setattr(running(), "rows_on_device", lambda: as_on_a_gpu)
    first, joining = SamplingConfig(temperature=1.0, seed=3), SamplingConfig(temperature=0.8, top_p=0.9, seed=8)
    engine = Engine(fluent_model, resizable=True, short_caches=True)
    drawn = engine.admit([ids_of(fluent_model, "a cat")], [first])
    (early,) = drawn
    early_tokens = list(drawn[early].ids)
    while len(early_tokens) < 25:  # past the window's end (block 16): cached steps, then recomputing ones
        early_tokens += list(engine.step(8)[early].ids)
    drawn = engine.admit([ids_of(fluent_model, "the big dog ")], [joining])
    (late,) = drawn
    assert engine.capacity == 2
    found = engine_tokens(engine, {**drawn, early: drawn[late]}, [late], 30)[late]
    alone = Engine(fluent_model)
    alone_drawn = alone.admit([ids_of(fluent_model, "the big dog ")], [joining])
    assert found == engine_tokens(alone, alone_drawn, list(alone_drawn), 30)[next(iter(alone_drawn))]
    # The early row's text is its own too: the first 25 tokens alone.
    alone = Engine(fluent_model)
    alone_drawn = alone.admit([ids_of(fluent_model, "a cat")], [first])
    assert early_tokens[:25] == engine_tokens(alone, alone_drawn, list(alone_drawn), 25)[next(iter(alone_drawn))]
    # Retiring rows frees their slots; the batch shrinks to what is left.
    engine.retire(early)
    engine.retire(late)
    assert engine.rows == {} and engine.step() == {}


@pytest.mark.slow
def test_a_batch_shrinks_at_its_next_step_once_few_rows_are_left_and_the_last_row_keeps_its_text(fluent_model):
    prompts = ["a cat", "the big dog ", "one", "a red hat on"]
    configs = [SamplingConfig(temperature=0.9, seed=seed) for seed in range(len(prompts))]
    engine = Engine(fluent_model, resizable=True, short_caches=True, mixed_settings=True)
    drawn = engine.admit([ids_of(fluent_model, prompt) for prompt in prompts], configs)
    *ended, last = drawn
    found = list(drawn[last].ids)
    for _ in range(2):
        found += list(engine.step(8)[last].ids)
    for row in ended:
        engine.retire(row)
    assert engine.capacity == 4  # rows ending together free their slots with no resize between
    found += list(engine.step(8)[last].ids)
    assert engine.capacity == 1
    while len(found) < 30:
        found += list(engine.step(8)[last].ids)
    alone = Engine(fluent_model)
    alone_drawn = alone.admit([ids_of(fluent_model, prompts[3])], [configs[3]])
    assert found[:30] == engine_tokens(alone, alone_drawn, list(alone_drawn), 30)[next(iter(alone_drawn))]


@pytest.mark.slow
def test_a_seq2seq_row_admitted_into_a_running_batch_reads_its_own_source(tiny_seq2seq):
    """A server's Seq2Seq rows join one running batch: each row's source goes with it into its slot."""
    from gptlite.decode.generation import source_ids

    tokenizer, block_size = tiny_seq2seq.tokenizer, tiny_seq2seq.config.block_size
    sampled = SamplingConfig(temperature=1.0, seed=3)
    start = [tokenizer.start_token_id]

    def alone(source):
        engine = Engine(tiny_seq2seq)
        drawn = engine.admit([start], [sampled], source_ids(tokenizer, block_size, [source]))
        return engine_tokens(engine, drawn, list(drawn), 5)[next(iter(drawn))]

    engine = Engine(tiny_seq2seq, resizable=True, short_caches=True, mixed_settings=True)
    (early, first), = engine.admit([start], [sampled], source_ids(tokenizer, block_size, ["abcd"])).items()
    tokens = {early: list(first.ids)}
    for row, new in engine.step(2).items():
        tokens[row] += list(new.ids)
    joined = engine.admit([start, start], [sampled, sampled], source_ids(tokenizer, block_size, ["dcb", "eabde"]))
    assert engine.capacity == 4
    tokens.update({row: list(new.ids) for row, new in joined.items()})
    while min(len(found) for found in tokens.values()) < 5:  # within the target's window of block_size - 1
        for row, new in engine.step(1).items():
            tokens[row] += list(new.ids)
    assert [tokens[row][:5] for row in (early, *joined)] == [alone("abcd"), alone("dcb"), alone("eabde")]


@pytest.mark.parametrize("by_prefill", [False, True], ids=["recomputing loop", "recomputed by prefill"])
def test_a_row_that_waits_past_its_limit_goes_on_with_the_text_it_gets_without_one(fluent_model, by_prefill):
    configs = [SamplingConfig(temperature=1.0, seed=3), SamplingConfig(temperature=0.8, top_p=0.9, seed=8)]
    prompts = [ids_of(fluent_model, "the big dog "), ids_of(fluent_model, "a")]

    def decode(limits_by_call, count):
        """Each row's tokens, the calls' limits ({row index: limit}) first, then none until `count` each."""
        engine = Engine(fluent_model, 2, recompute_by_prefill=by_prefill)
        drawn = engine.admit(prompts, configs)
        rows = list(drawn)
        tokens = [list(drawn[row].ids) for row in rows]
        calls = iter(limits_by_call)
        while min(map(len, tokens)) < count:
            limits = next(calls, {})
            for row, new in engine.step(8, limits={rows[index]: limit for index, limit in limits.items()}).items():
                assert len(new.ids) <= limits.get(rows.index(row), 8)
                tokens[rows.index(row)] += list(new.ids)
        return tokens

    # Block 16: the second row waits, its window short, while the first fills its own (cached steps); then the
    # first waits, full, while the second fills; then the second waits while the first recomputes.
    waited = decode([{1: 0}, {0: 0}, {0: 0}, {1: 0}, {1: 0}], 30)
    plain = decode([], 40)
    assert [tokens[:30] for tokens in waited] == [tokens[:30] for tokens in plain]


@pytest.mark.slow
def test_rows_with_mixed_settings_in_one_batch_each_match_their_own_single_row_result(fluent_model):
    configs = [SamplingConfig(20, temperature=0.0), SamplingConfig(20, temperature=1.2, top_k=5, seed=1),
               SamplingConfig(20, temperature=0.7, top_p=0.8, seed=2),
               SamplingConfig(20, temperature=1.0, min_p=0.1, repetition_penalty=1.3, seed=3)]
    prompts = ["the ", "a dog ", "ran to the ", "big "]
    from gptlite.decode.generation import RowsStream

    together = [""] * 4
    for step in RowsStream(fluent_model, prompts, configs):
        together = [text + piece for text, piece in zip(together, step)]
    for prompt, config, text in zip(prompts, configs, together):
        assert prompt + text == gptlite.generate(fluent_model, prompt, sampling=config)


@pytest.mark.slow
def test_a_seeded_row_gives_the_same_text_whatever_shares_its_batch(fluent_model):
    alone = gptlite.generate(fluent_model, "the cat", 30, temperature=1.0, seed=7)
    from gptlite.decode.generation import RowsStream

    configs = [SamplingConfig(30, temperature=1.0, seed=7), SamplingConfig(12, temperature=0.5, seed=1),
               SamplingConfig(30, temperature=1.0)]
    texts = [""] * 3
    for step in RowsStream(fluent_model, ["the cat", "a", "dog ran "], configs):
        texts = [text + piece for text, piece in zip(texts, step)]
    assert "the cat" + texts[0] == alone


@pytest.mark.parametrize("by_prefill", [False, True], ids=["recomputing loop", "recomputed by prefill"])
def test_log_probabilities_agree_with_a_full_forward_pass(fluent_model, by_prefill):
    # Past the window's end (block 16): its recomputing steps give them too.
    config = SamplingConfig(temperature=0.8, seed=4)
    engine = Engine(fluent_model, recompute_by_prefill=by_prefill)
    prompt = ids_of(fluent_model, "the cat ")
    drawn = engine.admit([prompt], [config], logprobs=True)
    (row,) = drawn
    pieces = [drawn[row]] + [engine.step(6, logprobs=True)[row] for _ in range(2)]
    ids = list(prompt)
    for piece in pieces:
        for token, logprob, top_ids, top_values in zip(piece.ids, piece.logprobs, piece.top_ids, piece.top_logprobs):
            logits = last_logits(fluent_model, [ids[-fluent_model.config.block_size:]])[0].astype("float64")
            expected = logits - np.logaddexp.reduce(logits)
            assert logprob == pytest.approx(expected[token], abs=1e-3)
            np.testing.assert_allclose(top_values, np.sort(expected)[::-1][:5], atol=1e-3)
            assert all(expected[i] >= np.sort(expected)[::-1][4] - TIE for i in top_ids)
            ids.append(int(token))


@pytest.mark.slow
def test_cached_text_is_recomputed_text_as_the_cache_grows_and_is_cut(tokenizer):
    keras.utils.set_random_seed(3)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=160,
                        tokenizer=tokenizer)
    config = SamplingConfig(temperature=1.0, seed=1)
    rows = [ids_of(model, "the cat"), ids_of(model, "the cat sat on the mat " * 3)]

    def decode(**options):
        engine = Engine(model, 2, **options)
        drawn = engine.admit(rows, [config.replace(seed=1), config.replace(seed=2)])
        return engine_tokens(engine, drawn, list(drawn), 70)

    # Rows of 7 and 69 tokens (a prefill of 128 columns) share a cache as long as the longer needs: 128, then
    # 160 slots.
    short = decode(short_caches=True)
    assert short == decode(use_cache=False) == decode() == decode(compiled_prefill=True)
    # Bound to reach 139 positions: 160 slots from the first step; to reach 80, 128 slots, then 160 as the
    # longer row goes past it.
    assert short == decode(reach=139) == decode(reach=80)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.skipif(keras.backend.backend() == "torch", reason="torch compiles nothing")
@NEEDS_THE_PRIVATE_LAYER
def test_a_second_process_traces_nothing_on_a_warm_cache_and_survives_a_damaged_entry(tmp_path, tiny_model):
    gptlite.save(tiny_model, tmp_path / "model.keras")
    # A model of another shape, for the last process: it finds none of the first model's programs.
    keras.utils.set_random_seed(0)
    other = gptlite.GPT(vocab_size=tiny_model.config.vocab_size, n_layer=1, n_head=2, n_embd=8, block_size=16,
                        tokenizer=tiny_model.tokenizer)
    other.build((None, 16))
    gptlite.save(other, tmp_path / "other.keras")
    # Each model named on its command line in turn: a line of its text and what it traced and loaded.
    script = ("import json, sys, gptlite\n"
              "gptlite.compile_cache.use()\n"
              "from gptlite.decode.programs import programs_for\n"
              "for path in sys.argv[1:]:\n"
              "    m = gptlite.load(path); text = gptlite.generate(m, 'the', 20, seed=3)\n"
              "    p = programs_for(m); print(json.dumps([text, p.traces, p.loads]))")
    cache = tmp_path / "cache"
    environment = dict(os.environ, GPTLITE_COMPILE_CACHE=str(cache))
    runs = []
    for damage, models in ((False, ["model"]), (False, ["model"]), (True, ["model", "other"])):
        if damage:
            for entry in cache.rglob("*"):
                if entry.is_file():
                    entry.write_bytes(entry.read_bytes()[:100])
        result = run_python("-c", script, *(str(tmp_path / f"{name}.keras") for name in models), env=environment)
        assert result.returncode == 0, result.stderr[-2000:]
        entries = sorted(path.name for path in cache.rglob("*") if path.is_file() and path.name != "checked.json")
        runs += [(*json.loads(line), entries) for line in result.stdout.splitlines()[-len(models):]]
    first, warm, damaged, another = runs
    assert first[1] > 0 and first[2] == 0 and any(name.endswith(".program") for name in first[3])
    # The second process traced nothing: it loaded every program, and compiled nothing new (no new entry).
    assert warm == (first[0], 0, first[1], first[3])
    # Every entry cut short: each is traced and compiled again, and writes the same text.
    assert damaged[:3] == (first[0], first[1], 0)
    # The model of another shape, after it in the same process, traced and compiled its own, beside them.
    assert another[1] > 0 and set(another[3]) > set(first[3])


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a GPT's prefill is a plain graph on TensorFlow only")
def test_a_process_s_third_prefill_of_one_shape_compiles_it_aside_and_the_later_ones_run_it(fluent_model, monkeypatch):
    import threading

    from gptlite.decode.compiled import Compiled

    # A model of its own: its prefills are counted from its first.
    model = gptlite.GPT(config=fluent_model.config, tokenizer=fluent_model.tokenizer)
    model.build((None, fluent_model.config.block_size))
    model.set_weights(fluent_model.get_weights())
    prefills, call = [], Compiled.__call__
    monkeypatch.setattr(Compiled, "__call__", lambda self, *args: (
        prefills.append(self.xla) if self.name[0] == "prefill" else None, call(self, *args))[1])

    def decode():
        text = gptlite.generate(model, "the cat", max_new_tokens=20, temperature=0)
        assert_greedy(model, "the cat", text)
        return text

    texts = [decode() for _ in range(3)]
    assert prefills == [False, False, False]  # two plain graphs, and the third while its twin compiles aside
    for thread in threading.enumerate():
        if thread.name.startswith("gptlite-prepare") and "prefill" in thread.name:
            thread.join()
    texts += [decode(), decode()]
    assert prefills == [False, False, False, True, True]
    assert len(set(texts)) == 1
    # Another shape of prompt counts on its own: its first prefill is a graph again.
    gptlite.generate(model, "the cat sat on the mat", max_new_tokens=5, temperature=0)
    assert prefills[-1] is False
