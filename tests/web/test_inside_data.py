"""The Inside view's data functions (page/inside_data.js), run under Node on a Python trace: the rows that follow
each visible token through a head, the head's matrix, the window the writer read, the heads a link knocks out and
the link itself. Skipped where Node is missing."""

import json
import pathlib
import shutil
import subprocess
import urllib.parse

import keras
import numpy as np
import pytest

import gptlite
from gptlite.web import export

MODULE = (pathlib.Path(export.__file__).parent / "page" / "inside_data.js").as_uri()
pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")


def node(body, **given):
    """What `body` (a module's text, `data` the module, each of `given` a constant) prints as JSON."""
    script = "".join(f"const {name} = {json.dumps(value)};\n" for name, value in given.items())
    script = f'import * as data from "{MODULE}";\n{script}{body}'
    done = subprocess.run(["node", "--input-type=module"], input=script, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def grouped_model(tokenizer):
    """Rotary positions, QK-norm and grouped-query attention: the rows' vectors are the rotated, normed, shared ones."""
    keras.utils.set_random_seed(3)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                        block_size=16, position="rotary", qk_norm=True, tokenizer=tokenizer)
    model.build((None, 16))
    return model


def test_rows_follow_each_visible_token_from_its_key_to_what_it_gives(grouped_model):
    trace = gptlite.trace(grouped_model, list(range(3, 15)))
    layer, head, token = 1, 3, 9
    rows, matrix = node("const trace = data.unpacked(packed);\n"
                        "console.log(JSON.stringify([data.attentionRows(trace, 1, 3, 9), "
                        "data.attentionMatrix(trace, 1, 3)]));", packed=trace.to_json(packed=True))
    steps = trace.layers[layer]
    query = steps["query_rotated"][head, token].astype(np.float64)
    keys = steps["key_rotated"][head // 2, :token + 1].astype(np.float64)  # two query heads to a key head
    values = steps["value"][head // 2, :token + 1].astype(np.float64)
    weights = steps["attention"][head, token, :token + 1].astype(np.float64)
    assert [row["position"] for row in rows] == list(range(token + 1))
    assert [row["id"] for row in rows] == trace.ids[:token + 1].tolist()
    found = {name: np.array([row[name] for row in rows]) for name in rows[0]}
    np.testing.assert_allclose(found["product"], steps["products"][head, token, :token + 1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(found["product"], keys @ query, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(found["key_length"], np.linalg.norm(keys, axis=1), rtol=1e-5)
    np.testing.assert_allclose(found["query_length"] * found["key_length"] * found["cosine"], found["product"],
                               rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(found["cosine"]) <= 1 + 1e-6)
    np.testing.assert_allclose(found["scaled"], found["product"] / np.sqrt(grouped_model.config.head_size), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_array_equal(found["masked"], found["scaled"])
    np.testing.assert_allclose(found["exponent"] / found["exponent"].sum(), weights, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(found["weight"], weights, rtol=0, atol=1e-7)
    np.testing.assert_allclose(found["contribution"], weights * np.linalg.norm(values, axis=1), rtol=1e-5, atol=1e-7)
    matrix = np.array(matrix)
    np.testing.assert_allclose(matrix, steps["attention"][head], rtol=0, atol=1e-7)
    assert np.all(matrix[np.triu_indices(len(trace.ids), 1)] == 0)


def test_the_worked_sums_are_the_models_softmax_weighted_values_and_norm(grouped_model):
    trace = gptlite.trace(grouped_model, list(range(3, 15)), ablate=[(1, 2)])
    softmax, values, knocked_out, norms = node(
        "const trace = data.unpacked(packed);\n"
        "const x = Array.from(trace.layers[0].input.data.subarray(0, 32));\n"
        "console.log(JSON.stringify([data.softmaxTerm(trace, 1, 3, 9, 4), data.weightedFirst(trace, 1, 3, 9), "
        "data.weightedFirst(trace, 1, 2, 9), [data.normalised(x, 'layer', 1e-5), data.normalised(x, 'rms', 1e-5)]]));",
        packed=trace.to_json(packed=True))
    steps = trace.layers[1]
    scores = steps["scores"][3, 9, :10].astype(np.float64)
    assert softmax["largest"] == pytest.approx(scores.max(), abs=1e-6)
    assert softmax["total"] == pytest.approx(np.exp(scores - scores.max()).sum(), rel=1e-6)
    assert softmax["exponent"] / softmax["total"] == pytest.approx(steps["attention"][3, 9, 4], abs=1e-6)
    weights, first_values = steps["attention"][3, 9, :10], steps["value"][1, :10, 0]  # query head 3 reads kv head 1
    np.testing.assert_allclose(values["terms"], np.stack([weights, first_values], axis=1), rtol=0, atol=1e-7)
    assert values["sum"] == pytest.approx(steps["heads"][3, 9, 0], abs=1e-5)
    assert values["model"] == pytest.approx(steps["heads"][3, 9, 0], abs=1e-7)
    assert knocked_out["model"] == 0 and knocked_out["sum"] != 0  # the knocked-out head's scale is 0
    x = trace.layers[0]["input"][0].astype(np.float64)
    layer_norm, rms_norm = norms
    assert layer_norm["first"] == pytest.approx((x[0] - x.mean()) / np.sqrt(x.var() + 1e-5), rel=1e-5)
    assert rms_norm["first"] == pytest.approx(x[0] / np.sqrt((x ** 2).mean() + 1e-5), rel=1e-5)


@pytest.mark.parametrize("position,count,expected", [
    (5, 10, (0, 10)),     # a text within the block: one window
    (15, 16, (0, 16)),
    (15, 40, (0, 16)),    # the first window's positions: the writer read from the text's start
    (16, 40, (1, 17)),    # past it: the block_size tokens up to the position
    (39, 40, (24, 40)),
])
def test_the_writers_window_for_a_position_ends_at_it_past_the_first(position, count, expected):
    window = node("console.log(JSON.stringify(data.writerWindow(position, count, 16)));", position=position,
                  count=count)
    assert (window["start"], window["end"]) == expected
    start, end = expected
    assert end - start <= 16 and start <= position < end


def test_a_links_heads_to_knock_out_are_read_and_its_mistakes_said():
    shape = {"n_layer": 2, "n_head": 4}
    read = node("console.log(JSON.stringify([data.ablatedHeads(text, shape), data.ablatedHeads('', shape), "
                "Array.from(data.headScale([[1, 2], [0, 0]], shape))]));",
                text="1.2, 0.3,1.2,2.0,0.4,x,1.-1", shape=shape)
    asked, empty, scale = read
    assert asked["heads"] == [[0, 3], [1, 2]]  # in order, each once
    notes = " | ".join(asked["notes"])
    assert "no head 2.0" in notes and "no head 0.4" in notes and '"x" is not a head' in notes
    assert '"1.-1" is not a head' in notes and len(asked["notes"]) == 4
    assert empty == {"heads": [], "notes": []}
    assert scale == [0, 1, 1, 1, 1, 1, 0, 1]


def test_a_link_carries_the_writing_its_settings_and_the_view_and_reads_its_ids_back():
    query = node(
        "console.log(JSON.stringify([data.linkQuery(state), data.linkQuery({...state, readAgain: state.writtenIds}), "
        "data.linkedIds('4.7.1', 10), data.linkedIds('4.70', 10), data.linkedIds(null, 10)]));",
        state=dict(prompt="ROMEO:", written=" a rose", writtenIds=[4, 7, 1], readAgain=[4, 8],
                   settings=dict(temperature=0.5, top_k=None, seed=7),
                   view=dict(token=12, layer=1, head=0, step="softmax", ablated=[[0, 1], [1, 3]])))
    bpe, char, ids, wrong, none = query
    said = urllib.parse.parse_qs(bpe)
    assert said == {"prompt": ["ROMEO:"], "written": [" a rose"], "ids": ["4.7.1"], "temperature": ["0.5"],
                    "seed": ["7"], "token": ["12"], "layer": ["1"], "head": ["0"], "step": ["softmax"],
                    "ablate": ["0.1,1.3"]}
    assert "ids" not in urllib.parse.parse_qs(char)  # the text reads back as the ids written: it is enough
    assert ids == {"ids": [4, 7, 1]} and none == {"ids": None}
    assert "not token ids" in wrong["error"]


def test_head_scores_are_gptlite_heads_on_the_same_traces(grouped_model):
    ids = [int(i) for i in grouped_model.tokenizer.encode("the cat sat on the mat")][:14]
    report = gptlite.heads(grouped_model, ids, calibrate=False)
    text, probe = gptlite.trace(grouped_model, ids), gptlite.trace(grouped_model, report.probe)
    found = node("const [text, probe] = [data.unpacked(packedText), data.unpacked(packedProbe)];\n"
                 "console.log(JSON.stringify({...data.patternScores(text), induction: data.inductionScores(probe), "
                 "loss: data.textLoss(text)}));",
                 packedText=text.to_json(packed=True), packedProbe=probe.to_json(packed=True))
    for name in ("previous_token", "first_token", "current_token", "induction"):
        np.testing.assert_allclose(found[name], getattr(report, name), rtol=0, atol=1e-5, err_msg=name)
    assert abs(found["loss"] - report.loss) <= 1e-4 * report.loss
