// The Inside view: one token of a text walked through the model, step by step, with the model's own numbers.
//
// It shows a trace: gptlite.trace's (Python, `Trace.to_json`) or the page's inside graph's (gptlite.js
// `Explainer`), the same object either way: {ids, window_start, shape, steps: {name: {dims, data}},
// layers: [{name: {dims, data}}]}. It computes nothing of the model: every number is the trace's, except the
// probabilities after the sampling settings, which it takes from the sampler the page writes with.
import { nextTokenProbabilities, rowSeed, sampleNext, uniformNoise } from "./gptlite.js";
import { ablatedText, at, attentionMatrix, attentionRows, writerWindow } from "./inside_data.js";
import { element, light, paint, paragraph, shown } from "./inside_draw.js";
import { INPUT_DRAWINGS } from "./steps_input.js";
import { ATTENTION_DRAWINGS } from "./steps_attention.js";
import { HEAD_DRAWINGS } from "./steps_heads.js";
import { OUTPUT_DRAWINGS } from "./steps_output.js";

// Each step's drawing by its id (the steps themselves, their titles and what each needs, are Python's:
// gptlite/inside/views.py): a function of the view, the panel it fills and the state shown.
const STEP_DRAWINGS = { ...INPUT_DRAWINGS, ...ATTENTION_DRAWINGS, ...HEAD_DRAWINGS, ...OUTPUT_DRAWINGS };

// --- the view

export class InsideView {
  // root: the element the view fills (its data-state says "done" once a step is shown); options: piece(id) (a
  // token's text), sampling (config.json's sampling settings), inside (what Python declares of the view: its steps
  // `views`, the `live` settings, the model's `choices` in words; gptlite/inside/views.py), settings (what the
  // writing used, seed included), promptLength (the ids before the written ones), onChange(state) (each new state).
  // A page that can trace again gives too: textIds (the whole text's ids, of which a trace is one window),
  // retrace(position, ablated) (a promise of the trace that shows the text's `position` as the writer read it, the
  // heads `ablated` knocked out), ablated (the heads the trace shown has knocked out), scoreHeads(ids) (a promise
  // of every head's scores on `ids`: inside_data.js's headScores) and link() (the address of what is shown).
  constructor(root, options) {
    this.root = root;
    this.options = options;
    this.declared = options.inside;
    this.live = {};
    for (const name of this.declared.live)
      this.live[name] = options.settings?.[name] ?? options.sampling.find((s) => s.name === name)?.default ?? null;
    this.ablated = options.ablated ?? [];
    this.state = null;
  }

  // The whole text's ids: the page's, else the trace's window.
  textIds() {
    return this.options.textIds ?? Array.from(this.trace.ids, Number);
  }

  // The position in the whole text of the trace's token `token`.
  position(token) {
    return this.options.textIds ? this.trace.window_start + token : token;
  }

  steps() {
    return this.declared.views.filter((step) => (!step.needs || step.needs in this.trace.layers[0]) &&
      (!step.runs || this.options.scoreHeads));
  }

  // Show `trace` at `asked` ({token, layer, head, step}, each optional; token, an index of the trace's ids): what
  // cannot be shown is said in a line (after `notes`, the page's own), and the nearest state that can is shown.
  show(trace, asked = {}, notes = []) {
    this.trace = trace;
    const nearest = this.nearest(asked);
    this.notes = [...notes, ...nearest.notes];
    const state = nearest.state;
    this.render(state);
  }

  nearest(asked) {
    const shape = this.trace.shape;
    const length = this.trace.ids.length;
    const notes = [];
    const whole = (name, value, count, fallback) => {
      if (value === undefined || value === null || value === "") return fallback;
      const n = Number(value);
      if (!Number.isInteger(n) || n < 0 || n >= count) {
        const nearest = Number.isFinite(n) ? Math.min(Math.max(Math.round(n), 0), count - 1) : fallback;
        notes.push(`there is no ${name} ${value} (0 to ${count - 1} here): showing ${name} ${nearest}`);
        return nearest;
      }
      return n;
    };
    const steps = this.steps().map((step) => step.id);
    let step = asked.step ?? "tokens";
    if (!steps.includes(step)) {
      notes.push(`this model has no step ${JSON.stringify(step)} (its steps: ${steps.join(", ")}): showing tokens`);
      step = "tokens";
    }
    return {
      notes,
      state: {
        token: whole("token", asked.token, length, length - 1),
        layer: whole("layer", asked.layer, shape.n_layer, 0),
        head: whole("head", asked.head, shape.n_head, 0),
        step,
      },
    };
  }

