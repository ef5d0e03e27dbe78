// The Inside view: one token of a text walked through the model, step by step, with the model's own numbers.
//
// It shows a trace: gptlite.trace's (Python, `Trace.to_json`) or the page's inside graph's (gptlite.js
// `Explainer`), the same object either way: {ids, window_start, shape, steps: {name: {dims, data}},
// layers: [{name: {dims, data}}]}. It computes nothing of the model: every number is the trace's, except the
// probabilities after the sampling settings, which it takes from the sampler the page writes with.
import { nextTokenProbabilities, rowSeed, sampleNext, settingOf, uniformNoise } from "./gptlite.js";
import { ablatedText, at, attentionMatrix, attentionRows, writerWindow } from "./inside_data.js";

const HEAD_COLOURS = ["#d6452b", "#2f6fd6", "#1f9e55", "#a23fc4", "#d68a1a", "#178c8c", "#c43f7c", "#6b6b1f"];

const shown = (text) => text.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥") || "∅";
const number = (v) => (Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : v.toFixed(4));

function element(tag, attributes = {}, ...children) {
  const made = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "text") made.textContent = value;
    else if (name.startsWith("on")) made[name] = value;
    else made.setAttribute(name, value);
  }
  made.append(...children.filter((child) => child != null));
  return made;
}

// One diverging colour scale for the whole view: blue below zero, white at zero, red above, full at ±largest.
function colour(value, largest) {
  const share = largest > 0 ? Math.min(Math.abs(value) / largest, 1) : 0;
  return value >= 0 ? `rgba(214,69,43,${share.toFixed(3)})` : `rgba(47,111,214,${share.toFixed(3)})`;
}

// A vector as a strip of cells, coloured once the step is drawn (`paint`, one scale for every strip of the step),
// each value on hover and all of them under "numbers" (a tap on a phone). `name(i)` names entry i.
function strip(values, label, name = (i) => `${label}[${i}]`) {
  const cells = element("div", { class: "strip", role: "img", "aria-label": `${label}: ${values.length} numbers` });
  values.forEach((v, i) => cells.append(element("span", { title: `${name(i)} = ${number(v)}` })));
  cells.values = values;
  const numbers = element("details", { class: "numbers" }, element("summary", { text: "numbers" }));
  numbers.ontoggle = () => {
    if (numbers.open && numbers.childElementCount === 1)
      numbers.append(element("code", { text: Array.from(values, (v, i) => `${name(i)} ${number(v)}`).join("  ") }));
  };
  return element("div", { class: "vector" }, element("span", { class: "label", text: label }), cells, numbers);
}

// Colour every strip of `panel` on one scale, the largest magnitude among them, and say so in a legend.
function paint(panel) {
  const strips = Array.from(panel.querySelectorAll(".strip"));
  if (!strips.length) return;
  let largest = 0;
  for (const { values } of strips) for (const v of values) largest = Math.max(largest, Math.abs(v));
  for (const { values, children } of strips) {
    Array.from(children).forEach((cell, i) => (cell.style.background = colour(values[i], largest)));
  }
  const legend = element("p", { class: "legend" },
    element("span", { class: "scale", "aria-hidden": "true" }),
    ` blue below 0, white at 0, red above; one scale for every vector here, full colour at ±${number(largest)}`);
  panel.querySelector("h3").after(legend);
}

// Tokens with a value each, as chips with a bar as long as the value's size (red above 0, blue below): scores,
// weights, probabilities.
function chips(rows, options = {}) {
  const list = element("div", { class: "chips" });
  let largest = 0;
  for (const row of rows) if (Number.isFinite(row.value)) largest = Math.max(largest, Math.abs(row.value));
  for (const row of rows) {
    const share = options.bars && largest > 0 && Number.isFinite(row.value) ? Math.abs(row.value) / largest : 0;
    const bar = row.value < 0 ? "rgba(47,111,214,.35)" : "rgba(214,69,43,.35)";
    list.append(
      element(
        "span",
        {
          class: `chip${row.masked ? " masked" : ""}${row.chosen ? " chosen" : ""}`,
          style: `background:linear-gradient(90deg, ${bar} ${(share * 100).toFixed(1)}%, transparent 0)`,
          title: row.title ?? "",
        },
        element("b", { text: row.label }),
        ` ${row.text ?? number(row.value)}`
      )
    );
  }
  return list;
}

