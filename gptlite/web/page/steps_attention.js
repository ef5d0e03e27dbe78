// The Inside view's attention steps, one head at a time: the query, key and value, QK-norm and the rotary turn, the
// scores and what they come from, the mask, the softmax and every head's matrix, the weighted values.

import {
  capitalised, chips, element, heatmap, light, normLine, number, onWhite, paragraph, shareScale, shown, strip,
} from "./inside_draw.js";
import { at, attentionMatrix, attentionRows, softmaxTerm, weightedFirst } from "./inside_data.js";

function kvHead(view, head) {
  const shape = view.trace.shape;
  return Math.floor(head / (shape.n_head / shape.kv_heads));
}

function drawQkv(view, panel, { token, layer, head }) {
  const { shape } = view.trace;
  const steps = view.trace.layers[layer];
  const kv = kvHead(view, head);
  const group = shape.n_head / shape.kv_heads;
  const normed = Boolean(steps.attention_normed);
  panel.append(
    paragraph(
      `Three matrices turn the vector attention reads (x: ${normed ? "the block's input, normalised" :
        "the block's input"}) into a query (what this token looks for), a key (what it offers to be found by) and ` +
        `a value (what it passes on), ${shape.head_size} numbers each per head. Each is a product, x times the ` +
        `head's slice of a matrix${steps.query_bias ? ", plus a bias" : ""}: entry i of q is the dot product of x ` +
        "with column i of W_q."
    )
  );
  if (group > 1) {
    const sharing = Array.from({ length: group }, (_, g) => kv * group + g).join(", ");
    panel.append(
      paragraph(
        `${capitalised(view.declared.choices.grouped_query)}. Here ${shape.n_head} query heads share ` +
          `${shape.kv_heads} key/value heads; query heads ${sharing} read key/value head ${kv}.`
      )
    );
  }
  panel.append(projections(view, steps, [["query", head], ["key", kv], ["value", kv]], token));
  panel.append(visibleRows(view, steps, "key", kv, token, at(steps.query, head, token)),
    visibleRows(view, steps, "value", kv, token));
}

// x (C) · W (C x D) (+ b) = the head's query, key and value (D each): one column x, each matrix beside it so that
// its rows meet x's entries, each result under its matrix so that its entries sit under their columns; and the sum
// for each result's first entry written out with this model's numbers.
function projections(view, steps, parts, token) {
  const { n_embd: width, head_size: size } = view.trace.shape;
  const x = at(steps.attention_normed ?? steps.input, token);
  const w = Math.min(size * 3, 90);  // three of them beside x fit a phone's 390 pixels
  const h = Math.min(width * 2, 256);
  const grid = element("div", { class: "product", style: `grid-template-columns: repeat(${parts.length + 2}, auto)` },
    heatmap(Array.from(x, (v) => [v]), "x", (r) => `x[${r}]`, { width: 10, height: h }),
    element("span", { class: "operator", text: "·" }));
  const results = [element("span"), element("span", { class: "operator", text: "=" })];
  const sums = [];
  for (const [part, index] of parts) {
    const letter = part[0];
    const weights = at(steps[`${part}_weight`], index);
    const bias = steps[`${part}_bias`] ? at(steps[`${part}_bias`], index) : null;
    const made = at(steps[part], index, token);
    const rows = Array.from({ length: width }, (_, i) => Array.from(weights.subarray(i * size, (i + 1) * size)));
    const name = `W_${letter}`;
    grid.append(heatmap(rows, `${name} (head ${index}), ${width} × ${size}`, (r, c) => `${name}[${r}, ${c}]`,
      { width: w, height: h }));
    results.push(heatmap([Array.from(made)], `${letter} = x · ${name}${bias ? ` + b_${letter}` : ""}, ${size}`,
      (r, c) => `${letter}[${c}]`, { width: w, rowHeight: 10 }));
    const first = x.reduce((total, v, i) => total + v * rows[i][0], bias ? bias[0] : 0);
    sums.push(paragraph(`${letter}[0] = x[0] × ${name}[0, 0] + x[1] × ${name}[1, 0] + … + x[${width - 1}] × ` +
      `${name}[${width - 1}, 0]${bias ? ` + b_${letter}[0]` : ""} = ${number(x[0])} × ${number(rows[0][0])} + ` +
      `${number(x[1])} × ${number(rows[1][0])} + …${bias ? ` + ${number(bias[0])}` : ""} = ${number(first)} ` +
      `(the model's: ${number(made[0])}).`));
  }
  grid.append(...results);
  return element("div", { class: "linear-map" },
    element("h4", { text: `x (${width}) · W (${width} × ${size}) = q, k, v (${size} each), one head's slice of ` +
      "each matrix" }), element("div", { class: "table-scroll" }, grid), ...sums);
}

