// The page: loads the model, writes as the reader asks, and shows inside it (attention, next-token candidates).
// The written text stands in #output; #output's data-state is "loading", "ready", "writing", "done" or "error".
import { chatText, makeTokenizer, promptIds, topCandidates, Writer } from "./gptlite.js";

const $ = (id) => document.getElementById(id);
// Seconds of warm-up: enough for V8 to optimise the laptop preset's model (some 300 steps); a model the size of
// GPT-2 small runs its long loops often enough to be optimised within its first few steps.
const WARM_SECONDS = 1.5;
const SETTINGS = ["max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed"];
let writer, tokenizer, config;
let stopping = false;
let warming = null;  // the model's warm-up while the page waits (Writer.warm), ended by a writing
let writingAsked = false;
let tokens = [];  // what the last call wrote: {id, candidates, attention, windowStart}
let promptLength = 0;  // the ids before them
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
  tokenizer = makeTokenizer(await (await fetch("tokenizer.json")).json());
  ort.env.wasm.wasmPaths = new URL("ort/", document.baseURI).href;
  // Threads need a cross-origin isolated page, which a plain static host does not give: one thread then.
  ort.env.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
  // Errors only: onnxruntime-web writes its warnings to the console, and a warning a step costs time.
  const session = await ort.InferenceSession.create("model.onnx", { executionProviders: ["wasm"],
    logSeverityLevel: 3 });
  writer = new Writer(ort, session, config);
  document.title = `${config.name}: gptlite`;
  $("title").textContent = config.name;
  $("about").textContent = config.about;
  for (let i = 0; i < config.n_layer; i++) $("layer").add(new Option(`layer ${i}`, i));
  for (let i = 0; i < config.n_head; i++) $("head").add(new Option(`head ${i}`, i));
  if (config.chat) $("prompt").placeholder = "your message";
  fillFromQuery();
  $("generate").disabled = false;
  say(`ready in ${((performance.now() - started) / 1000).toFixed(2)} s`, "ready");
  // Seconds from the page's navigation to a model ready to write.
  $("output").dataset.readySeconds = (performance.now() / 1000).toFixed(3);
  if (new URLSearchParams(location.search).get("run") === "1") generate();
  // Yielding every 10 ms keeps typing smooth while the model warms.
  else warming = writer.warm(WARM_SECONDS, () => letThePageBreathe(10), () => writingAsked);
}


function fillFromQuery() {
  const query = new URLSearchParams(location.search);
  if (query.has("prompt")) $("prompt").value = query.get("prompt");
  for (const name of SETTINGS) if (query.has(name)) $(name).value = query.get(name);
}

// The settings as numbers, checked; a message naming the first that is wrong.
function settingsOrError() {
  const settings = {};
  for (const name of SETTINGS) {
    const raw = $(name).value.trim();
    if (raw === "" && name === "top_k") { settings.top_k = null; continue; }
    const value = Number(raw);
    const limit = config.limits[name];
    if (raw === "" || !Number.isFinite(value) || (limit.whole && !Number.isInteger(value))
        || value < limit.least || (limit.most != null && value > limit.most)) {
      return { error: `${name} must be ${limit.says}; got ${raw || "nothing"}` };
    }
    settings[name] = value;
  }
  return { settings };
}

function idsOfPrompt(prompt) {
  const unknown = tokenizer.unknownCharacters(prompt);
  if (unknown.length) {
    return { error: `the prompt has characters the model never saw in training: ${JSON.stringify(unknown.join(""))}` };
  }
  if (!config.chat) return { ids: promptIds(tokenizer, config, prompt) };
  conversation.push({ role: "user", content: prompt });
  return { ids: [...config.chat.start_ids, ...tokenizer.encode(chatText(config.chat, conversation))] };
}

async function generate() {
  const { settings, error } = settingsOrError();
  const prompt = $("prompt").value;
  const asked = error ? { error } : idsOfPrompt(prompt);
  if (asked.error) { say(asked.error, "error"); return; }
  writingAsked = true;
  $("generate").disabled = true;
  await warming;  // the call in flight: milliseconds for a small model, some hundreds at GPT-2 small's size
  stopping = false;
  tokens = [];
  promptLength = asked.ids.length;
  $("stop").disabled = false;
  const output = $("output");
  const decoder = tokenizer.decoder();
  // One text node, appended to: setting textContent again would copy the whole text at every token.
  const written = document.createTextNode(config.chat ? "" : prompt);
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
      tokens.push({ id: step.token, candidates: topCandidates(step.logits, 5), attention: step.attention,
        windowStart: step.windowStart });
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
  output.dataset.firstTokenSeconds = ((firstToken ?? 0) / 1000).toFixed(3);
  output.dataset.tokensPerSecond = tokens.length > 1 ? ((tokens.length - 1) / (seconds - firstToken / 1000)).toFixed(2) : "0";
  $("speed").textContent = `${tokens.length} tokens in ${seconds.toFixed(2)} s, ${(tokens.length / seconds).toFixed(1)} tokens/s`;
  $("generate").disabled = false;
  $("stop").disabled = true;
  drawTokens();
  say(stopping ? "stopped" : "done", "done");
}

// The text written, token by token: choosing one shows what it attended to and what else it might have been.
function drawTokens() {
  const view = $("tokens");
  view.textContent = "";
  tokens.forEach((token, index) => {
    const span = document.createElement("span");
    span.textContent = tokenizer.piece(token.id).replace(/\n/g, "↵") || "·";
    span.className = "token";
    span.onclick = () => inspect(index);
    view.append(span);
  });
  if (tokens.length) inspect(tokens.length - 1);
}

function inspect(index) {
  const token = tokens[index];
  const layer = Number($("layer").value);
  const head = Number($("head").value);
  const [, heads, rows, keys] = token.attention.dims;
  // The row of the query that chose this token: the last of its call's.
  const offset = ((layer * heads + head) * rows + rows - 1) * keys;
  const weights = token.attention.data.subarray(offset, offset + keys);
  // Written token i stands at position promptLength + i, key promptLength + i - windowStart of this row; the row
  // is the query's that chose token `index`, so it sees the tokens written before it.
  const spans = $("tokens").children;
  for (let i = 0; i < spans.length; i++) {
    const key = promptLength + i - token.windowStart;
    const weight = i < index && key >= 0 && key < keys ? weights[key] : 0;
    spans[i].style.background = `rgba(220, 90, 30, ${Math.min(1, weight * 1.5).toFixed(3)})`;
    spans[i].classList.toggle("chosen", i === index);
  }
  const onPrompt = weights.subarray(0, Math.max(0, promptLength - token.windowStart)).reduce((a, b) => a + b, 0);
  $("prompt-share").textContent = `attention on the prompt: ${(onPrompt * 100).toFixed(1)}%`;
  const list = $("candidates");
  list.textContent = "";
  for (const candidate of token.candidates) {
    const row = document.createElement("li");
    row.textContent = `${JSON.stringify(tokenizer.piece(candidate.id))}  ${(candidate.probability * 100).toFixed(1)}%`;
    list.append(row);
  }
}

$("generate").onclick = generate;
$("stop").onclick = () => { stopping = true; };
$("layer").onchange = $("head").onchange = () => { if (tokens.length) inspect(tokens.length - 1); };
load().catch((failure) => say(`the model could not be loaded: ${failure.message}`, "error"));