// Words Python declares for the middle of a sentence, as a sentence's start.
const capitalised = (text) => text.charAt(0).toUpperCase() + text.slice(1);

function paragraph(text) {
  return element("p", { text });
}

// --- the view

export class InsideView {
  // root: the element the view fills (its data-state says "done" once a step is shown); options: piece(id) (a
  // token's text), sampling (config.json's sampling settings), inside (what Python declares of the view: its steps
  // `views`, the `live` settings, the model's `choices` in words; gptlite/inside/views.py), settings (what the
  // writing used, seed included), promptLength (the ids before the written ones), onChange(state) (each new state).
  // A page that can trace again gives too: textIds (the whole text's ids, of which a trace is one window),
  // retrace(position, ablated) (a promise of the trace that shows the text's `position` as the writer read it, the
  // heads `ablated` knocked out), ablated (the heads the trace shown has knocked out) and link() (the address of
  // what is shown).
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
    return this.declared.views.filter((step) => !step.needs || step.needs in this.trace.layers[0]);
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
    const { trace, options } = this;
    const shape = trace.shape;
    const nav = element("div", { class: "steps", role: "tablist", "aria-label": "steps" });
    const steps = this.steps();
    steps.forEach((step, index) => {
      const chosen = step.id === state.step;
      nav.append(
        element("button", {
          role: "tab",
          "aria-selected": String(chosen),
          tabindex: chosen ? "0" : "-1",
          "data-step": step.id,
          text: step.title,
          onclick: () => this.go({ step: step.id }, '[role=tab][tabindex="0"]'),
          onkeydown: (event) =>
            this.arrows(event, steps.length, index, (next) =>
              this.go({ step: steps[next].id }, '[role=tab][tabindex="0"]')
            ),
        })
      );
    });
    const tokens = element("div", { class: "tokens", role: "listbox", "aria-label": "tokens" });
    const textIds = this.textIds();
    const chosenPosition = this.position(state.token);
    const first = this.position(0);
    const focused = '[role=option][tabindex="0"]';
    textIds.forEach((id, position) => {
      const chosen = position === chosenPosition;
      const inWindow = position >= first && position < first + trace.ids.length;
      tokens.append(
        element("span", {
          role: "option",
          class: `token${chosen ? " chosen" : ""}${inWindow ? "" : " outside"}`,
          tabindex: chosen ? "0" : "-1",
          "aria-selected": String(chosen),
          "data-token": String(position),
          title: `token ${position}: id ${id}${inWindow ? "" : " (outside the window traced: choose it to trace its own)"}`,
          text: shown(options.piece(id)),
          onclick: () => this.goTo(position, focused),
          onkeydown: (event) => this.arrows(event, textIds.length, position, (next) => this.goTo(next, focused)),
        })
      );
    });
    const layer = element("select", {
      "aria-label": "layer",
      onchange: (event) => this.go({ layer: Number(event.target.value) }, '[aria-label="layer"]'),
    });
    for (let i = 0; i < shape.n_layer; i++) layer.append(new Option(`layer ${i}`, i, false, i === state.layer));
    const head = element("select", {
      "aria-label": "head",
      onchange: (event) => this.go({ head: Number(event.target.value) }, '[aria-label="head"]'),
    });
    for (let i = 0; i < shape.n_head; i++) head.append(new Option(`head ${i}`, i, false, i === state.head));
    const step = steps.find((s) => s.id === state.step);
    const panel = element(
      "section",
      { class: "step", "aria-live": "polite" },
      element("h3", {
        text: `${step.title}${step.layer ? ` · layer ${state.layer}, head ${state.head}` : ""} · token ` +
          `${this.position(state.token)} ${JSON.stringify(options.piece(trace.ids[state.token]))}`,
      })
    );
    this[`draw_${step.id}`](panel, state);
    paint(panel);
    const edited = this.ablated.length
      ? element("p", { class: "edited", role: "note", text: `Edited model: heads ${ablatedText(this.ablated)} ` +
          "(layer.head) knocked out; every number below is the edited model's." })
      : null;
    const windowLine = textIds.length > trace.ids.length
      ? paragraph(`The text is ${textIds.length} tokens; the model reads at most ${trace.shape.block_size} at once. ` +
          `Shown: tokens ${first} to ${first + trace.ids.length - 1}, the window the writer read for token ` +
          `${this.position(state.token)}${first > 0 && state.token < trace.ids.length - 1 ? " (the others here see " +
          "fewer tokens than the writer did: choose one to trace its own window)" : ""}.`)
      : null;
    const parts = [
      element("p", { class: "inside-message", role: "status", text: this.notes.join("; ") }),
      edited,
      nav,
      windowLine,
      tokens,
      element("div", { class: "choices" }, layer, " ", head),
      panel,
    ];
    this.root.replaceChildren(...parts.filter((part) => part !== null));
    this.notes = [];
    this.root.dataset.state = "done";
    this.root.dataset.milliseconds = (performance.now() - started).toFixed(1);
    options.onChange?.(this.state);
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

