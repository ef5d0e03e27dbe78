// The page: loads the model, writes as the reader asks, and shows inside it (the Inside view, inside.js). The model
// runs in this page (page_models.js's ModelHere, ONNX Runtime Web) or, on the page `gptlite serve` serves
// (config.server), on the server (ModelOnServer): the page asks either the same things. The written text stands in
// #output; #output's data-state is "loading", "ready", "writing", "done" or "error". #inside's is "done" once a step
// is shown; window.gptliteInside() returns what it shows as plain JSON (docs/inspection.md). A page with a run's film
// (config.film) shows it in #film (film.js), whose frame the Inside view then traces; window.gptliteFilm() returns it.
import { filmContract, FilmView, frameOfStep } from "./film.js";
import { settingOf } from "./gptlite.js";
import { InsideView } from "./inside.js";
import { ablatedHeads, linkQuery, VIEW_FIELDS, writerWindow } from "./inside_data.js";
import { ModelHere, ModelOnServer } from "./page_models.js";

const $ = (id) => document.getElementById(id);
// Seconds of warm-up: enough for V8 to optimise the laptop preset's model (some 300 steps); a model the size of
// GPT-2 small runs its long loops often enough to be optimised within its first few steps.
const WARM_SECONDS = 1.5;

// What the page holds: the export's config.json, the model, the Inside view, and what is under way.
const page = {
  config: null,
  model: null,
  view: null,
  explaining: null,  // the Inside view's trace in flight, which a new writing waits for
  warming: null,  // the model's warm-up while the page waits, ended by a writing
  writingAsked: false,
  stopping: false,
  settings: null,  // the settings of the last writing, its seed chosen
  writing: null,  // what the link carries of the last writing: {prompt, written, writtenIds, readAgain}
  conversation: [],
  film: null,  // the film's view (film.js), where the export has a film
  linkRead: false,  // the view opened where the page's address said, once
  landing: false,  // a link named a view: the page scrolls to it once it is shown
};

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
  const config = page.config = await (await fetch("config.json")).json();
  page.model = config.server ? new ModelOnServer(config) : new ModelHere(config);
  await page.model.load();
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
  const query = new URLSearchParams(location.search);
  const filmNote = config.film ? await openFilm(query) : null;
  $("generate").disabled = false;
  say(`ready in ${((performance.now() - started) / 1000).toFixed(2)} s${filmNote ? `; ${filmNote}` : ""}`, "ready");
  // Seconds from the page's navigation to a model ready to write.
  $("output").dataset.readySeconds = (performance.now() / 1000).toFixed(3);
  if (query.get("run") === "1") generate();
  else {
    // A link opens what it says: the text written (not written again) or the prompt alone, at its view's state.
    if (query.has("written") && !config.chat) page.explaining = openWritten(query.get("written"), query.get("ids"));
    else if (VIEW_FIELDS.some((name) => query.has(name)) || query.has("frame")) {
      const asked = page.model.asked($("prompt").value, []);
      if (asked.error) say(asked.error); else page.explaining = explain(asked, null);
    }
    // Yielding every 10 ms keeps typing smooth while the model warms.
    page.warming = page.model.warm(WARM_SECONDS, () => letThePageBreathe(10), () => page.writingAsked);
  }
}

// The film (film/film.json): its view, at the frame the address names (a step) or its last; a frame named makes
// the Inside view show the probe as the model computed it then. A line to say, where there is one.
async function openFilm(query) {
  const answer = await fetch(page.config.film, { headers: page.model.runsHere ? {} : page.model.headers() });
  if (!answer.ok) return `the film could not be read: ${answer.status} ${answer.statusText}`;
  const film = page.model.film = await answer.json();
  $("film_part").hidden = false;
  page.film = new FilmView($("film"), film, chooseFrame);
  const named = query.has("frame") ? frameOfStep(film.frames, Number(query.get("frame"))) : null;
  page.film.show(named ?? film.frames.length - 1);
  if (named === null) return null;
  page.model.frame = named;
  if (!query.has("prompt")) $("prompt").value = film.probe;
  sayFrame();
  const shown = film.frames[named].step;
  return String(shown) === query.get("frame") ? null
    : `the film has no frame at step ${query.get("frame")}: it shows step ${shown}, the nearest before it`;
}

// A frame picked in the film: the Inside view shows the probe at that frame.
function chooseFrame(index) {
  page.model.frame = index;
  $("prompt").value = page.model.film.probe;
  page.writing = null;
  sayFrame();
  const asked = page.model.asked(page.model.film.probe, []);
  // A frame passed over while the one before was traced is not traced: the last chosen is.
  page.explaining = Promise.resolve(page.explaining)
    .then(() => (page.model.frame === index ? explain(asked, null) : null));
}

function sayFrame() {
  const { frame, film } = page.model;
  $("inside_frame").textContent = frame === null ? ""
    : `The model as it was at step ${film.frames[frame].step} of its training (the film's frame ${frame + 1}).`;
}

