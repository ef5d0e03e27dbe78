// The two models a page writes with, behind one interface: the model in this page (ModelHere, run by ONNX Runtime
// Web) and the model `gptlite serve` runs (ModelOnServer, through its API). page.js asks either the same things:
//   load()                                   the model made ready to write
//   asked(prompt, conversation, system)     what one writing reads, checked: {…} or {error}
//   write(asked, settings, stopping)         its text as it comes: {text, id?, cut?} (`cut`: the last characters
//                                            written are not the answer's: the end of a chat's turn, as text)
//   readAgain(text)                          the ids the tokenizer reads a text as (null on the server)
//   linked(prompt, written, idsText)         a link's writing: {asked, writtenIds} or {error}
//   inside(asked, writing)                   what the Inside view traces of a writing ({answer, ids?, conversation};
//                                            null: the prompt alone): {retrace(position, ablated), textIds?,
//                                            given(trace): the view's options for that trace}
import { chatText, Explainer, promptIds, TargetWriter, Writer } from "./gptlite.js";
import { headScale, headScores, linkedIds, writerWindow } from "./inside_data.js";
import { headsOnServer, keyBox, requestSettings, tracedOnServer, writtenOnServer } from "./server.js";
import { makeTokenizer } from "./tokenizers.js";

// How the graphs are opened: errors only (onnxruntime-web writes its warnings to the console, and a warning a step
// costs time), their weights read from the one file both name.
const SESSION = { executionProviders: ["wasm"], logSeverityLevel: 3,
  externalData: [{ path: "weights.bin", data: "weights.bin" }] };

export class ModelHere {
  constructor(config) {
    this.config = config;
    this.runsHere = true;
    this.film = null;  // a film's frames (film.json), where the page has one
    this.frame = null;  // the film's frame the Inside view traces with (null: the model that writes)
    this.explainers = new Map();  // frame -> its Explainer, each opened the first time it is asked to explain
  }

  // The Explainer of the inside graph of the film's `frame`, or of the model's own (null); opened once, however
  // many runs ask for it while it opens.
  explainerOf(frame) {
    if (!this.explainers.has(frame)) {
      const graph = frame === null ? "inside.onnx" : this.film.frames[frame].graph;
      const options = frame === null ? SESSION : { executionProviders: ["wasm"], logSeverityLevel: 3 };
      this.explainers.set(frame, ort.InferenceSession.create(graph, options)
        .then((session) => new Explainer(ort, session, this.config))
        .catch((failure) => { this.explainers.delete(frame); throw failure; }));  // asked again, tried again
    }
    return this.explainers.get(frame);
  }

  // Its tokenizer and graphs. A Seq2Seq's page (config.source) writes its targets with the inside graph itself,
  // which then explains them too; a GPT's opens the inside graph the first time it is asked to explain.
  async load() {
    this.tokenizer = makeTokenizer(await (await fetch("tokenizer.json")).json());
    ort.env.wasm.wasmPaths = new URL("ort/", document.baseURI).href;
    // Threads need a cross-origin isolated page, which a plain static host does not give: one thread then.
    ort.env.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
    const config = this.config;
    const session = await ort.InferenceSession.create(config.source ? "inside.onnx" : "model.onnx", SESSION);
    this.writer = config.source ? new TargetWriter(ort, session, config) : new Writer(ort, session, config);
    if (config.source) this.explainers.set(null, Promise.resolve(new Explainer(ort, session, config)));
  }

  // The model warmed while the page waits (Writer.warm), until `asked()` says a writing wants it.
  warm(seconds, breathe, asked) {
    return this.writer.warm(seconds, breathe, asked);
  }

  // The ids the model reads of what the reader wrote: a prompt, a conversation, or a Seq2Seq's source (1 to
  // block_size tokens, read whole).
  asked(prompt, conversation) {
    const { config, tokenizer } = this;
    const unknown = tokenizer.unknownCharacters(prompt);
    const what = config.source ? "source" : "prompt";
    if (unknown.length) {
      return { error: `the ${what} has characters the model never saw in training: ${JSON.stringify(unknown.join(""))}` };
    }
    if (config.source) {
      const ids = tokenizer.encode(prompt);
      if (ids.length < 1 || ids.length > config.block_size) {
        return { error: `the source must be 1 to ${config.block_size} tokens long; it is ${ids.length}` };
      }
      return { ids, prompt };
    }
    if (!config.chat) return { ids: promptIds(tokenizer, config, prompt), prompt };
    const messages = [...conversation, { role: "user", content: prompt }];
    return { ids: [...config.chat.start_ids, ...tokenizer.encode(chatText(config.chat, messages))], prompt };
  }

  async* write(asked, settings, stopping) {
    const decoder = this.tokenizer.decoder();
    const stopText = this.config.chat?.stop_text;
    let answer = "";
    for await (const step of this.writer.write(asked.ids, settings, stopping)) {
      const text = decoder.add(step.token);
      answer += text;
      const stop = stopText ? answer.indexOf(stopText) : -1;
      if (stop >= 0) {  // the end of the turn, written as text: the answer ends before it, that token not its own
        yield { text, cut: answer.length - stop };
        return;
      }
      yield { text, id: step.token };
    }
    yield { text: decoder.finish() };
  }