  draw_tokens(panel, { token }) {
    const { trace, options } = this;
    panel.append(
      paragraph(
        `The text as the model reads it: ${trace.ids.length} tokens, each a number (its id) in a ` +
          `vocabulary of ${trace.shape.vocab_size}. The model reads at most ${trace.shape.block_size} tokens at once` +
          (trace.window_start
            ? `, so this text is read as tokens ${trace.window_start} to ${trace.window_start + trace.ids.length - 1} ` +
              `(the ${trace.window_start} before them are left out).`
            : ".") +
          " Choose a token: the steps below follow it through the model."
      ),
      chips(
        Array.from(trace.ids, (id, index) => ({
          label: shown(options.piece(id)),
          text: `#${id}`,
          chosen: index === token,
          title: `token ${this.position(index)}`,
        }))
      )
    );
  }

  draw_embedding(panel, { token }) {
    const steps = this.trace.steps;
    const id = this.trace.ids[token];
    panel.append(
      paragraph(
        `Token ${JSON.stringify(this.options.piece(id))} (id ${id}) becomes row ${id} of the ` +
          `token table: a vector of ${this.trace.shape.n_embd} numbers that training learned.`
      ),
      strip(at(steps.token_embedding, token), "token vector")
    );
    for (const [by, title] of [
      ["cosine", "Nearest by cosine similarity (the angle between the vectors)"],
      ["dot", "Nearest by dot product (the angle, and the lengths)"],
    ]) {
      const values = at(steps[`neighbours_${by}`], token);
      panel.append(
        element("h4", { text: title }),
        chips(
          Array.from(at(steps[`neighbours_${by}_ids`], token), Number).map((other, i) => ({
            label: shown(this.options.piece(other)),
            value: values[i],
          })),
          { bars: true }
        )
      );
    }
  }

  draw_position(panel, { token }) {
    const { steps, shape } = this.trace;
    if (shape.position === "rotary") {
      const angles = at(steps.rotary_angles, token);
      panel.append(
        paragraph(
          `Positions: ${this.declared.choices.position}. Dimension i and i + ${shape.head_size / 2} of a head form ` +
            `a pair, and at position ${token} pair i turns by ${token} / ${shape.rope_theta}^(2i/${shape.head_size}) ` +
            "radians."
        ),
        chips(
          Array.from(angles, (angle, i) => ({
            label: `pair ${i}`,
            text: `${number(angle)} rad (${(((angle * 180) / Math.PI) % 360).toFixed(1)}°)`,
            value: angle,
          }))
        ),
        strip(at(steps.embedding, token), "what the first block reads (the token vector)")
      );
      return;
    }
    panel.append(
      paragraph(
        `Positions: ${this.declared.choices.position}. Position ${token} adds row ${token} to the token vector; ` +
          "the sum is what the first block reads."
      ),
      strip(at(steps.token_embedding, token), "token vector"),
      strip(at(steps.position, token), `position ${token}`),
      strip(at(steps.embedding, token), "sum"),
      this.table(steps.position_table, token)
    );
  }