function fillFromQuery() {
  const query = new URLSearchParams(location.search);
  if (query.has("prompt")) $("prompt").value = query.get("prompt");
  for (const { name } of page.config.sampling) if (query.has(name)) $(name).value = query.get(name);
}

// The settings as numbers, each checked against its bounds as config.json declares them (SamplingConfig's); a
// message naming the first that is wrong. An empty seed is a new one, drawn here.
function settingsOrError() {
  const settings = {};
  for (const setting of page.config.sampling) {
    const { value, error } = settingOf(setting, $(setting.name).value);
    if (error) return { error };
    settings[setting.name] = value;
  }
  if (settings.seed === null) settings.seed = crypto.getRandomValues(new Uint32Array(1))[0] % 2147483648;
  return { settings };
}

// One writing, whichever model writes: the prompt read, the text as it comes, then the Inside view of it.
async function generate() {
  const { config, model, conversation } = page;
  const { settings, error } = settingsOrError();
  const prompt = $("prompt").value;
  const asked = error ? { error } : model.asked(prompt, conversation, $("system").value.trim());
  if (asked.error) { say(asked.error, "error"); return; }
  page.writingAsked = true;
  $("generate").disabled = true;
  if (page.film) {  // the Inside view of a writing is the writing model's
    page.model.frame = null;
    sayFrame();
  }
  await page.warming;  // the call in flight: milliseconds for a small model, some hundreds at GPT-2 small's size
  await page.explaining;
  page.stopping = false;
  page.settings = settings;
  $("stop").disabled = false;
  const output = $("output");
  // One text node, appended to: setting textContent again would copy the whole text at every token.
  const written = document.createTextNode(config.chat || config.source ? "" : prompt);
  output.replaceChildren(written);
  say("writing...", "writing");
  const started = performance.now();
  let firstToken = null;
  let answer = "";
  const ids = [];
  try {
    for await (const piece of model.write(asked, settings, () => page.stopping)) {
      if (firstToken === null) firstToken = performance.now() - started;
      answer += piece.text;
      if (piece.text) written.appendData(piece.text);
      if (piece.cut) {
        written.deleteData(written.length - piece.cut, piece.cut);
        answer = answer.slice(0, answer.length - piece.cut);
      }
      if (piece.id !== undefined) ids.push(piece.id);
      await letThePageBreathe();
      if (piece.id !== undefined && ids.length % 16 === 0) {
        $("speed").textContent = `${ids.length} tokens, ${(ids.length / ((performance.now() - started) / 1000))
          .toFixed(1)} tokens/s`;
      }
    }
  } catch (failure) {
    if (failure.name !== "AbortError") {
      say(model.runsHere ? `the model failed: ${failure.message}` : failure.message, "error");
      $("generate").disabled = false;
      $("stop").disabled = true;
      return;
    }
  }
  if (model.runsHere) recordSpeed(output, asked, settings, ids, firstToken, (performance.now() - started) / 1000);
  if (config.chat) {  // the turn joins the conversation once it is written
    conversation.push({ role: "user", content: prompt }, { role: "assistant", content: answer });
    // The conversation so far above the answer box; the next message continues it.
    $("conversation").textContent = conversation.map((m) => `${m.role === "user" ? "you" : "model"}: ${m.content}`)
      .join("\n");
    $("prompt").value = "";
  }
  $("generate").disabled = false;
  $("stop").disabled = true;
  say(page.stopping ? "stopped" : "done", "done");
  page.writing = config.chat ? null
    : { prompt, written: answer, writtenIds: model.runsHere ? ids : null, readAgain: model.readAgain(answer) };
  page.explaining = explain(asked, { answer, ids, conversation: [...conversation] });
}

// What a script reads of a writing here: the ids, the prompt's, the seed and the speed.
function recordSpeed(output, asked, settings, ids, firstToken, seconds) {
  output.dataset.ids = JSON.stringify(ids);
  output.dataset.promptIds = JSON.stringify(asked.ids);
  output.dataset.seed = String(settings.seed);
  output.dataset.firstTokenSeconds = ((firstToken ?? 0) / 1000).toFixed(3);
  output.dataset.tokensPerSecond = ids.length > 1 ? ((ids.length - 1) / (seconds - firstToken / 1000)).toFixed(2)
    : "0";
  $("speed").textContent = `${ids.length} tokens in ${seconds.toFixed(2)} s, `
    + `${(ids.length / seconds).toFixed(1)} tokens/s`;
}