  readAgain(text) {
    return this.tokenizer.encode(text);
  }

  // A link's writing: its prompt read as a writing reads it, and the ids written, the link's own (`ids`) where it
  // gives them, else its text read again.
  linked(prompt, written, idsText) {
    const asked = this.asked(prompt, []);
    if (asked.error) return asked;
    const { ids, error } = linkedIds(idsText, this.config.vocab_size);
    if (ids) return { asked, writtenIds: ids, note: error };
    const unknown = this.tokenizer.unknownCharacters(written);
    if (unknown.length) return { error: `the link's text has characters the model never saw: ${JSON.stringify(unknown.join(""))}` };
    return { asked, writtenIds: this.tokenizer.encode(written), note: error };
  }

  // The text's trace in the window the writer read for `position`, the heads `ablated` knocked out, by the inside
  // graph (loaded the first time; a film's frame's where one is chosen); a GPT's heads scored as gptlite.heads
  // scores them.
  inside(asked, writing) {
    const { config, frame } = this;
    const writtenIds = writing?.ids ?? [];
    // A Seq2Seq's decoder reads its start token and the target; its encoder, the source.
    const textIds = config.source ? [config.start_id, ...writtenIds] : [...asked.ids, ...writtenIds];
    const sourceIds = config.source ? asked.ids : null;
    const run = async (ids, heads, source = null) => (await this.explainerOf(frame))
      .trace(ids, source, { head_scale: headScale(heads, config.shape) });
    const retrace = (position, ablated) =>
      run(textIds.slice(0, writerWindow(position, textIds.length, config.block_size).end), ablated, sourceIds);
    return {
      textIds,
      retrace,
      given: () => ({ piece: (id) => this.tokenizer.piece(id), promptLength: config.source ? 1 : asked.ids.length,
        textIds, retrace, scoreHeads: config.inside.probe ? (ids) => headScores(ids, config.inside.probe, run) : null }),
    };
  }
}

export class ModelOnServer {
  constructor(config) {
    this.config = config;
    this.runsHere = false;
    this.film = null;  // the served run's film (/v1/film), where the server shows one
    this.frame = null;  // the film's frame the Inside view traces with (null: the served model)
    this.weights = new Map();  // frame -> the attention weights of its trace, asked for once
    this.headers = keyBox(document.getElementById("api_key"), this.label());
  }

  label() {
    return document.getElementById("key_label");
  }

  async load() {}

  warm() {
    return null;
  }

  // The request one writing makes: a prompt (a Seq2Seq's source) or the conversation, a system message first
  // where there is one (the server renders it before the turns).
  asked(prompt, conversation, system) {
    const opening = system ? [{ role: "system", content: system }] : [];
    return { prompt, opening, body: this.config.chat ? { messages: [...opening, ...conversation,
      { role: "user", content: prompt }] } : { prompt } };
  }

  async* write(asked, settings) {
    this.controller = new AbortController();
    const body = { ...asked.body, ...requestSettings(this.config, settings) };
    for await (const text of writtenOnServer(body, this.headers, this.label(), this.controller.signal)) {
      yield { text };
    }
  }

  stop() {
    this.controller?.abort();
  }

  readAgain() {
    return null;
  }

  linked(prompt) {
    return { asked: { prompt, opening: [] }, writtenIds: null };
  }

  // The server's trace of the text (the prompt alone where nothing was written) in the window the writer read
  // `position` in (null: the last), the heads `ablated` knocked out ([layer, head] each). The attention weights,
  // the same for every text, are asked for once and kept.
  inside(asked, writing) {
    const { config, frame } = this;
    const onFrame = frame === null ? {} : { frame };
    const body = !writing ? { text: asked.prompt }
      : config.chat ? { messages: [...asked.opening, ...writing.conversation] }
        : config.source ? { text: asked.prompt, target: writing.answer } : { text: asked.prompt + writing.answer };
    const traced = { textIds: null };
    traced.retrace = async (position, ablated) => {
      const where = position === null || config.source ? {} : { position };
      const answer = await tracedOnServer({ ...body, ...where, ...onFrame, ablate: ablated,
        weights: !this.weights.has(frame) }, this.headers, this.label());
      const weight = new Set(config.inside.weight_steps);
      if (!this.weights.has(frame)) {
        this.weights.set(frame, answer.trace.layers.map((layer) => Object.fromEntries(Object.entries(layer)
          .filter(([name]) => weight.has(name)))));
      }
      answer.trace.layers.forEach((layer, index) => Object.assign(layer, this.weights.get(frame)[index]));
      traced.textIds = config.source ? null : answer.textIds;
      return answer.trace;
    };
    // The server's numbers; its text has no ids of the writer's here to line a draw up with (the whole text counts
    // as prompt).
    traced.given = (trace) => ({ piece: (id) => trace.vocabulary[id], retrace: traced.retrace,
      scoreHeads: config.source ? null : (ids) => headsOnServer(ids, this.headers, this.label(), frame),
      ...(traced.textIds ? { textIds: traced.textIds, promptLength: traced.textIds.length }
        : { promptLength: trace.window_start + trace.ids.length }) });
    return traced;
  }
}