  // A table (rows, columns) drawn as an image, row `marked` outlined: the position table.
  table(array, marked) {
    const [rows, columns] = array.dims;
    const canvas = element("canvas", {
      width: columns,
      height: rows,
      class: "table",
      "aria-label": `the position table, ${rows} positions by ${columns} numbers, row ${marked} marked`,
    });
    const context = canvas.getContext("2d");
    const image = context.createImageData(columns, rows);
    let largest = 0;
    for (const v of array.data) largest = Math.max(largest, Math.abs(v));
    array.data.forEach((v, i) => {
      const share = largest ? Math.abs(v) / largest : 0;
      const [r, g, b] = v >= 0 ? [214, 69, 43] : [47, 111, 214];
      const mark = Math.floor(i / columns) === marked;
      image.data.set(
        mark ? [0, 0, 0, 255] : [255 - share * (255 - r), 255 - share * (255 - g), 255 - share * (255 - b), 255],
        i * 4
      );
    });
    context.putImageData(image, 0, 0);
    return canvas;
  }

  norm_said() {
    return this.declared.choices.norm;
  }

  draw_norm(panel, { token, layer }) {
    const steps = this.trace.layers[layer];
    if (this.trace.shape.norm_position === "post") {
      panel.append(
        paragraph(
          `This model is post-norm: ${this.declared.choices.norm_position}. Its norm is ${this.norm_said()} ` +
            "(see Residual)."
        ),
        strip(at(steps.input, token), "block input")
      );
      return;
    }
    panel.append(
      paragraph(`This model is pre-norm: ${this.declared.choices.norm_position}. Before attention, the vector ` +
        `is normalised: ${this.norm_said()}.`),
      strip(at(steps.input, token), "block input"),
      strip(at(steps.attention_normed, token), "normalised")
    );
  }

  kv_head(head) {
    const shape = this.trace.shape;
    return Math.floor(head / (shape.n_head / shape.kv_heads));
  }

  draw_qkv(panel, { token, layer, head }) {
    const { shape } = this.trace;
    const steps = this.trace.layers[layer];
    const kv = this.kv_head(head);
    const group = shape.n_head / shape.kv_heads;
    panel.append(
      paragraph(
        `Three matrices turn the normalised vector into a query (what this token looks for), a key ` +
          `(what it offers to be found by) and a value (what it passes on), ${shape.head_size} numbers each per head.`
      )
    );
    if (group > 1) {
      const sharing = Array.from({ length: group }, (_, g) => kv * group + g).join(", ");
      panel.append(
        paragraph(
          `${capitalised(this.declared.choices.grouped_query)}. Here ${shape.n_head} query heads share ` +
            `${shape.kv_heads} key/value heads; query heads ${sharing} read key/value head ${kv}.`
        )
      );
    }
    panel.append(
      strip(at(steps.query, head, token), `query (head ${head})`),
      strip(at(steps.key, kv, token), `key (head ${kv})`),
      strip(at(steps.value, kv, token), `value (head ${kv})`),
      element("h4", { text: `Every visible token's key (rows 0 to ${token})` })
    );
    for (let s = 0; s <= token; s++)
      panel.append(strip(at(steps.key, kv, s), `${this.position(s)} ${shown(this.options.piece(this.trace.ids[s]))}`));
    panel.append(element("h4", { text: `Every visible token's value (rows 0 to ${token})` }));
    for (let s = 0; s <= token; s++)
      panel.append(strip(at(steps.value, kv, s), `${this.position(s)} ${shown(this.options.piece(this.trace.ids[s]))}`));
  }

  draw_qk_norm(panel, { token, layer, head }) {
    const steps = this.trace.layers[layer];
    const kv = this.kv_head(head);
    panel.append(
      paragraph(`${capitalised(this.declared.choices.qk_norm)}.`),
      strip(at(steps.query, head, token), "query"),
      strip(at(steps.query_normed, head, token), "query, normalised"),
      strip(at(steps.key, kv, token), "key"),
      strip(at(steps.key_normed, kv, token), "key, normalised")
    );
  }

  draw_rotary(panel, { token, layer, head }) {
    const steps = this.trace.layers[layer];
    const kv = this.kv_head(head);
    const before = steps.query_normed ? "_normed" : "";
    panel.append(
      paragraph(
        `The query and key are turned by the angles of position ${token} (see Position): pair i ` +
          `(dimensions i and i + ${this.trace.shape.head_size / 2}) by its own angle.`
      ),
      strip(at(steps[`query${before}`], head, token), "query before"),
      strip(at(steps.query_rotated, head, token), "query turned"),
      strip(at(steps[`key${before}`], kv, token), "key before"),
      strip(at(steps.key_rotated, kv, token), "key turned")
    );
  }