  render(state) {
    const started = performance.now();
    this.state = state;
    this.root.dataset.state = "drawing";
    const steps = this.steps();
    const step = steps.find((s) => s.id === state.step);
    const panel = element(
      "section",
      { class: "step", "aria-live": "polite" },
      element("h3", {
        text: `${step.title}${step.layer ? ` · layer ${state.layer}, head ${state.head}` : ""} · token ` +
          `${this.position(state.token)} ${JSON.stringify(this.options.piece(this.trace.ids[state.token]))}`,
      })
    );
    const drawn = STEP_DRAWINGS[step.id](this, panel, state);  // a promise where the step runs the model again
    paint(panel);
    const edited = this.editedLine();
    if (edited) panel.querySelector("h3").after(edited);
    const parts = [
      element("p", { class: "inside-message", role: "status", text: this.notes.join("; ") }),
      this.overview(steps, state),
      this.stepTabs(steps, state),
      this.windowLine(state),
      this.tokenStrip(state),
      this.layerAndHead(state),
      panel,
    ];
    this.root.replaceChildren(...parts.filter((part) => part !== null));
    if (this.lit !== undefined) light(this, this.lit);
    this.notes = [];
    this.root.dataset.milliseconds = (performance.now() - started).toFixed(1);
    this.options.onChange?.(this.state);
    if (!(drawn instanceof Promise)) {
      this.root.dataset.state = "done";
      return;
    }
    this.root.dataset.state = "running";
    drawn.catch((failure) => panel.append(paragraph(`the model could not run: ${failure.message}`))).then(() => {
      if (this.state !== state) return;  // the reader has moved on: that view is drawn already
      paint(panel);
      this.root.dataset.state = "done";
    });
  }

  // What each head does, on the window shown (gptlite.heads' scores; inside_data.js's headScores), the clean model's:
  // a promise, made once a window.
  headReport() {
    const ids = Array.from(this.trace.ids, Number);
    const key = `${this.trace.window_start}:${ids.join(".")}`;
    if (this.report?.key !== key) {
      const report = { key, result: null };
      report.promise = this.options.scoreHeads(ids).then((result) => (report.result = result));
      this.report = report;
    }
    return this.report;
  }

  // The model at a glance, where the step shown sits marked: the input, each block's attention and feed-forward,
  // the output; a part chosen opens its first step (a block's, at that layer).
  overview(steps, state) {
    const firstLayerStep = steps.findIndex((step) => step.layer);
    const partOf = (step, index) => step.layer ? (step.id.startsWith("feed_forward") ? "feed-forward" : "attention")
      : index < firstLayerStep ? "input" : "output";
    const chosen = steps.findIndex((step) => step.id === state.step);
    const here = partOf(steps[chosen], chosen);
    const part = (name, layer = null) => {
      const first = steps.find((step, index) => partOf(step, index) === name);
      const marked = here === name && (layer === null || layer === state.layer);
      return element("button", { class: `part${marked ? " here" : ""}`, "aria-current": marked ? "step" : "false",
        "data-part": layer === null ? name : `${layer}.${name}`, text: name,
        onclick: () => this.go({ step: first.id, ...(layer === null ? {} : { layer }) }, '[aria-current="step"]') });
    };
    const blocks = Array.from({ length: this.trace.shape.n_layer }, (_, layer) => element("span", { class: "block" },
      `block ${layer}: `, part("attention", layer), part("feed-forward", layer)));
    return element("nav", { class: "overview", "aria-label": "the model" }, part("input"), " → ",
      ...blocks.flatMap((block) => [block, " → "]), part("output"));
  }

  // The steps as tabs, the arrow keys moving among them.
  stepTabs(steps, state) {
    const nav = element("div", { class: "steps", role: "tablist", "aria-label": "steps" });
    const focused = '[role=tab][tabindex="0"]';
    steps.forEach((step, index) => {
      const chosen = step.id === state.step;
      nav.append(
        element("button", {
          role: "tab",
          "aria-selected": String(chosen),
          tabindex: chosen ? "0" : "-1",
          "data-step": step.id,
          text: step.title,
          onclick: () => this.go({ step: step.id }, focused),
          onkeydown: (event) =>
            this.arrows(event, steps.length, index, (next) => this.go({ step: steps[next].id }, focused)),
        })
      );
    });
    return nav;
  }