// A link's writing, shown and explained as it was written: the prompt (in its box), the text the model wrote, and
// where reading that text again would give other ids (a BPE tokenizer's), the ids it wrote.
async function openWritten(written, idsText) {
  const prompt = $("prompt").value;
  const { settings, error } = settingsOrError();
  page.settings = settings;
  $("output").textContent = page.config.source ? written : prompt + written;
  if (error) { say(error); return; }
  const linked = page.model.linked(prompt, written, idsText);
  if (linked.error) { say(linked.error); return; }
  if (linked.note) say(linked.note);
  page.writing = { prompt, written, writtenIds: linked.writtenIds, readAgain: page.model.readAgain(written) };
  return explain(linked.asked, { answer: written, ids: linked.writtenIds, conversation: [] });
}

// The Inside view of a writing (null: the prompt alone), opened where the link says the first time, the heads it
// names knocked out; the page's address kept up to date as the reader moves.
async function explain(asked, writing) {
  const inside = $("inside");
  inside.dataset.state = "tracing";
  const traced = page.model.inside(asked, writing);
  const { asked: state, notes } = askedOfView();
  const count = traced.textIds?.length;
  const linked = Number(state.token);
  const position = count && Number.isInteger(linked) && linked >= 0 && linked < count ? linked : count - 1;
  try {
    let trace = await traced.retrace(count ? position : null, state.ablated);
    // The server's page learns the whole text's ids with its first trace (its last window): a link's token in
    // another window is traced in the window the writer read it in.
    const whole = traced.textIds?.length;
    if (!count && whole && Number.isInteger(linked) && linked >= 0 && linked < whole &&
        writerWindow(linked, whole, page.config.block_size).end !== trace.window_start + trace.ids.length) {
      trace = await traced.retrace(linked, state.ablated);
    }
    // A link names a position in the whole text; the view, one in the window traced.
    if (whole && state.token !== undefined && Number.isInteger(linked)) state.token = linked - trace.window_start;
    show(trace, state, notes, traced.given(trace));
  } catch (failure) {
    inside.dataset.state = "error";
    inside.textContent = `the model could not be traced: ${failure.message}`;
  }
}

// What the view opens at: where the page's address says the first time ({asked: {token, layer, head, step,
// ablated}, notes: a line for each head to knock out that it names wrongly}); after a new writing, its last token
// with the step, layer and head the reader was on, no head knocked out.
function askedOfView() {
  if (page.linkRead) {
    const { step, layer, head } = page.view?.state ?? {};
    return { asked: { step, layer, head, ablated: [] }, notes: [] };
  }
  page.linkRead = true;
  const query = new URLSearchParams(location.search);
  page.landing = VIEW_FIELDS.some((name) => query.has(name));
  const asked = {};
  for (const name of ["token", "layer", "head", "step"]) if (query.has(name)) asked[name] = query.get(name);
  const { heads, notes } = ablatedHeads(query.get("ablate"), page.config.shape);
  asked.ablated = heads;
  return { asked, notes };
}

// The Inside view of `trace`, opened at `asked`; `given`: the model's options for it (piece, promptLength, and
// where the page traces again, textIds, retrace, scoreHeads).
function show(trace, asked, notes, given) {
  page.view = new InsideView($("inside"), { sampling: page.config.sampling, inside: page.config.inside,
    settings: page.settings ?? settingsOrError().settings, ablated: asked.ablated, onChange: remember, link,
    ...given });
  page.view.show(trace, asked, notes);
  if (page.landing) $("inside").scrollIntoView();
  page.landing = false;
}

// The address of what the page shows: the last writing (its prompt, its text, its settings and seed), the view's
// state, the heads knocked out. A chat's conversation is not carried: its link opens the view of the prompt alone.
function link() {
  const { view, writing } = page;
  const query = new URLSearchParams(linkQuery({
    prompt: page.config.chat ? null : writing?.prompt ?? $("prompt").value,
    ...(writing ?? {}),
    settings: writing ? page.settings : {},
    view: { token: view.position(view.state.token), layer: view.state.layer, head: view.state.head,
      step: view.state.step, ablated: view.ablated },
  }));
  if (page.model.frame !== null && page.model.frame !== undefined) {
    query.set("frame", String(page.model.film.frames[page.model.frame].step));
  }
  return new URL(`?${query}`, location.href).href;
}

// The view's state in the page's address, so that a link opens it again.
function remember() {
  history.replaceState(null, "", link());
}

window.gptliteFilm = () => (page.film ? filmContract(page.model.film, page.film.index) : null);
window.gptliteInside = () => (page.view && $("inside").dataset.state === "done" ? page.view.contract() : null);
// The whole trace the view shows, every array as {dims, data} with plain numbers, as gptlite.trace's to_json gives.
window.gptliteTrace = () => (page.view ? JSON.parse(JSON.stringify(page.view.trace, (key, value) => (
  ArrayBuffer.isView(value) ? Array.from(value) : value))) : null);

$("generate").onclick = generate;
$("stop").onclick = () => { page.stopping = true; page.model.stop?.(); };
$("new_chat").onclick = () => { page.conversation.length = 0; $("conversation").textContent = ""; };
load().catch((failure) => say(`the model could not be loaded: ${failure.message}`, "error"));
