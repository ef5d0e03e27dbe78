// gptlite in a web page: the sampler and the decoding loop, as gptlite writes text in Python (the tokenizers are
// tokenizers.js's).
//
// The model is `model.onnx`, one decoding step (gptlite/web/onnx_graph.py): the new tokens and the cache of
// the tokens before them in, the next token's logits, the cache and the attention weights out. Nothing here
// knows the page: page.js draws it; Node imports this file to check the sampler against Python's.

// --- sampling: gptlite's sampler (decode/sampling.py), its noise a hash of the seed and the token's index

function shifted(x, bits) { return x >>> bits; }

function mixed(x) {
  // lowbias32, in int32 arithmetic as Keras computes it.
  x = Math.imul(x ^ shifted(x, 16), 0x7feb352d);
  x = Math.imul(x ^ shifted(x, 15), -2073254261);
  return x ^ shifted(x, 16);
}

const GOLDEN = -1640531527;

// Uniform noise in (0, 1), one number per vocabulary entry, for token `index` of the row seeded `seed`.
export function uniformNoise(seed, index, vocabularySize) {
  const key = mixed(mixed(seed | 0) ^ (index | 0));
  const noise = new Float32Array(vocabularySize);
  for (let v = 0; v < vocabularySize; v++) {
    const bits = mixed(key ^ Math.imul(v, GOLDEN));
    noise[v] = Math.fround((bits >>> 8) + 0.5) * (1 / 16777216);
  }
  return noise;
}

function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

// The logits (V,) with the repetition penalty on the tokens `seen` in the window, as gptlite's sampler applies it.
function penalised(logits, settings, seen) {
  const values = Float32Array.from(logits);
  const penalty = settings.repetition_penalty ?? 1;
  if (penalty !== 1 && seen) {
    for (const id of seen) values[id] = values[id] > 0 ? values[id] / penalty : values[id] * penalty;
  }
  return values;
}

// The draw's scores (V,) from penalised logits, as gptlite's `_kept_scores`: divided by the temperature, the
// tokens top_k, top_p and min_p leave out at -1e9.
function keptScores(values, settings) {
  const vocabularySize = values.length;
  const temperature = Math.max(settings.temperature, 1e-6);
  const scaled = values.map((v) => v / temperature);
  const topK = settings.top_k == null ? vocabularySize : Math.min(settings.top_k, vocabularySize);
  const topP = settings.top_p ?? 1;
  const minP = settings.min_p ?? 0;
  if (!(topK < vocabularySize || topP < 1 || minP > 0)) return scaled;
  const descending = Float32Array.from(scaled).sort().reverse();
  const kth = descending[Math.max(1, Math.min(topK, vocabularySize)) - 1];
  let nucleusFloor = Infinity;
  if (topP >= 1) nucleusFloor = descending[vocabularySize - 1];
  else {
    const top = descending[0];
    let total = 0;
    for (const v of descending) total += Math.exp(v - top);
    let above = 0;
    for (const v of descending) {
      if (above >= topP) break;
      nucleusFloor = v;
      above += Math.exp(v - top) / total;
    }
  }
  const minPFloor = minP > 0 ? descending[0] + Math.log(Math.max(minP, 1e-30)) : -Infinity;
  const floor = Math.max(kth, nucleusFloor, minPFloor);
  return scaled.map((v) => (v >= floor ? v : -1e9));
}

// The next token from float logits (V,), as gptlite's `sample_next_token` draws it for one row: repetition penalty
// on the tokens `seen` in the window, then greedy at temperature 0, else the arg-max of the kept scaled logits plus
// Gumbel noise (top_k, top_p and min_p filter what is kept).
export function sampleNext(logits, settings, noise, seen) {
  const values = penalised(logits, settings, seen);
  if (settings.temperature === 0) return argmax(values);
  const kept = keptScores(values, settings);
  let best = 0;
  let bestValue = -Infinity;
  for (let v = 0; v < values.length; v++) {
    const value = kept[v] - Math.log(-Math.log(noise[v]));
    if (value > bestValue) { bestValue = value; best = v; }
  }
  return best;
}

// The probabilities (V,) the draw picks from, after the settings, as gptlite's `next_token_probabilities`: all on
// the likeliest token at temperature 0, else the softmax of the kept scores (a left-out token's is 0).
export function nextTokenProbabilities(logits, settings, seen) {
  const values = penalised(logits, settings, seen);
  const probabilities = new Float32Array(values.length);
  if (settings.temperature === 0) { probabilities[argmax(values)] = 1; return probabilities; }
  const kept = keptScores(values, settings);
  let top = -Infinity;
  for (const v of kept) if (v > top) top = v;
  let total = 0;
  for (let v = 0; v < kept.length; v++) { probabilities[v] = Math.exp(kept[v] - top); total += probabilities[v]; }
  for (let v = 0; v < kept.length; v++) probabilities[v] /= total;
  return probabilities;
}

