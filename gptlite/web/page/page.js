// The page: loads the model, writes as the reader asks, and shows inside it (the Inside view, inside.js, on a trace
// of the text that the inside graph computes). Served by `gptlite serve` (config.server), it writes through the
// server's API and shows the traces the server computes instead (server.js). The written text stands in #output;
// #output's data-state is "loading", "ready", "writing", "done" or "error". #inside's is "done" once a step is
// shown; window.gptliteInside() returns what it shows as plain JSON (docs/inspection.md).
import { chatText, Explainer, promptIds, settingOf, TargetWriter, Writer } from "./gptlite.js";
import { makeTokenizer } from "./tokenizers.js";
import { InsideView } from "./inside.js";
import { ablatedHeads, headScale, headScores, linkedIds, linkQuery, VIEW_FIELDS, writerWindow } from "./inside_data.js";
import { keyBox, requestSettings, tracedOnServer, writtenOnServer } from "./server.js";

const $ = (id) => document.getElementById(id);
// Seconds of warm-up: enough for V8 to optimise the laptop preset's model (some 300 steps); a model the size of
// GPT-2 small runs its long loops often enough to be optimised within its first few steps.
const WARM_SECONDS = 1.5;
// How the graphs are opened: errors only (onnxruntime-web writes its warnings to the console, and a warning a step
// costs time), their weights read from the one file both name.
const SESSION = { executionProviders: ["wasm"], logSeverityLevel: 3,
  externalData: [{ path: "weights.bin", data: "weights.bin" }] };
let writer, tokenizer, config, explainer, view;
let explaining = null;  // the Inside view's trace in flight, which a new writing waits for
let headers = null;  // a served page's request headers (its API key)
let controller = null;  // a served page's request in flight, which Stop aborts
let stopping = false;
let warming = null;  // the model's warm-up while the page waits (Writer.warm), ended by a writing
let writingAsked = false;
let tokens = [];  // what the last call wrote: {id}
let usedSettings = null;  // the settings of the last writing, its seed chosen
let lastWriting = null;  // what the link carries of the last writing: {prompt, written, writtenIds, readAgain}
const conversation = [];

// Let the browser draw the text and take clicks (Stop): a decoding loop that only awaits the model never gives it
// the chance. Every 33 ms (30 frames a second): each yield lets the browser lay the text out again.
let lastYield = 0;
async function letThePageBreathe(every = 33) {
  if (performance.now() - lastYield < every) return;
  // A new task, behind those waiting (a click, a frame), without setTimeout's 4 ms floor.
  await new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = resolve;
    channel.port2.postMessage(null);
  });
  lastYield = performance.now();
}

function say(text, state) {
  $("message").textContent = text;
  if (state) $("output").dataset.state = state;
}

async function load() {
  say("loading the model...", "loading");
  const started = performance.now();
  config = await (await fetch("config.json")).json();
  if (config.server) headers = keyBox($("api_key"), $("key_label"));
  else await loadModel();
  document.title = `${config.name}: gptlite`;
  $("title").textContent = config.name;
  $("about").textContent = config.about;
  for (const setting of config.sampling) {  // the boxes, from SamplingConfig's fields
    const input = document.createElement("input");
    input.id = setting.name;
    input.value = setting.default ?? "";
    input.placeholder = setting.empty ?? "";
    input.title = setting.help;
    const label = document.createElement("label");
    label.append(setting.name.replace(/_/g, " "), input);
    $("settings").append(label);
  }
  if (config.chat) {
    $("prompt").placeholder = "your message";
    $("chat_controls").hidden = false;
    $("system_label").hidden = !config.server;  // the server renders a system message; the page's pieces do not
  }
  if (config.source) $("prompt").placeholder = "a source to write a target for";
  fillFromQuery();
  $("generate").disabled = false;
  say(`ready in ${((performance.now() - started) / 1000).toFixed(2)} s`, "ready");
  // Seconds from the page's navigation to a model ready to write.
  $("output").dataset.readySeconds = (performance.now() / 1000).toFixed(3);
  const query = new URLSearchParams(location.search);
  if (query.get("run") === "1") generate();
  else {
    // A link opens what it says: the text written (not written again) or the prompt alone, at its view's state.
    if (query.has("written") && !config.chat) explaining = openWritten(query.get("written"), query.get("ids"));
    else if (VIEW_FIELDS.some((name) => query.has(name))) {
      if (config.server) explaining = explainOnServer({ text: $("prompt").value });
      else {
        const asked = idsOfPrompt($("prompt").value);
        if (asked.error) say(asked.error); else explaining = explain(asked.ids, []);
      }
    }
    // Yielding every 10 ms keeps typing smooth while the model warms.
    if (!config.server) warming = writer.warm(WARM_SECONDS, () => letThePageBreathe(10), () => writingAsked);
  }
}