// Every visible token's key (or value) of key/value head `kv`, a row each, under this token's query where it is
// given: q · each row is that token's score (next step).
function visibleRows(view, steps, part, kv, token, query = null) {
  const rows = Array.from({ length: token + 1 }, (_, s) => Array.from(at(steps[part], kv, s)));
  const size = view.trace.shape.head_size;
  let largest = 0;
  for (const row of query ? [...rows, query] : rows) for (const v of row) largest = Math.max(largest, Math.abs(v));
  const w = Math.min(size * 6, 240);
  const label = (s) => `${view.position(s)} ${shown(view.options.piece(view.trace.ids[s]))}`;
  const letter = part[0];
  const options = { width: w, rowHeight: 8, scale: largest, positions: rows.map((_, s) => view.position(s)),
    rowName: (s) => label(s), labelled: true };
  return element("div", { class: "linear-map" },
    element("h4", { text: query ? `Every visible token's key, a row each (K, ${rows.length} × ${size}), under ` +
      "this token's query: q · a row is that token's score (next step)" : `Every visible token's value, a row ` +
      `each (V, ${rows.length} × ${size}): what the weights mix` }),
    query ? heatmap([Array.from(query)], "q", (r, c) => `q[${c}]`, { width: w, rowHeight: 8, scale: largest,
      rowName: () => "q", labelled: true }) : null,
    heatmap(rows, `${letter.toUpperCase()}: rows 0 to ${token}`, (r, c) => `${part} of ${label(r)}[${c}]`, options));
}

function drawQkNorm(view, panel, { token, layer, head }) {
  shareScale(panel);
  const steps = view.trace.layers[layer];
  const kv = kvHead(view, head);
  panel.append(
    paragraph(`${capitalised(view.declared.choices.qk_norm)}.`),
    normLine(view, at(steps.query, head, token), at(steps.query_normed, head, token), "rms", "q"),
    strip(at(steps.query, head, token), "query"),
    strip(at(steps.query_normed, head, token), "query, normalised"),
    strip(at(steps.key, kv, token), "key"),
    strip(at(steps.key_normed, kv, token), "key, normalised")
  );
}

function drawRotary(view, panel, { token, layer, head }) {
  shareScale(panel);
  const steps = view.trace.layers[layer];
  const kv = kvHead(view, head);
  const before = steps.query_normed ? "_normed" : "";
  panel.append(
    paragraph(
      `The query and key are turned by the angles of position ${token} (see Position): pair i ` +
        `(dimensions i and i + ${view.trace.shape.head_size / 2}) by its own angle.`
    ),
    turnLine(view, at(steps[`query${before}`], head, token), at(steps.query_rotated, head, token), token),
    strip(at(steps[`query${before}`], head, token), "query before"),
    strip(at(steps.query_rotated, head, token), "query turned"),
    strip(at(steps[`key${before}`], kv, token), "key before"),
    strip(at(steps.key_rotated, kv, token), "key turned")
  );
}

// Pair 0 of the query turned, worked out: (q[0], q[D/2]) by θ, the angle of the token's position.
function turnLine(view, q, turned, token) {
  const half = view.trace.shape.head_size / 2;
  const angle = at(view.trace.steps.rotary_angles, token)[0];
  return paragraph(`turned[0] = q[0] cos θ − q[${half}] sin θ, θ = ${number(angle)} rad: ${number(q[0])} × ` +
    `${number(Math.cos(angle))} − ${number(q[half])} × ${number(Math.sin(angle))} = ` +
    `${number(q[0] * Math.cos(angle) - q[half] * Math.sin(angle))} (the model's: ${number(turned[0])}).`);
}

export function visibleChips(view, values, token, options = {}) {
  return chips(
    Array.from(values, (value, s) => ({
      label: `${view.position(s)} ${shown(view.options.piece(view.trace.ids[s]))}`,
      value,
      masked: s > token,
      text: s > token ? (options.maskedText ?? number(value)) : undefined,
      position: view.position(s),
    })),
    { bars: options.bars }
  );
}