  visible_chips(values, token, options = {}) {
    return chips(
      Array.from(values, (value, s) => ({
        label: `${this.position(s)} ${shown(this.options.piece(this.trace.ids[s]))}`,
        value,
        masked: s > token,
        text: s > token ? (options.maskedText ?? number(value)) : undefined,
      })),
      { bars: options.bars }
    );
  }

  draw_scores(panel, { token, layer, head }) {
    const size = this.trace.shape.head_size;
    const steps = this.trace.layers[layer];
    const products = at(steps.products, head, token).slice(0, token + 1);
    const scaled = at(steps.scores, head, token).slice(0, token + 1);
    panel.append(
      paragraph(
        `The query meets every visible token's key: their dot product q·k says how well they match. ` +
          `Each is divided by √${size} = ${Math.sqrt(size).toFixed(4)} (the square root of the head's width), so that ` +
          `wider heads do not give larger scores.`
      ),
      paragraph(`For this token itself: q·k = ${number(products[token])}, and ${number(products[token])} / ` +
        `√${size} = ${number(products[token])} / ${number(Math.sqrt(size))} = ${number(scaled[token])}.`),
      element("h4", { text: "q·k, over the tokens up to this one" }),
      this.visible_chips(products, token, { bars: true }),
      element("h4", { text: `q·k / √${size}` }),
      this.visible_chips(scaled, token, { bars: true }),
      element("h4", { text: "Follow each token from its key to what it gives this token" }),
      this.rowsTable(layer, head, token)
    );
  }

  // One row per visible token through this head: q·k = |q| |k| cos θ, ÷ √d, the softmax's e^(x − max) and weight,
  // and the length of weight × value, what the token gives the output.
  rowsTable(layer, head, token) {
    const size = this.trace.shape.head_size;
    const heads = ["token", "q·k", "|q|", "|k|", "cos θ", `÷ √${size}`, "e^(x − max)", "weight", "|weight × v|"];
    const table = element("table", { class: "rows" },
      element("thead", {}, element("tr", {}, ...heads.map((text) => element("th", { scope: "col", text })))));
    const body = element("tbody");
    for (const row of attentionRows(this.trace, layer, head, token)) {
      const cells = [row.product, row.query_length, row.key_length, row.cosine, row.scaled, row.exponent, row.weight,
        row.contribution].map((value) => element("td", { text: number(value) }));
      body.append(element("tr", {}, element("th", { scope: "row",
        text: `${this.position(row.position)} ${shown(this.options.piece(row.id))}` }), ...cells));
    }
    table.append(body);
    return element("div", { class: "table-scroll" }, table);
  }

  draw_mask(panel, { token, layer, head }) {
    const scores = at(this.trace.layers[layer].scores, head, token);
    panel.append(
      paragraph(
        `The causal mask: a token may not look ahead. The scores of tokens after ${this.position(token)} are set ` +
          "to minus infinity (shown masked), so the softmax gives them nothing."
      ),
      this.visible_chips(scores, token, { maskedText: "masked" })
    );
  }

  draw_softmax(panel, { token, layer, head }) {
    const weights = at(this.trace.layers[layer].attention, head, token);
    let total = 0;
    for (const w of weights) total += w;
    panel.append(
      paragraph(
        `Softmax turns the scores into weights: each is e^score over the sum of them all. The row ` +
          `sums to ${total.toFixed(6)}; the masked tokens get exactly 0.`
      ),
      this.visible_chips(weights, token, { bars: true }),
      element("h4", { text: "Every head of this layer, side by side (one strip a head, a cell a token)" })
    );
    const every = this.trace.layers[layer].attention;
    for (let h = 0; h < every.dims[0]; h++) panel.append(strip(at(every, h, token), `head ${h}`));
    panel.append(
      element("h4", { text: "Each head's whole attention: a row per token, a column per token it reads" }),
      paragraph("White is 0 and red is 1; the hatched triangle is masked (a token never reads a later one); this " +
        "token's row is outlined. Choose a head to open it."),
      element("div", { class: "matrices" }, ...Array.from({ length: every.dims[0] }, (_, h) =>
        this.matrixPicture(layer, h, token, h === head)))
    );
  }