// A link's writing, shown and explained as it was written: the prompt (in its box), the text the model wrote, and
// where reading that text again would give other ids (a BPE tokenizer's), the ids it wrote.
async function openWritten(written, idsText) {
  const prompt = $("prompt").value;
  const { settings, error } = settingsOrError();
  usedSettings = settings;
  $("output").textContent = config.source ? written : prompt + written;
  if (error) { say(error); return; }
  if (config.server) {
    lastWriting = { prompt, written };
    return explainOnServer(config.source ? { text: prompt, target: written } : { text: prompt + written });
  }
  const asked = idsOfPrompt(prompt);
  if (asked.error) { say(asked.error); return; }
  let { ids, error: wrongIds } = linkedIds(idsText, config.vocab_size);
  if (wrongIds) say(wrongIds);
  if (!ids) {
    const unknown = tokenizer.unknownCharacters(written);
    if (unknown.length) { say(`the link's text has characters the model never saw: ${JSON.stringify(unknown.join(""))}`); return; }
    ids = tokenizer.encode(written);
  }
  lastWriting = { prompt, written, writtenIds: ids, readAgain: tokenizer.encode(written) };
  return explain(asked.ids, ids);
}

// The static page's model: its tokenizer and graphs, run by ONNX Runtime Web here.
async function loadModel() {
  tokenizer = makeTokenizer(await (await fetch("tokenizer.json")).json());
  ort.env.wasm.wasmPaths = new URL("ort/", document.baseURI).href;
  // Threads need a cross-origin isolated page, which a plain static host does not give: one thread then.
  ort.env.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
  // A Seq2Seq's page (config.source) writes its targets with the inside graph itself, which then explains them too.
  const session = await ort.InferenceSession.create(config.source ? "inside.onnx" : "model.onnx", SESSION);
  writer = config.source ? new TargetWriter(ort, session, config) : new Writer(ort, session, config);
  if (config.source) explainer = new Explainer(ort, session, config);
}

function fillFromQuery() {
  const query = new URLSearchParams(location.search);
  if (query.has("prompt")) $("prompt").value = query.get("prompt");
  for (const { name } of config.sampling) if (query.has(name)) $(name).value = query.get(name);
}

// The settings as numbers, each checked against its bounds as config.json declares them (SamplingConfig's); a
// message naming the first that is wrong. An empty seed is a new one, drawn here.
function settingsOrError() {
  const settings = {};
  for (const setting of config.sampling) {
    const { value, error } = settingOf(setting, $(setting.name).value);
    if (error) return { error };
    settings[setting.name] = value;
  }
  if (settings.seed === null) settings.seed = crypto.getRandomValues(new Uint32Array(1))[0] % 2147483648;
  return { settings };
}

// The ids the model reads of what the reader wrote: a prompt, a conversation, or a Seq2Seq's source (1 to
// block_size tokens, read whole).
function idsOfPrompt(prompt) {
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
    return { ids };
  }
  if (!config.chat) return { ids: promptIds(tokenizer, config, prompt) };
  const messages = [...conversation, { role: "user", content: prompt }];
  return { ids: [...config.chat.start_ids, ...tokenizer.encode(chatText(config.chat, messages))] };
}