  // The whole text's tokens, those outside the window traced dimmed, the arrow keys moving among them.
  tokenStrip(state) {
    const tokens = element("div", { class: "tokens", role: "listbox", "aria-label": "tokens" });
    const textIds = this.textIds();
    const chosenPosition = this.position(state.token);
    const first = this.position(0);
    const focused = '[role=option][tabindex="0"]';
    textIds.forEach((id, position) => {
      const chosen = position === chosenPosition;
      const inWindow = position >= first && position < first + this.trace.ids.length;
      tokens.append(
        element("span", {
          role: "option",
          class: `token${chosen ? " chosen" : ""}${inWindow ? "" : " outside"}`,
          tabindex: chosen ? "0" : "-1",
          "aria-selected": String(chosen),
          "data-token": String(position),
          title: `token ${position}: id ${id}${inWindow ? "" : " (outside the window traced: choose it to trace its own)"}`,
          text: shown(this.options.piece(id)),
          onclick: () => this.goTo(position, focused),
          onkeydown: (event) => this.arrows(event, textIds.length, position, (next) => this.goTo(next, focused)),
        })
      );
    });
    return tokens;
  }

  layerAndHead(state) {
    const { n_layer: layers, n_head: heads } = this.trace.shape;
    const layer = element("select", {
      "aria-label": "layer",
      onchange: (event) => this.go({ layer: Number(event.target.value) }, '[aria-label="layer"]'),
    });
    for (let i = 0; i < layers; i++) layer.append(new Option(`layer ${i}`, i, false, i === state.layer));
    const head = element("select", {
      "aria-label": "head",
      onchange: (event) => this.go({ head: Number(event.target.value) }, '[aria-label="head"]'),
    });
    for (let i = 0; i < heads; i++) head.append(new Option(`head ${i}`, i, false, i === state.head));
    return element("div", { class: "choices" }, layer, " ", head);
  }

  // A line saying which heads are knocked out, or null.
  editedLine() {
    if (!this.ablated.length) return null;
    return element("p", { class: "edited", role: "note", text: `Edited model: ` +
      `head${this.ablated.length > 1 ? "s" : ""} ${ablatedText(this.ablated)} ` +
      "(layer.head) knocked out; every number below is the edited model's." });
  }

  // For a text longer than the window traced, a line saying which window it is, or null.
  windowLine(state) {
    const count = this.textIds().length;
    const first = this.position(0);
    const last = first + this.trace.ids.length - 1;
    if (count <= this.trace.ids.length) return null;
    return paragraph(`The text is ${count} tokens; the model reads at most ${this.trace.shape.block_size} at once. ` +
      `Shown: tokens ${first} to ${last}, the window the writer read for token ${this.position(state.token)}` +
      (first > 0 ? ` (the tokens before ${last} here see fewer tokens than the writer did: choose one to trace its ` +
        "own window)." : "."));
  }

  // A new state; `refocus`, the selector of what keeps the keyboard's focus (the view is drawn anew).
  go(change, refocus) {
    this.render({ ...this.state, ...change });
    if (refocus) this.root.querySelector(refocus)?.focus();
  }

  // The token at `position` of the whole text: in the trace shown where that trace is the window the writer read
  // for it, else in that window, traced anew.
  async goTo(position, refocus) {
    const start = this.trace.window_start;
    const { end } = writerWindow(position, this.textIds().length, this.trace.shape.block_size);
    if (!this.options.retrace || !this.options.textIds || end === start + this.trace.ids.length) {
      this.go({ token: position - (this.options.textIds ? start : 0) }, refocus);
      return;
    }
    await this.traced(this.options.retrace(position, this.ablated), position, refocus);
  }

  // Knock head `head` of `layer` out, or back in, and show the edited model's trace.
  async toggleHead(layer, head, refocus) {
    const others = this.ablated.filter(([l, h]) => l !== layer || h !== head);
    const ablated = others.length < this.ablated.length ? others : [...others, [layer, head]];
    ablated.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const position = this.position(this.state.token);
    const before = this.ablated;
    this.ablated = ablated;
    await this.traced(this.options.retrace(position, ablated), position, refocus, before);
  }