  // Head `head`'s T x T attention as a picture, the masked triangle hatched and row `token` outlined; a button that
  // opens that head.
  matrixPicture(layer, head, token, chosen) {
    const rows = attentionMatrix(this.trace, layer, head);
    const count = rows.length;
    const cell = Math.max(2, Math.floor(160 / count));
    const canvas = element("canvas", { width: count * cell, height: count * cell, "aria-hidden": "true" });
    const context = canvas.getContext("2d");
    rows.forEach((row, t) => row.forEach((weight, s) => {
      context.fillStyle = s > t ? ((s + t) % 2 ? "#e4e4e4" : "#f4f4f4") : colour(weight, 1);
      context.fillRect(s * cell, t * cell, cell, cell);
    }));
    context.strokeStyle = "#000";
    context.lineWidth = Math.max(1, cell / 3);
    context.strokeRect(0, token * cell, (token + 1) * cell, cell);
    return element("button", { class: `matrix${chosen ? " chosen" : ""}`, "aria-pressed": String(chosen),
      "aria-label": `head ${head}'s attention matrix, ${count} by ${count}`, "data-matrix": String(head),
      onclick: () => this.go({ head }, `[data-matrix="${head}"]`) }, canvas, element("span", { text: `head ${head}` }));
  }

  draw_values(panel, { token, layer, head }) {
    const steps = this.trace.layers[layer];
    const weights = at(steps.attention, head, token);
    const order = Array.from(weights.keys())
      .filter((s) => s <= token)
      .sort((a, b) => weights[b] - weights[a])
      .slice(0, 5);
    panel.append(
      paragraph(
        "The head's output is the weighted sum of the visible tokens' values: Σ weight × value. The " +
          `tokens it takes most from: ${order
            .map(
              (s) =>
                `${this.position(s)} ${JSON.stringify(this.options.piece(this.trace.ids[s]))} ` + `(${(weights[s] * 100).toFixed(1)}%)`
            )
            .join(", ")}.`
      ),
      strip(at(steps.heads, head, token), `head ${head}'s output`)
    );
  }

  draw_heads(panel, { token, layer }) {
    const steps = this.trace.layers[layer];
    const { n_head: heads } = this.trace.shape;
    panel.append(
      paragraph(
        `The ${heads} heads' outputs are joined side by side, and one more matrix (the output ` +
          "projection) mixes them back into the model's width."
      )
    );
    for (let h = 0; h < heads; h++) panel.append(strip(at(steps.heads, h, token), `head ${h}`));
    panel.append(strip(at(steps.joined, token), "joined"), strip(at(steps.attention_output, token), "projected"));
    if (this.options.retrace) panel.append(this.knockOuts(layer));
  }

  // A switch per head of `layer` that knocks it out (its output scaled by 0 in the inside graph) or back in.
  knockOuts(layer) {
    const switches = element("fieldset", { class: "knock-out" }, element("legend", {
      text: "Knock a head out: the model runs again without it, and every step shows the edited model" }));
    for (let head = 0; head < this.trace.shape.n_head; head++) {
      const out = this.ablated.some(([l, h]) => l === layer && h === head);
      const box = element("input", { type: "checkbox", "data-knock-out": `${layer}.${head}`,
        onchange: () => this.toggleHead(layer, head, `[data-knock-out="${layer}.${head}"]`) });
      box.checked = out;
      switches.append(element("label", {}, box, ` head ${head}`));
    }
    return switches;
  }

  draw_residual(panel, { token, layer }) {
    const steps = this.trace.layers[layer];
    const post = this.trace.shape.norm_position === "post";
    panel.append(
      paragraph(
        "Attention's output is added to the vector it read (the residual stream): the block " +
          `changes the vector rather than replacing it${post ? `, and the sum is normalised (${this.norm_said()})` : ""}.`
      ),
      strip(at(steps.input, token), "block input"),
      strip(at(steps.attention_output, token), "attention's output"),
      strip(at(steps.attention_residual, token), post ? "sum, normalised" : "sum")
    );
  }

