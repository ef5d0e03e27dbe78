// The Inside view's data: what it reads of a trace and of a link, as plain functions of plain objects. Nothing here
// touches the page, so each runs under Node too (tests/web/test_inside_data.py): the view (inside.js) draws what
// these compute, and its contract (window.gptliteInside) is made of them.

// The sub-array of `array` ({dims, data}) at the leading `index`: a vector (or a matrix's row, ...).
export function at(array, ...index) {
  let offset = 0;
  let size = array.data.length;
  index.forEach((i, axis) => {
    size /= array.dims[axis];
    offset += i * size;
  });
  return array.data.subarray ? array.data.subarray(offset, offset + size) : array.data.slice(offset, offset + size);
}

// A trace whose arrays came packed (`Trace.to_json(packed=True)`: float32 bytes in base64), with Float32Arrays.
export function unpacked(trace) {
  const unpack = (array) => {
    if (!array.float32) return array;
    const bytes = Uint8Array.from(atob(array.float32), (c) => c.charCodeAt(0));
    return { dims: array.dims, data: new Float32Array(bytes.buffer) };
  };
  const each = (layers) =>
    layers.map((layer) => Object.fromEntries(Object.entries(layer).map(([k, v]) => [k, unpack(v)])));
  const steps = Object.fromEntries(Object.entries(trace.steps).map(([k, v]) => [k, unpack(v)]));
  const encoder = trace.encoder_layers ? { encoder_layers: each(trace.encoder_layers) } : {};
  return { ...trace, steps, layers: each(trace.layers), ...encoder };
}

// --- attention, one head at a time

const vectorLength = (vector) => Math.sqrt(vector.reduce((sum, v) => sum + v * v, 0));

// The query and key vectors a head's scores are products of (`part` "" for self-attention, "cross_" for
// cross-attention): after QK-norm and the rotary turn where the model has them. Keys and values are the query
// head's group's under grouped-query attention.
function queryAndKeys(steps, head, part = "") {
  const query = steps[`${part}query_rotated`] ?? steps[`${part}query_normed`] ?? steps[`${part}query`];
  const key = steps[`${part}key_rotated`] ?? steps[`${part}key_normed`] ?? steps[`${part}key`];
  const group = head / (query.dims[0] / key.dims[0]) | 0;
  return { query, key, group };
}

// One row per position the query at `token` may see, following it through the head `head` of block `layer`: in
// self-attention the text's positions 0 to token, in cross-attention (`part` "cross_") every position of the
// source. Each row: its position and id; q·k (`product`); |q|, |k| and cos θ, whose product q·k is; q·k / √d
// (`scaled`); the score after the causal mask (`masked`: equal to `scaled`, the visible positions being the ones
// shown); the softmax weight; e^(scaled − max) (`exponent`); and `contribution`, the length of weight × value (a
// vector of the head's width).
export function attentionRows(trace, layer, head, token, part = "") {
  const steps = trace.layers[layer];
  const { query, key, group } = queryAndKeys(steps, head, part);
  const ids = part ? trace.source_ids : trace.ids;
  const count = part ? ids.length : token + 1;
  const q = at(query, head, token);
  const qLength = vectorLength(q);
  const scaled = at(steps[`${part}scores`], head, token);
  const products = at(steps[`${part}products`], head, token);
  const weights = at(steps[`${part}attention`], head, token);
  let largest = -Infinity;
  for (let j = 0; j < count; j++) largest = Math.max(largest, scaled[j]);
  return Array.from({ length: count }, (_, j) => {
    const kLength = vectorLength(at(key, group, j));
    return {
      position: j,
      id: Number(ids[j]),
      product: products[j],
      query_length: qLength,
      key_length: kLength,
      cosine: qLength && kLength ? products[j] / (qLength * kLength) : 0,
      scaled: scaled[j],
      masked: scaled[j],
      exponent: Math.exp(scaled[j] - largest),
      weight: weights[j],
      contribution: weights[j] * vectorLength(at(steps[`${part}value`], group, j)),
    };
  });
}