// A setting's box read as config.json declares the setting (`sampling`, from SamplingConfig's fields): {value}, or
// {error} saying what it must be. An empty box is null where the setting's default is none (top_k: all).
export function settingOf(setting, text) {
  const raw = text.trim();
  if (raw === "" && setting.default === null) return { value: null };
  const value = Number(raw);
  const above = setting.least == null || (setting.least_refused ? value > setting.least : value >= setting.least);
  if (raw === "" || !Number.isFinite(value) || (setting.whole && !Number.isInteger(value)) || !above
      || (setting.most != null && value > setting.most)) {
    return { error: `${setting.name} must be ${setting.says}; got ${raw || "nothing"}` };
  }
  return { value };
}

// A row's seed as the sampler reads it: a whole number taken modulo 2^31, as `SamplingConfig.for_rows` takes it.
export function rowSeed(seed) {
  return ((seed ?? 0) % 2147483648 + 2147483648) % 2147483648;
}

// --- decoding: the prompt in one call, then one call a token over the cache; past the window, the last
// block_size tokens again, as gptlite's `generate` does with its default slide of one token

export class Writer {
  // ort: onnxruntime-web's module; session: an InferenceSession of model.onnx; config: the export's config.json.
  constructor(ort, session, config) {
    this.ort = ort;
    this.session = session;
    this.config = config;
  }

  emptyCache() {
    const { n_layer: layers, kv_heads: heads, head_size: size } = this.config;
    const cache = {};
    for (let i = 0; i < layers; i++) {
      for (const part of ["key", "value"]) {
        cache[`past_${part}_${i}`] = new this.ort.Tensor("float32", new Float32Array(0), [1, heads, 0, size]);
      }
    }
    return cache;
  }

  async step(ids, cache) {
    const feeds = { input_ids: new this.ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length]),
      ...cache };
    const out = await this.session.run(feeds);
    const next = {};
    for (const name of Object.keys(cache)) next[name] = out[name.replace("past_", "present_")];
    return { logits: out.logits.data, cache: next, attention: out.attention };
  }

  // V8 first runs WebAssembly as its quick baseline compiler wrote it and optimises a function only once it has
  // run a while: until then a step at the laptop preset's shape took 3-4x as long (1.1-1.7 ms, then 0.33-0.39;
  // Node 20, onnxruntime-web 1.30). While the page waits for its reader, it runs the model on nothing for up to
  // `seconds`, in calls of both kinds a writing makes (a window read whole, then a token over the cache), so the
  // first writing runs optimised code. `between()` runs after each call (the page yields to the browser there);
  // `shouldStop()` ends it between calls.
  async warm(seconds, between, shouldStop) {
    const until = performance.now() + seconds * 1000;
    const window = Math.min(this.config.block_size, 32);
    while (performance.now() < until && !shouldStop()) {
      let { cache } = await this.step(new Array(window).fill(0), this.emptyCache());
      for (let at = window; at < this.config.block_size && performance.now() < until && !shouldStop(); at++) {
        await between();
        ({ cache } = await this.step([0], cache));
      }
      await between();
    }
  }

  // Yields {token, logits, attention, windowStart} for each new token; `shouldStop()` ends it between tokens.
  async *write(promptIds, settings, shouldStop = () => false) {
    const block = this.config.block_size;
    const context = [...promptIds];
    let windowStart = Math.max(0, context.length - block);
    let { logits, cache, attention } = await this.step(context.slice(windowStart), this.emptyCache());
    const seed = rowSeed(settings.seed);
    const stops = new Set(this.config.stop_ids ?? []);
    for (let produced = 0; produced < settings.max_new_tokens; produced++) {
      const noise = settings.temperature === 0 ? null : uniformNoise(seed, produced, logits.length);
      const seen = settings.repetition_penalty !== 1 ? new Set(context.slice(windowStart)) : null;
      const token = sampleNext(logits, settings, noise, seen);
      if (stops.has(token)) return;
      yield { token, logits, attention, windowStart };
      context.push(token);
      if (produced + 1 >= settings.max_new_tokens || shouldStop()) return;
      if (context.length <= block) ({ logits, cache, attention } = await this.step([token], cache));
      else {
        windowStart = context.length - block;
        ({ logits, cache, attention } = await this.step(context.slice(windowStart), this.emptyCache()));
      }
    }
  }
}

// A Seq2Seq's target for a source, as gptlite's `generate_target` writes it: from the start token, one token at a
// time, each drawn from the decoder's logits after the tokens so far; the end token (or the window) ends it. Each
// step runs `inside.onnx` (whose every output a Seq2Seq's page has anyway) for its logits alone.
export class TargetWriter {
  constructor(ort, session, config) {
    this.ort = ort;
    this.session = session;
    this.config = config;
  }

  async warm() {}  // one graph, run whole each step: nothing that runs the better for having run before

  async logitsAfter(sourceIds, ids) {
    const out = await this.session.run(insideFeeds(this.ort, this.session, this.config, ids, sourceIds), ["logits"]);
    const vocabularySize = this.config.vocab_size;
    return out.logits.data.subarray((ids.length - 1) * vocabularySize, ids.length * vocabularySize);
  }