  draw_cross(panel, { token, layer, head }) {
    const steps = this.trace.layers[layer];
    const source = Array.from(this.trace.source_ids, Number);
    const weights = at(steps.cross_attention, head, token);
    panel.append(
      paragraph(
        "Cross-attention: the decoder's query meets the keys and values the encoder made of every " +
          `token of the source (${source.length} of them; no mask: the whole source is there to read). Its weights, then ` +
          "this token's self-attention over the target beside them:"
      ),
      element("h4", { text: "over the source" }),
      chips(
        Array.from(weights, (value, s) => ({
          label: `${s} ${shown(this.options.piece(source[s]))}`,
          value,
        })),
        { bars: true }
      ),
      element("h4", { text: "over the target so far (self-attention)" }),
      this.visible_chips(at(steps.attention, head, token), token, { bars: true }),
      strip(at(steps.cross_heads, head, token), `head ${head}'s output`),
      strip(at(steps.cross_output, token), "projected"),
      strip(at(steps.cross_residual, token), "added to the residual stream")
    );
  }

  draw_feed_forward(panel, { token, layer }) {
    const steps = this.trace.layers[layer];
    const kind = this.declared.choices.mlp;
    const hidden = at(steps.hidden, token);
    const order = Array.from(hidden.keys())
      .sort((a, b) => Math.abs(hidden[b]) - Math.abs(hidden[a]))
      .slice(0, 10);
    panel.append(
      paragraph(
        `The feed-forward works on each token alone: it widens the vector to ${hidden.length} ` +
          `numbers, applies ${kind}, and narrows it back.`
      )
    );
    if (steps.feed_forward_normed) panel.append(strip(at(steps.feed_forward_normed, token), "normalised input"));
    if (steps.gate) panel.append(strip(at(steps.gate, token), "gate"), strip(at(steps.up, token), "up"));
    else panel.append(strip(at(steps.expanded, token), "widened"));
    panel.append(
      strip(hidden, "activations"),
      element("h4", { text: "The most active units" }),
      chips(
        order.map((unit) => ({ label: `unit ${unit}`, value: hidden[unit] })),
        { bars: true }
      ),
      strip(at(steps.feed_forward_output, token), "output")
    );
  }

  draw_feed_forward_residual(panel, { token, layer }) {
    const steps = this.trace.layers[layer];
    const post = this.trace.shape.norm_position === "post";
    panel.append(
      paragraph(
        `The feed-forward's output is added to the residual stream${post ? ", and normalised" : ""}: ` +
          `the block's output, which the next block reads.`
      ),
      strip(at(steps.attention_residual, token), "after attention"),
      strip(at(steps.feed_forward_output, token), "feed-forward's output"),
      strip(at(steps.output, token), "block output")
    );
  }

  draw_final_norm(panel, { token }) {
    const { steps, shape } = this.trace;
    const last = this.trace.layers[shape.n_layer - 1];
    panel.append(
      paragraph(
        `This model is ${shape.norm_position}-norm: ${this.declared.choices.norm_position}` +
          (shape.norm_position === "post" ? ". The last block's output goes to the head as it is." :
            `. The last block's output is normalised once more: ${this.norm_said()}.`)
      ),
      strip(at(last.output, token), "last block's output"),
      strip(at(steps.final_normed, token), "to the head")
    );
  }

  draw_logits(panel, { token }) {
    const logits = at(this.trace.steps.logits, token);
    const order = Array.from(logits.keys())
      .sort((a, b) => logits[b] - logits[a])
      .slice(0, 10);
    panel.append(
      paragraph(
        `The head scores every one of the ${logits.length} tokens of the vocabulary as the next: ` +
          `${this.declared.choices.tie_weights}.`
      ),
      chips(
        order.map((id) => ({ label: shown(this.options.piece(id)), value: logits[id] })),
        { bars: true }
      )
    );
    if (logits.length <= 4096) {
      panel.append(strip(logits, "logits", (id) => `logit of ${JSON.stringify(this.options.piece(id))} (id ${id})`));
    }
  }