async function generate() {
  if (config.server) return generateOnServer();
  const { settings, error } = settingsOrError();
  const prompt = $("prompt").value;
  const asked = error ? { error } : idsOfPrompt(prompt);
  if (asked.error) { say(asked.error, "error"); return; }
  writingAsked = true;
  if (config.chat) conversation.push({ role: "user", content: prompt });
  $("generate").disabled = true;
  await warming;  // the call in flight: milliseconds for a small model, some hundreds at GPT-2 small's size
  await explaining;
  stopping = false;
  tokens = [];
  usedSettings = settings;
  $("stop").disabled = false;
  const output = $("output");
  const decoder = tokenizer.decoder();
  // One text node, appended to: setting textContent again would copy the whole text at every token.
  const written = document.createTextNode(config.chat || config.source ? "" : prompt);
  output.replaceChildren(written);
  output.dataset.state = "writing";
  say("writing...");
  const started = performance.now();
  let firstToken = null;
  let answer = "";
  let cut = false;
  try {
    for await (const step of writer.write(asked.ids, settings, () => stopping)) {
      if (firstToken === null) firstToken = performance.now() - started;
      const text = decoder.add(step.token);
      answer += text;
      if (text) written.appendData(text);
      const stop = config.chat?.stop_text ? answer.indexOf(config.chat.stop_text) : -1;
      if (stop >= 0) {  // the end of the turn, written as text: the answer ends before it
        written.deleteData(written.length - (answer.length - stop), answer.length - stop);
        answer = answer.slice(0, stop);
        cut = true;
        break;
      }
      tokens.push({ id: step.token });
      await letThePageBreathe();
      if (tokens.length % 16 === 0) {
        const seconds = (performance.now() - started) / 1000;
        $("speed").textContent = `${tokens.length} tokens, ${(tokens.length / seconds).toFixed(1)} tokens/s`;
      }
    }
    const rest = cut ? "" : decoder.finish();
    answer += rest;
    if (rest) written.appendData(rest);
  } catch (failure) {
    say(`the model failed: ${failure.message}`, "error");
    $("generate").disabled = false;
    $("stop").disabled = true;
    return;
  }
  const seconds = (performance.now() - started) / 1000;
  if (config.chat) {
    conversation.push({ role: "assistant", content: answer });
    // The conversation so far above the answer box; the next message continues it.
    $("conversation").textContent = conversation.map((m) => `${m.role === "user" ? "you" : "model"}: ${m.content}`)
      .join("\n");
    $("prompt").value = "";
  }
  output.dataset.ids = JSON.stringify(tokens.map((token) => token.id));
  output.dataset.promptIds = JSON.stringify(asked.ids);
  output.dataset.seed = String(settings.seed);
  output.dataset.firstTokenSeconds = ((firstToken ?? 0) / 1000).toFixed(3);
  output.dataset.tokensPerSecond = tokens.length > 1
    ? ((tokens.length - 1) / (seconds - firstToken / 1000)).toFixed(2) : "0";
  $("speed").textContent = `${tokens.length} tokens in ${seconds.toFixed(2)} s, `
    + `${(tokens.length / seconds).toFixed(1)} tokens/s`;
  $("generate").disabled = false;
  $("stop").disabled = true;
  say(stopping ? "stopped" : "done", "done");
  const writtenIds = tokens.map((token) => token.id);
  lastWriting = config.chat ? null : { prompt, written: answer, writtenIds, readAgain: tokenizer.encode(answer) };
  explaining = explain(asked.ids, writtenIds);
}

// The Inside view over the text: the prompt's ids and those written, traced by the inside graph (loaded the first
// time) in the window the writer read for the token the link names (else the last), the heads it names knocked out;
// the link kept up to date as the reader moves.
async function explain(promptIdList, writtenIds) {
  const inside = $("inside");
  inside.dataset.state = "tracing";
  // A Seq2Seq's decoder reads its start token and the target; its encoder, the source.
  const textIds = config.source ? [config.start_id, ...writtenIds] : [...promptIdList, ...writtenIds];
  const sourceIds = config.source ? promptIdList : null;
  const retrace = async (position, ablated) => {
    if (!explainer) {
      explainer = new Explainer(ort, await ort.InferenceSession.create("inside.onnx", SESSION), config);
    }
    const { end } = writerWindow(position, textIds.length, config.block_size);
    return explainer.trace(textIds.slice(0, end), sourceIds, { head_scale: headScale(ablated, config.shape) });
  };
  const { asked, notes } = askedOfView();
  const linked = Number(asked.token);
  const position = Number.isInteger(linked) && linked >= 0 && linked < textIds.length ? linked : textIds.length - 1;
  try {
    const trace = await retrace(position, asked.ablated);
    if (asked.token !== undefined) asked.token = Number.isInteger(linked) ? linked - trace.window_start : asked.token;
    // A GPT's heads are scored on the window shown, each knocked out in turn (gptlite.heads' scores).
    const run = (ids, heads) => explainer.trace(ids, null, { head_scale: headScale(heads, config.shape) });
    const scoreHeads = config.inside.probe ? (ids) => headScores(ids, config.inside.probe, run) : null;
    show(trace, asked, notes, { piece: (id) => tokenizer.piece(id), promptLength: config.source ? 1 : promptIdList.length,
      textIds, retrace, scoreHeads });
  } catch (failure) {
    inside.dataset.state = "error";
    inside.textContent = `the model could not be traced: ${failure.message}`;
  }
}

// What the view opens at: where the page's address says the first time ({asked: {token, layer, head, step,
// ablated}, notes: a line for each head to knock out that it names wrongly}); after a new writing, its last token
// with the step, layer and head the reader was on, no head knocked out.
let linkRead = false;
let landing = false;  // a link named a view: the page scrolls to it once it is shown
function askedOfView() {
  if (linkRead) {
    const { step, layer, head } = view?.state ?? {};
    return { asked: { step, layer, head, ablated: [] }, notes: [] };
  }
  linkRead = true;
  const query = new URLSearchParams(location.search);
  landing = VIEW_FIELDS.some((name) => query.has(name));
  const asked = {};
  for (const name of ["token", "layer", "head", "step"]) if (query.has(name)) asked[name] = query.get(name);
  const { heads, notes } = ablatedHeads(query.get("ablate"), config.shape);
  asked.ablated = heads;
  return { asked, notes };
}