function drawScores(view, panel, { token, layer, head }) {
  const size = view.trace.shape.head_size;
  const steps = view.trace.layers[layer];
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
    visibleChips(view, products, token, { bars: true }),
    element("h4", { text: `q·k / √${size}` }),
    visibleChips(view, scaled, token, { bars: true }),
    element("h4", { text: "Follow each token from its key to what it gives this token" }),
    rowsTable(view, layer, head, token)
  );
}

// One row per visible token through this head: q·k = |q| |k| cos θ, ÷ √d, the softmax's e^(x − max) and weight,
// and the length of weight × value, what the token gives the output. Cross-attention's (`part` "cross_") has a row
// per source token, which lights nothing of the target's.
export function rowsTable(view, layer, head, token, part = "") {
  const size = view.trace.shape.head_size;
  const heads = ["token", "q·k", "|q|", "|k|", "cos θ", `÷ √${size}`, "e^(x − max)", "weight", "|weight × v|"];
  const table = element("table", { class: "rows" },
    element("thead", {}, element("tr", {}, ...heads.map((text) => element("th", { scope: "col", text })))));
  const body = element("tbody");
  for (const row of attentionRows(view.trace, layer, head, token, part)) {
    const cells = [row.product, row.query_length, row.key_length, row.cosine, row.scaled, row.exponent, row.weight,
      row.contribution].map((value) => element("td", { text: number(value) }));
    const position = part ? row.position : view.position(row.position);
    const lit = part ? {} : { "data-position": String(position), tabindex: "0", onmouseenter: () => light(view,
      position), onfocus: () => light(view, position), onclick: () => light(view, position) };
    body.append(element("tr", lit, element("th", { scope: "row",
      text: `${position} ${shown(view.options.piece(row.id))}` }), ...cells));
  }
  table.append(body);
  return element("div", { class: "table-scroll" }, table);
}

function drawMask(view, panel, { token, layer, head }) {
  const scores = at(view.trace.layers[layer].scores, head, token);
  panel.append(
    paragraph(
      `The causal mask: a token may not look ahead. The scores of tokens after ${view.position(token)} are set ` +
        "to minus infinity (shown masked), so the softmax gives them nothing."
    ),
    visibleChips(view, scores, token, { maskedText: "masked" })
  );
}

// The weight this token gives itself, worked out with the model's numbers.
function softmaxLine(view, layer, head, token) {
  const { score, largest, exponent, total, weight } = softmaxTerm(view.trace, layer, head, token, token);
  return paragraph(`For this token itself: weight = e^(score − largest) / Σ e^(each score − largest) = ` +
    `e^(${number(score)} − ${number(largest)}) / ${number(total)} = ${number(exponent)} / ${number(total)} = ` +
    `${number(exponent / total)} (the model's: ${number(weight)}). Taking the largest score away first changes no ` +
    "weight and keeps e^x from overflowing.");
}

// Behind a switch: the softmax of q·k without the ÷ √d, which the model does not compute, to show why it divides.
function unscaled(view, layer, head, token) {
  const products = Array.from(at(view.trace.layers[layer].products, head, token)).slice(0, token + 1);
  const largest = Math.max(...products);
  const exponents = products.map((p) => Math.exp(p - largest));
  const total = exponents.reduce((sum, e) => sum + e, 0);
  const part = element("div", { class: "unscaled", hidden: "" },
    paragraph("Not the model's numbers: the softmax of q·k itself, as if it were not divided by √d. Larger scores " +
      "make a sharper softmax: the weights crowd onto the largest, and training's gradients through the others fade."),
    visibleChips(view, exponents.map((e) => e / total), token, { bars: true }));
  const box = element("input", { type: "checkbox", "aria-label": "without dividing by the square root of d",
    onchange: () => (part.hidden = !box.checked) });
  return element("div", {}, element("label", {}, box, " what the weights would be without ÷ √d"), part);
}

function drawSoftmax(view, panel, { token, layer, head }) {
  shareScale(panel);
  const weights = at(view.trace.layers[layer].attention, head, token);
  let total = 0;
  for (const w of weights) total += w;
  panel.append(
    paragraph(
      `Softmax turns the scores into weights: each is e^score over the sum of them all. The row ` +
        `sums to ${total.toFixed(6)}; the masked tokens get exactly 0.`
    ),
    softmaxLine(view, layer, head, token),
    visibleChips(view, weights, token, { bars: true }),
    unscaled(view, layer, head, token),
    element("h4", { text: "Every head of this layer, side by side (one strip a head, a cell a token)" })
  );
  const every = view.trace.layers[layer].attention;
  for (let h = 0; h < every.dims[0]; h++) panel.append(strip(at(every, h, token), `head ${h}`));
  panel.append(
    element("h4", { text: "Each head's whole attention: a row per token, a column per token it reads" }),
    paragraph("White is 0 and red is 1; the hatched triangle is masked (a token never reads a later one); this " +
      "token's row is outlined in black, and a token lit in the scores' table has its column outlined in gold. " +
      "Choose a head to open it."),
    element("div", { class: "matrices" }, ...Array.from({ length: every.dims[0] }, (_, h) =>
      matrixPicture(view, layer, h, token, h === head)))
  );
}

