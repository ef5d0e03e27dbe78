// The Inside view's pieces of drawing: a token's text, a number, an element, a vector as a strip of coloured
// cells, chips with bars, and the colour scale that every step shares with its legend. Each step's drawing
// (steps_input.js, steps_attention.js, steps_heads.js, steps_output.js) is made of them.

import { normalised } from "./inside_data.js";

export const HEAD_COLOURS = ["#d6452b", "#2f6fd6", "#1f9e55", "#a23fc4", "#d68a1a", "#178c8c", "#c43f7c", "#6b6b1f"];

export const shown = (text) => text.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥") || "∅";
export const number = (v) => (Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : v.toFixed(4));

export function element(tag, attributes = {}, ...children) {
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
// {rgb: the full colour of value's side, share: how much of it, 0 to 1}.
function shade(value, largest) {
  return { rgb: value >= 0 ? [214, 69, 43] : [47, 111, 214],
    share: largest > 0 ? Math.min(Math.abs(value) / largest, 1) : 0 };
}

// The scale's colour of `value`, as CSS.
export function colour(value, largest) {
  const { rgb, share } = shade(value, largest);
  return `rgba(${rgb.join(",")},${share.toFixed(3)})`;
}

// The scale's colour laid on white, as the bytes of an opaque pixel [r, g, b, 255].
export function onWhite(value, largest) {
  const { rgb, share } = shade(value, largest);
  return [...rgb.map((channel) => 255 - share * (255 - channel)), 255];
}

// A vector as a strip of cells, coloured once the step is drawn (`paint`, one scale for every strip of the step),
// each value on hover and all of them under "numbers" (a tap on a phone). `name(i)` names entry i.
export function strip(values, label, name = (i) => `${label}[${i}]`) {
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

// Colour every strip of `panel`: on one scale, the largest magnitude among them, where the step adds or compares its
// vectors (`shareScale`), else each on its own largest; a legend says which.
export function paint(panel) {
  const strips = Array.from(panel.querySelectorAll(".strip"));
  if (!strips.length && !panel.querySelector(".heatmap")) return;
  const largestOf = (values) => values.reduce((largest, v) => Math.max(largest, Math.abs(v)), 0);
  const shared = panel.dataset.scale === "shared" && strips.length ?
    Math.max(...strips.map(({ values }) => largestOf(values))) : null;
  for (const cells of strips) {
    const largest = shared ?? largestOf(cells.values);
    Array.from(cells.children).forEach((cell, i) => (cell.style.background = colour(cells.values[i], largest)));
    if (shared === null) cells.previousSibling.append(` (full colour at ±${number(largest)})`);
  }
  const legend = element("p", { class: "legend" },
    element("span", { class: "scale", "aria-hidden": "true" }),
    " blue below 0, white at 0, red above; " + (shared === null ? "each vector or matrix on its own scale, " +
      "stated beside it" : `one scale for every vector here, to compare them: full colour at ±${number(shared)}`));
  panel.querySelector("h3").after(legend);
}

// A step that adds or compares its vectors draws them on one scale.
export function shareScale(panel) {
  panel.dataset.scale = "shared";
}

// Tokens with a value each, as chips with a bar as long as the value's size (red above 0, blue below) and, where a
// row has a `ghost` value, a grey bar of it behind: scores, weights, probabilities. `options.scale`: the value of a
// full bar (else the largest).
export function chips(rows, options = {}) {
  const list = element("div", { class: "chips" });
  let largest = options.scale ?? 0;
  if (!options.scale) {
    for (const row of rows) if (Number.isFinite(row.value)) largest = Math.max(largest, Math.abs(row.value));
  }
  const percent = (value) => `${((largest > 0 ? Math.min(Math.abs(value) / largest, 1) : 0) * 100).toFixed(1)}%`;
  for (const row of rows) {
    const share = options.bars && Number.isFinite(row.value) ? percent(row.value) : "0%";
    const bar = row.value < 0 ? "rgba(47,111,214,.35)" : "rgba(214,69,43,.35)";
    const ghost = row.ghost === undefined ? "" : `, linear-gradient(90deg, rgba(0,0,0,.3) ${percent(row.ghost)}, ` +
      "transparent 0) bottom / 100% 35% no-repeat";
    list.append(
      element(
        "span",
        {
          class: `chip${row.masked ? " masked" : ""}${row.chosen ? " chosen" : ""}`,
          ...(row.position === undefined ? {} : { "data-position": String(row.position) }),
          style: `background:linear-gradient(90deg, ${bar} ${share}, transparent 0)${ghost}`,
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
export const capitalised = (text) => text.charAt(0).toUpperCase() + text.slice(1);

export function paragraph(text) {
  return element("p", { text });
}

// What the model's norm does, in Python's words.
export const normSaid = (view) => view.declared.choices.norm;

// A sum's first entry worked out: `names[0]`[0] + `names[1]`[0] = the model's sum[0] (`names[3]`: the sum is then
// normalised, post-norm).
export function sumLine(a, b, sum, names) {
  return paragraph(`${names[2]}[0] = ${names[0]}[0] + ${names[1]}[0] = ${number(a[0])} + ${number(b[0])} = ` +
    `${number(a[0] + b[0])}` + (names[3] ? `, then normalised: ${number(sum[0])}.` : ` (the model's: ${number(sum[0])}).`));
}

// The norm of x worked out for its first entry, before and after its learned scale (and shift): the model's `normed`.
// `norm`: "layer" or "rms" (the model's norm by default; QK-norm's is RMS); `name`: what x is called.
export function normLine(view, x, normed, norm = view.trace.shape.norm, name = "x") {
  const { norm_epsilon: epsilon } = view.trace.shape;
  const { mean, spread, first } = normalised(x, norm, epsilon);
  const how = norm === "layer" ? `(${name}[0] − mean) / √(variance + ε) = (${number(x[0])} − ${number(mean)}) / ` +
    `${number(spread)}` : `${name}[0] / √(mean of ${name}² + ε) = ${number(x[0])} / ${number(spread)}`;
  return paragraph(`${how} = ${number(first)}; its learned scale${norm === "layer" ? " and shift then make" :
    " then makes"} it ${number(normed[0])}.`);
}

// A matrix (rows of numbers) as a picture, on one scale (its largest magnitude, or `options.scale`): each cell's
// value on hover (`name(r, c)` names it) and all under "numbers"; `options.width`/`rowHeight`, its size in CSS
// pixels (a vector drawn as a column or a row lines up with a matrix of the same size); `options.rowName(r)` names a
// row among the numbers. Where `options.positions` gives each row's position in the text, the row of the position
// lit (`light`) is marked; `options.labelled` writes each row's name beside it.
export function heatmap(rows, label, name, options = {}) {
  const rowName = options.rowName ?? ((r) => `row ${r}`);
  const [count, columns] = [rows.length, rows[0].length];
  let largest = options.scale ?? 0;
  if (!options.scale) for (const row of rows) for (const v of row) largest = Math.max(largest, Math.abs(v));
  const canvas = element("canvas", { width: columns, height: count, class: "heatmap", role: "img",
    "aria-label": `${label}: ${count} × ${columns} numbers`,
    style: `width:${options.width ?? columns * 6}px;height:${options.height ?? count * (options.rowHeight ?? 6)}px` });
  const context = canvas.getContext("2d");
  const image = context.createImageData(columns, count);
  rows.forEach((row, r) => row.forEach((v, c) => image.data.set(onWhite(v, largest), (r * columns + c) * 4)));
  const paintRows = (marked) => {
    context.putImageData(image, 0, 0);
    if (marked < 0) return;
    context.fillStyle = "rgba(181,137,0,.55)";  // the lit row, its colours still showing through
    context.fillRect(0, marked, columns, 1);
  };
  paintRows(-1);
  canvas.onmousemove = (event) => {
    const box = canvas.getBoundingClientRect();
    const r = Math.min(count - 1, Math.floor(((event.clientY - box.top) / box.height) * count));
    const c = Math.min(columns - 1, Math.floor(((event.clientX - box.left) / box.width) * columns));
    canvas.title = `${name(r, c)} = ${number(rows[r][c])}`;
  };
  if (options.positions) {
    canvas.dataset.marks = "rows";
    canvas.mark = (position) => paintRows(options.positions.indexOf(position));
  }
  const numbers = element("details", { class: "numbers" }, element("summary", { text: "numbers" }));
  numbers.ontoggle = () => {
    if (numbers.open && numbers.childElementCount === 1)
      numbers.append(element("code", { text: rows.map((row, r) => `${rowName(r)}: ${Array.from(row, number).join(" ")}`)
        .join("\n") }));
  };
  // Each row's name beside it, where the rows are tall enough to read one (`options.labelled`).
  const labels = options.labelled ? element("div", { class: "row-labels", "aria-hidden": "true",
    style: `line-height:${options.rowHeight}px;font-size:${Math.min(options.rowHeight, 10)}px` },
  ...rows.map((_, r) => element("div", { text: rowName(r) }))) : null;
  return element("figure", { class: "heatmap-figure" }, labels ? element("div", { class: "labelled" }, labels, canvas)
    : canvas, element("figcaption", { text: `${label} (full colour at ±${number(largest)})` }), numbers);
}

// Light the token at `position` wherever the view shows it (the tokens, the chips, the table's rows, the
// matrices' rows and columns, the arcs' labels), the others out; it stays lit from step to step.
export function light(view, position) {
  view.lit = position;
  for (const lit of view.root.querySelectorAll(".lit")) lit.classList.remove("lit");
  for (const found of view.root.querySelectorAll(`[data-token="${position}"], [data-position="${position}"]`)) {
    found.classList.add("lit");
  }
  for (const marked of view.root.querySelectorAll("[data-marks]")) marked.mark(position);
}