  // Show the trace `promise` gives at the text's `position`; if it fails, the trace shown stays, with a line saying
  // why (a knocked-out head then stays as it was).
  async traced(promise, position, refocus, ablatedBefore = this.ablated) {
    this.root.dataset.state = "tracing";
    try {
      this.trace = await promise;
    } catch (failure) {
      this.notes.push(`the model could not be traced: ${failure.message}`);
      this.ablated = ablatedBefore;
      this.go({}, refocus);
      return;
    }
    this.go({ token: position - (this.options.textIds ? this.trace.window_start : 0) }, refocus);
  }

  // Arrow keys move among `count` items from `index` (Home and End to the ends).
  arrows(event, count, index, move) {
    const next = {
      ArrowRight: index + 1,
      ArrowDown: index + 1,
      ArrowLeft: index - 1,
      ArrowUp: index - 1,
      Home: 0,
      End: count - 1,
    }[event.key];
    if (next === undefined) return;
    event.preventDefault();
    move(Math.min(Math.max(next, 0), count - 1));
  }

  // --- what the view shows, as plain JSON (window.gptliteInside)

  contract() {
    const { token, layer, head, step } = this.state;
    const layerSteps = this.trace.layers[layer];
    const scores = Array.from(at(layerSteps.scores, head, token)).slice(0, token + 1);
    const attention = Array.from(at(layerSteps.attention, head, token));
    const { probabilities, drawn } = this.probabilities(token);
    const order = Array.from(probabilities.keys())
      .filter((id) => probabilities[id] > 0)
      .sort((a, b) => probabilities[b] - probabilities[a])
      .slice(0, 50);
    const steps = this.trace.steps;
    const neighbours = Array.from(at(steps.neighbours_cosine_ids, token), Number).map((id, i) => ({
      id,
      token: this.options.piece(id),
      cosine: at(steps.neighbours_cosine, token)[i],
    }));
    const cross = layerSteps.cross_attention
      ? {
          source_ids: Array.from(this.trace.source_ids, Number),
          cross_attention: Array.from(at(layerSteps.cross_attention, head, token)),
          // every source position through the head's cross-attention, as `rows` follows the text's
          cross_rows: attentionRows(this.trace, layer, head, token, "cross_").map((row) => ({ ...row,
            token: this.options.piece(row.id) })),
        }
      : {};
    return {
      token,
      layer,
      head,
      step,
      position: this.position(token),
      ids: Array.from(this.trace.ids, Number),
      window_start: this.trace.window_start,
      scores,
      attention,
      ...cross,
      settings: { ...this.live },
      probabilities: order.map((id) => ({ id, token: this.options.piece(id), probability: probabilities[id] })),
      neighbours,
      drawn: drawn === null ? null : { id: drawn, token: this.options.piece(drawn) },
      // every visible position through the head (inside_data.js: contribution is |weight x value|)
      rows: attentionRows(this.trace, layer, head, token).map((row) => ({ ...row, token: this.options.piece(row.id) })),
      matrix: attentionMatrix(this.trace, layer, head),
      ablated: this.ablated.map(([l, h]) => [l, h]),
      heads: this.report?.result ?? null,
      link: this.options.link?.() ?? null,
    };
  }

  // The next-token probabilities at `token` after the live settings, over the whole vocabulary, and the token the
  // seeded draw picks there: the draw the writer made for new token `produced` (window position and prompt).
  probabilities(token) {
    const ids = this.trace.ids;
    const seen = new Set(Array.from(ids.slice(0, token + 1), Number));
    const logits = at(this.trace.steps.logits, token);
    const probabilities = nextTokenProbabilities(logits, this.live, seen);
    const produced = this.trace.window_start + token + 1 - (this.options.promptLength ?? ids.length);
    const seed = this.options.settings?.seed;
    let drawn = null;
    if (seed != null && produced >= 0) {
      // the writer's own draw, with its noise for that token
      const noise = this.live.temperature === 0 ? null : uniformNoise(rowSeed(seed), produced, logits.length);
      drawn = sampleNext(logits, this.live, noise, seen);
    }
    return { probabilities, drawn, produced };
  }

  // --- the steps

}