// How the softmax makes the weight that the query at `token` (head `head`, block `layer`) gives position `j`: e^(its
// score − the largest visible score) over the sum of every visible position's: {score, largest, exponent, total,
// weight} (the weight, the model's).
export function softmaxTerm(trace, layer, head, token, j) {
  const scores = at(trace.layers[layer].scores, head, token);
  let largest = -Infinity;
  for (let i = 0; i <= token; i++) largest = Math.max(largest, scores[i]);
  let total = 0;
  for (let i = 0; i <= token; i++) total += Math.exp(scores[i] - largest);
  return { score: scores[j], largest, exponent: Math.exp(scores[j] - largest), total,
    weight: at(trace.layers[layer].attention, head, token)[j] };
}

// The first entry of head `head`'s output at `token`, as Σ weight_j × value_j[0] over the visible positions:
// {terms: [[weight, value]], sum, model} (the model's own entry, which a knocked-out head's scale makes 0).
export function weightedFirst(trace, layer, head, token) {
  const steps = trace.layers[layer];
  const { group } = queryAndKeys(steps, head);
  const weights = at(steps.attention, head, token);
  const terms = Array.from({ length: token + 1 }, (_, j) => [weights[j], at(steps.value, group, j)[0]]);
  return { terms, sum: terms.reduce((total, [w, v]) => total + w * v, 0), model: at(steps.heads, head, token)[0] };
}

// What a norm of `kind` ("layer": LayerNorm, "rms": RMSNorm) computes of vector x before its learned scale (and
// shift): {mean (LayerNorm's), spread (√(variance + ε), or √(mean of x² + ε)), first: x's first entry normalised}.
export function normalised(x, kind, epsilon) {
  const count = x.length;
  const mean = kind === "layer" ? x.reduce((total, v) => total + v, 0) / count : 0;
  const spread = Math.sqrt(x.reduce((total, v) => total + (v - mean) ** 2, 0) / count + epsilon);
  return { mean, spread, first: (x[0] - mean) / spread };
}

// The head's T x T attention (softmax weights; the masked entries, above the diagonal, exactly 0), as rows.
export function attentionMatrix(trace, layer, head) {
  const weights = trace.layers[layer].attention;
  return Array.from({ length: weights.dims[1] }, (_, row) => Array.from(at(weights, head, row)));
}

// --- a long text

// The window [start, end) of a text of `count` tokens whose trace shows position `position` as the writer read it
// when it wrote the token after it: the `blockSize` tokens up to it. A text no longer than blockSize is one window;
// past the first window, the window ends at the position itself (each earlier position there sees fewer tokens
// than the writer did).
export function writerWindow(position, count, blockSize) {
  if (count <= blockSize || position < blockSize) return { start: 0, end: Math.min(count, blockSize) };
  return { start: position + 1 - blockSize, end: position + 1 };
}

// --- knocking heads out

// The heads a link names to knock out (`ablate=1.2,0.3`: layer.head pairs) in a model of `shape`: {heads: [[layer,
// head], ...] (in order, each once), notes: a line for each pair that is malformed or names no head of the model}.
export function ablatedHeads(text, shape) {
  const heads = [];
  const notes = [];
  if (text == null || text === "") return { heads, notes };
  for (const pair of String(text).split(",")) {
    const match = /^\s*(\d+)\.(\d+)\s*$/.exec(pair);
    if (!match) {
      notes.push(`${JSON.stringify(pair)} is not a head to knock out (layer.head, e.g. 0.1): left in`);
      continue;
    }
    const [layer, head] = [Number(match[1]), Number(match[2])];
    if (layer >= shape.n_layer || head >= shape.n_head) {
      notes.push(`there is no head ${layer}.${head} (layers 0 to ${shape.n_layer - 1}, heads 0 to ${shape.n_head - 1})`);
    } else if (!heads.some(([l, h]) => l === layer && h === head)) heads.push([layer, head]);
  }
  heads.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  return { heads, notes };
}

// The knocked-out heads as a link writes them: "1.2,0.3".
export const ablatedText = (heads) => heads.map(([layer, head]) => `${layer}.${head}`).join(",");

// The inside graph's head-scale input for `heads` knocked out: a Float32Array (layers x heads) of ones, zero there.
export function headScale(heads, shape) {
  const scale = new Float32Array(shape.n_layer * shape.n_head).fill(1);
  for (const [layer, head] of heads) scale[layer * shape.n_head + head] = 0;
  return scale;
}

// --- the link

// What a link says of the view: the token (its position in the whole text), the layer, the head, the step and the
// heads knocked out.
export const VIEW_FIELDS = ["token", "layer", "head", "step", "ablate"];