// The Inside view of `trace`, opened at `asked`; `given`: piece, promptLength (the ids before the written ones) and
// what a page that traces again gives (textIds, retrace).
function show(trace, asked, notes, given) {
  view = new InsideView($("inside"), { sampling: config.sampling, inside: config.inside,
    settings: usedSettings ?? settingsOrError().settings, ablated: asked.ablated, onChange: remember, link, ...given });
  view.show(trace, asked, notes);
  if (landing) $("inside").scrollIntoView();
  landing = false;
}

// --- a page served by `gptlite serve`: the server writes and traces

async function generateOnServer() {
  const { settings, error } = settingsOrError();
  if (error) { say(error, "error"); return; }
  await explaining;
  const prompt = $("prompt").value;
  const system = $("system").value.trim();
  const opening = system ? [{ role: "system", content: system }] : [];  // the server renders it before the turns
  const messages = [...opening, ...conversation, { role: "user", content: prompt }];
  const body = { ...(config.chat ? { messages } : { prompt }), ...requestSettings(config, settings) };
  usedSettings = settings;
  stopping = false;
  controller = new AbortController();
  $("generate").disabled = true;
  $("stop").disabled = false;
  const output = $("output");
  const written = document.createTextNode(config.chat || config.source ? "" : prompt);
  output.replaceChildren(written);
  say("writing...", "writing");
  let answer = "";
  try {
    for await (const text of writtenOnServer(body, headers, $("key_label"), controller.signal)) {
      answer += text;
      written.appendData(text);
    }
  } catch (failure) {
    if (failure.name !== "AbortError") {
      say(failure.message, "error");
      $("generate").disabled = false;
      $("stop").disabled = true;
      return;
    }
  }
  $("generate").disabled = false;
  $("stop").disabled = true;
  if (config.chat) {
    conversation.push(messages.at(-1), { role: "assistant", content: answer });
    $("conversation").textContent = conversation.map((m) => `${m.role === "user" ? "you" : "model"}: ${m.content}`)
      .join("\n");
    $("prompt").value = "";
  }
  say(stopping ? "stopped" : "done", "done");
  lastWriting = config.chat ? null : { prompt, written: answer };
  explaining = explainOnServer(config.chat ? { messages: [...opening, ...conversation] }
    : config.source ? { text: prompt, target: written.data } : { text: written.data });
}

async function explainOnServer(body) {
  const inside = $("inside");
  inside.dataset.state = "tracing";
  // The server traces the text's last window; a knocked-out head is asked of it as [layer, head].
  const retrace = async (position, ablated) => (await tracedOnServer({ ...body, ablate: ablated }, headers,
    $("key_label"))).trace;
  const { asked, notes } = askedOfView();
  try {
    const trace = await retrace(null, asked.ablated);
    // The server's numbers; its text has no ids of the writer's here to line a draw up with.
    show(trace, asked, notes, { piece: (id) => trace.vocabulary[id], promptLength: trace.window_start + trace.ids.length,
      retrace });
  } catch (failure) {
    inside.dataset.state = "error";
    inside.textContent = `the model could not be traced: ${failure.message}`;
  }
}

// The address of what the page shows: the last writing (its prompt, its text, its settings and seed), the view's
// state, the heads knocked out. A chat's conversation is not carried: its link opens the view of the prompt alone.
function link() {
  const state = view.state;
  const query = linkQuery({
    prompt: config.chat ? null : lastWriting?.prompt ?? $("prompt").value,
    ...(lastWriting ?? {}),
    settings: lastWriting ? usedSettings : {},
    view: { token: view.position(state.token), layer: state.layer, head: state.head, step: state.step,
      ablated: view.ablated },
  });
  return new URL(`?${query}`, location.href).href;
}

// The view's state in the page's address, so that a link opens it again.
function remember() {
  history.replaceState(null, "", link());
}

window.gptliteInside = () => (view && $("inside").dataset.state === "done" ? view.contract() : null);
// The whole trace the view shows, every array as {dims, data} with plain numbers, as gptlite.trace's to_json gives.
window.gptliteTrace = () => (view ? JSON.parse(JSON.stringify(view.trace, (key, value) => (
  ArrayBuffer.isView(value) ? Array.from(value) : value))) : null);

$("generate").onclick = generate;
$("stop").onclick = () => { stopping = true; controller?.abort(); };
$("new_chat").onclick = () => { conversation.length = 0; $("conversation").textContent = ""; };
load().catch((failure) => say(`the model could not be loaded: ${failure.message}`, "error"));