// Head `head`'s T x T attention as a picture, the masked triangle hatched and row `token` outlined; a button that
// opens that head.
function matrixPicture(view, layer, head, token, chosen) {
  const rows = attentionMatrix(view.trace, layer, head);
  const count = rows.length;
  const cell = Math.max(2, Math.floor(160 / count));
  const canvas = element("canvas", { width: count * cell, height: count * cell, "aria-hidden": "true" });
  const context = canvas.getContext("2d");
  // The weights a pixel each, then scaled up to `cell` pixels a weight (one image: no call a cell).
  const pixels = new ImageData(count, count);
  rows.forEach((row, t) => row.forEach((weight, s) => {
    const hatched = (s + t) % 2 ? [228, 228, 228, 255] : [244, 244, 244, 255];
    pixels.data.set(s > t ? hatched : onWhite(weight, 1), (t * count + s) * 4);
  }));
  const small = document.createElement("canvas");
  small.width = small.height = count;
  small.getContext("2d").putImageData(pixels, 0, 0);
  context.imageSmoothingEnabled = false;
  const paintMatrix = (litColumn) => {
    context.drawImage(small, 0, 0, count * cell, count * cell);
    context.lineWidth = Math.max(1, cell / 3);
    if (litColumn >= 0 && litColumn < count) {  // the lit token: what every row gives it
      context.strokeStyle = "#b58900";
      context.strokeRect(litColumn * cell, litColumn * cell, cell, (count - litColumn) * cell);
    }
    context.strokeStyle = "#000";
    context.strokeRect(0, token * cell, (token + 1) * cell, cell);
  };
  paintMatrix(-1);
  canvas.dataset.marks = "columns";
  canvas.mark = (position) => paintMatrix(position - view.position(0));
  return element("button", { class: `matrix${chosen ? " chosen" : ""}`, "aria-pressed": String(chosen),
    "aria-label": `head ${head}'s attention matrix, ${count} by ${count}`, "data-matrix": String(head),
    onclick: () => view.go({ head }, `[data-matrix="${head}"]`) }, canvas, element("span", { text: `head ${head}` }));
}

function drawValues(view, panel, { token, layer, head }) {
  const steps = view.trace.layers[layer];
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
              `${view.position(s)} ${JSON.stringify(view.options.piece(view.trace.ids[s]))} ` + `(${(weights[s] * 100).toFixed(1)}%)`
          )
          .join(", ")}.`
    ),
    valuesLine(view, layer, head, token),
    strip(at(steps.heads, head, token), `head ${head}'s output`)
  );
}

// The head's output's first entry worked out: Σ weight × value[0] over the visible tokens.
function valuesLine(view, layer, head, token) {
  const { terms, sum, model } = weightedFirst(view.trace, layer, head, token);
  const largest = Array.from(terms.keys()).sort((a, b) => terms[b][0] - terms[a][0]).slice(0, 3);
  const shownTerms = largest.map((j) => `${number(terms[j][0])} × ${number(terms[j][1])} (${view.position(j)} ` +
    `${JSON.stringify(view.options.piece(view.trace.ids[j]))})`).join(" + ");
  const out = view.ablated.some(([l, h]) => l === layer && h === head);
  return paragraph(`output[0] = Σ weight × value[0] over the ${terms.length} visible tokens, the largest weights ` +
    `first: ${shownTerms}${terms.length > 3 ? " + …" : ""} = ${number(sum)}` + (out ? `, times 0: the head is ` +
    `knocked out (the model's: ${number(model)}).` : ` (the model's: ${number(model)}).`));
}

export const ATTENTION_DRAWINGS = {
  qkv: drawQkv,
  qk_norm: drawQkNorm,
  rotary: drawRotary,
  scores: drawScores,
  mask: drawMask,
  softmax: drawSoftmax,
  values: drawValues,
};