// The address's query for a state: what was written (`prompt`, and `written`, the text the model wrote; `ids`, the
// ids it wrote, only where reading that text again gives other ids, as a BPE tokenizer may), every setting the
// writing used (its seed included), then the view's state. Nothing of an earlier state is kept: a new writing makes
// a new link.
export function linkQuery({ prompt, written, writtenIds, readAgain, settings, view }) {
  const query = new URLSearchParams();
  if (prompt != null) query.set("prompt", prompt);
  if (written != null) {
    query.set("written", written);
    if (writtenIds && readAgain && !sameIds(writtenIds, readAgain)) query.set("ids", writtenIds.join("."));
  }
  for (const [name, value] of Object.entries(settings ?? {})) if (value != null) query.set(name, String(value));
  for (const name of VIEW_FIELDS) {
    const value = name === "ablate" ? ablatedText(view?.ablated ?? []) : view?.[name];
    if (value != null && value !== "") query.set(name, String(value));
  }
  return query.toString();
}

const sameIds = (a, b) => a.length === b.length && a.every((id, i) => Number(id) === Number(b[i]));

// The ids a link says were written: its `ids` (dot-separated) where it has them, else null (read its `written`
// text); {error} for ids that are not token ids of a vocabulary of `vocabSize`.
export function linkedIds(text, vocabSize) {
  if (text == null || text === "") return { ids: null };
  const ids = String(text).split(".").map(Number);
  if (!ids.every((id) => Number.isInteger(id) && id >= 0 && id < vocabSize)) {
    return { error: `the link's ids are not token ids of this model (0 to ${vocabSize - 1}): read its text instead` };
  }
  return { ids };
}

// --- what each head does (gptlite.heads, inside/heads.py)

// Of all of each head's attention in a trace, the share where a pattern `on(t, s)` says (query t, key s), as
// TransformerLens's head detector scores it: [layer][head].
function shares(trace, on) {
  return trace.layers.map(({ attention }) => {
    const [heads, count] = attention.dims;
    return Array.from({ length: heads }, (_, head) => {
      let total = 0;
      let chosen = 0;
      for (let t = 0; t < count; t++) {
        const row = at(attention, head, t);
        for (let s = 0; s <= t; s++) {
          total += row[s];
          if (on(t, s)) chosen += row[s];
        }
      }
      return chosen / total;
    });
  });
}

// Where each head looks over the text: its share on the token before, on the first token, on the token itself.
export function patternScores(trace) {
  return {
    previous_token: shares(trace, (t, s) => s === t - 1),
    first_token: shares(trace, (t, s) => s === 0),
    current_token: shares(trace, (t, s) => s === t),
  };
}

// Each head's share, over the probe (random tokens repeated), on the token just after an earlier one of the same
// token as the query's: the induction score.
export function inductionScores(trace) {
  const ids = Array.from(trace.ids, Number);
  return shares(trace, (t, s) => s >= 1 && s - 1 < t && ids[s - 1] === ids[t]);
}

// The text's next-token loss in nats a token (the mean over its positions but the last), from a trace's logits.
export function textLoss(trace) {
  const ids = Array.from(trace.ids, Number);
  let total = 0;
  for (let t = 0; t < ids.length - 1; t++) {
    const logits = at(trace.steps.logits, t);
    let largest = -Infinity;
    for (const v of logits) largest = Math.max(largest, v);
    let sum = 0;
    for (const v of logits) sum += Math.exp(v - largest);
    total += largest + Math.log(sum) - logits[ids[t + 1]];
  }
  return total / (ids.length - 1);
}

// Every head scored as gptlite.heads scores it, on the text `ids` and the probe's ids `probe`; `run(ids, heads)`, a
// promise of the trace of `ids` with `heads` ([layer, head] pairs) knocked out. {previous_token, first_token,
// current_token, induction, ablation (the loss with the head knocked out, less `loss`), loss}, each [layer][head].
export async function headScores(ids, probe, run) {
  const trace = await run(ids, []);
  const { n_layer: layers, n_head: heads } = trace.shape;
  const loss = textLoss(trace);
  const induction = inductionScores(await run(probe, []));
  const ablation = [];
  for (let layer = 0; layer < layers; layer++) {
    const row = [];
    for (let head = 0; head < heads; head++) row.push(textLoss(await run(ids, [[layer, head]])) - loss);
    ablation.push(row);
  }
  return { ...patternScores(trace), induction, ablation, loss };
}