  draw_probabilities(panel, { token }) {
    const controls = element("div", { class: "live" });
    for (const name of this.declared.live) {
      const declared = this.options.sampling.find((s) => s.name === name);
      const input = element("input", {
        "aria-label": name,
        value: this.live[name] ?? "",
        placeholder: declared.empty ?? "",
        title: declared.help,
      });
      input.onchange = () => {
        const { value, error } = settingOf(declared, input.value);
        const refocus = `.live [aria-label="${name}"]`;
        if (error) {
          this.notes.push(error);
          this.go({}, refocus);
          return;
        }
        this.live[name] = value;
        this.go({}, refocus);
      };
      controls.append(element("label", {}, `${name.replace(/_/g, " ")} `, input));
    }
    const { probabilities, drawn, produced } = this.probabilities(token);
    const order = Array.from(probabilities.keys())
      .filter((id) => probabilities[id] > 0)
      .sort((a, b) => probabilities[b] - probabilities[a]);
    let total = 0;
    for (const p of probabilities) total += p;
    panel.append(
      paragraph(
        "Softmax over the whole vocabulary turns the logits into probabilities; the settings " +
          "reshape them as the writer does (the temperature divides the logits; top-k, top-p and min-p keep the likeliest; " +
          `the repetition penalty lowers tokens already seen). ${order.length} of ${probabilities.length} tokens are kept ` +
          `(their probabilities sum to ${total.toFixed(6)}).`
      ),
      controls,
      chips(
        order
          .slice(0, 20)
          .map((id) => ({
            label: shown(this.options.piece(id)),
            text: `${(probabilities[id] * 100).toFixed(2)}%`,
            value: probabilities[id],
          })),
        { bars: true }
      )
    );
    if (drawn !== null) {
      const written = this.textIds()[this.position(token) + 1];
      panel.append(
        paragraph(
          `With seed ${this.options.settings.seed}, the draw for new token ${produced} picks ` +
            `${JSON.stringify(this.options.piece(drawn))}` +
            (written !== undefined ? `; the writer wrote ` + `${JSON.stringify(this.options.piece(written))}.` : ".")
        )
      );
    }
  }

  draw_graph(panel, { token, layer }) {
    const { trace } = this;
    const weights = trace.layers[layer].attention;
    const [heads, length] = weights.dims;
    const line = 18;
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", `0 0 300 ${length * line + 8}`);
    svg.setAttribute("width", "300");
    svg.setAttribute("class", "graph");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", `layer ${layer}'s attention as arcs between tokens, one colour per head`);
    const y = (i) => i * line + 12;
    for (let h = 0; h < heads; h++) {
      for (let t = 0; t < length; t++) {
        const row = at(weights, h, t);
        for (let s = 0; s < t; s++) {
          if (row[s] < 0.1) continue;
          const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
          const bend = 150 - Math.min(140, (t - s) * 8);
          path.setAttribute("d", `M160 ${y(t)} C${bend} ${y(t)} ${bend} ${y(s)} 160 ${y(s)}`);
          path.setAttribute("stroke", HEAD_COLOURS[h % HEAD_COLOURS.length]);
          path.setAttribute("stroke-opacity", (t === token ? 1 : 0.35 * row[s]).toFixed(3));
          path.setAttribute("stroke-width", (t === token ? 2.5 : 1) * row[s] + 0.5);
          path.setAttribute("fill", "none");
          svg.append(path);
        }
      }
    }
    trace.ids.forEach((id, i) => {
      const text = document.createElementNS("http://www.w3.org/2000/svg", "text");
      text.setAttribute("x", 166);
      text.setAttribute("y", y(i) + 4);
      text.setAttribute("font-weight", i === token ? "bold" : "normal");
      text.textContent = `${this.position(i)} ${shown(this.options.piece(id))}`;
      svg.append(text);
    });
    const legend = Array.from({ length: heads }, (_, h) =>
      element("span", { style: `color:${HEAD_COLOURS[h % HEAD_COLOURS.length]}`, text: `■ head ${h} ` })
    );
    panel.append(
      paragraph(
        `Each token (right) with arcs to the earlier tokens it gives at least 10% of its attention in ` +
          `layer ${layer}, one colour per head; the chosen token's arcs are drawn dark.`
      ),
      element("p", {}, ...legend),
      svg
    );
  }
}