  // Yields {token} for each new token of the target; `shouldStop()` ends it between tokens.
  async *write(sourceIds, settings, shouldStop = () => false) {
    const ids = [this.config.start_id];
    const seed = rowSeed(settings.seed);
    const most = Math.min(settings.max_new_tokens, this.config.block_size - 1);
    for (let produced = 0; produced < most; produced++) {
      const logits = await this.logitsAfter(sourceIds, ids);
      const noise = settings.temperature === 0 ? null : uniformNoise(seed, produced, logits.length);
      const seen = settings.repetition_penalty !== 1 ? new Set(ids) : null;
      const token = sampleNext(logits, settings, noise, seen);
      if (token === this.config.end_id) return;
      yield { token };
      ids.push(token);
      if (shouldStop()) return;
    }
  }
}

// --- looking inside: `inside.onnx` (gptlite/web/onnx_graph.py), every step of the forward pass over a text

// What `inside.onnx` (an InferenceSession, `session`) is given for the tokens `ids` (and a Seq2Seq's `sourceIds`):
// the ids, and each head-scale input the graph takes, from `scales` (by its name: a Float32Array, layers x heads)
// or 1 for every head.
function insideFeeds(ort, session, config, ids, sourceIds = null, scales = {}) {
  const tensor = (values) => new ort.Tensor("int64", BigInt64Array.from(values, BigInt), [1, values.length]);
  const feeds = { input_ids: tensor(ids), ...(sourceIds ? { source_ids: tensor(sourceIds) } : {}) };
  const { n_layer: layers, n_head: heads } = config;
  for (const name of session.inputNames.filter((input) => input.endsWith("head_scale")))
    feeds[name] = new ort.Tensor("float32", scales[name] ?? new Float32Array(layers * heads).fill(1), [layers, heads]);
  return feeds;
}

export class Explainer {
  // ort: onnxruntime-web's module; session: an InferenceSession of inside.onnx; config: the export's config.json.
  constructor(ort, session, config) {
    this.ort = ort;
    this.session = session;
    this.config = config;
  }

  // The trace of ids (their last block_size), as gptlite.trace gives it (Trace.to_json): {ids, window_start,
  // shape, steps: {name: {dims, data}}, layers: [{name: {dims, data}}]}, every number the graph's; a Seq2Seq's,
  // as gptlite.trace_target gives it, with the `sourceIds` it reads and its encoder_layers. `scales`: a
  // Float32Array (layers x heads) by each head-scale input the graph takes (head_scale, and a Seq2Seq's
  // cross_head_scale and encoder_head_scale) that scales each head's output: 1 for every head unless given there,
  // 0 knocking a head out.
  async trace(allIds, sourceIds = null, scales = {}) {
    const ids = allIds.slice(-this.config.block_size);
    const feeds = insideFeeds(this.ort, this.session, this.config, ids, sourceIds, scales);
    // The blocks' attention weights (config.inside.weight_steps, Python's) are the same every run: fetched the first
    // time, then kept.
    const weight = new Set(this.config.inside.weight_steps);
    const isWeight = (name) => weight.has(name.slice(name.indexOf(".") + 1));
    const out = this.weights
      ? { ...(await this.session.run(feeds, this.session.outputNames.filter((name) => !isWeight(name)))),
          ...this.weights }
      : await this.session.run(feeds);
    this.weights ??= Object.fromEntries(Object.entries(out).filter(([name]) => isWeight(name)));
    const steps = {};
    const layers = Array.from({ length: this.config.n_layer }, () => ({}));
    const encoderLayers = Array.from({ length: sourceIds ? this.config.n_layer : 0 }, () => ({}));
    for (const [name, tensor] of Object.entries(out)) {
      const data = tensor.type === "int64" ? Array.from(tensor.data, Number) : tensor.data;
      const array = { dims: tensor.dims.map(Number), data };
      const inLayer = /^(encoder_)?layer_(\d+)\.(.+)$/.exec(name);
      if (inLayer) (inLayer[1] ? encoderLayers : layers)[Number(inLayer[2])][inLayer[3]] = array;
      else steps[name] = array;
    }
    const trace = { ids, window_start: allIds.length - ids.length, shape: this.config.shape, steps, layers };
    return sourceIds ? { ...trace, source_ids: sourceIds, encoder_layers: encoderLayers } : trace;
  }
}

// The ids a prompt is read as: the tokenizer's start of text first, an empty prompt a new line (or the first id).
export function promptIds(tokenizer, config, prompt) {
  if (!prompt) {
    if (config.text_start_ids.length) return [...config.text_start_ids];
    return tokenizer.unknownCharacters("\n").length ? [0] : [tokenizer.encode("\n")[0]];
  }
  return [...config.text_start_ids, ...tokenizer.encode(prompt)];
}

// A conversation's text as the model's template renders it, from the pieces the export read off the template:
// messages [{role, content}] alternate user, assistant, ..., user.
export function chatText(chat, messages) {
  let text = chat.before;
  messages.forEach((message, index) => {
    if (index > 0) text += index % 2 ? chat.after_user : chat.after_answer;
    text += message.content;
  });
  return text + chat.answer_opens;
}
