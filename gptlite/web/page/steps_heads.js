// The Inside view's steps across heads: the heads joined (and knocked out), cross-attention, the graph of a layer's
// attention, and what each head does.

import { capitalised, chips, colour, element, HEAD_COLOURS, paragraph, shareScale, shown, strip } from "./inside_draw.js";
import { at } from "./inside_data.js";
import { rowsTable, visibleChips } from "./steps_attention.js";

function drawHeads(view, panel, { token, layer }) {
  shareScale(panel);
  const steps = view.trace.layers[layer];
  const { n_head: heads } = view.trace.shape;
  const { head_size: size, n_embd: width } = view.trace.shape;
  panel.append(
    paragraph(
      `The ${heads} heads' outputs are joined side by side, and one more matrix (the output ` +
        "projection) mixes them back into the model's width: " +
        `${heads} heads × ${size} = joined (${heads * size}) · W_o (${heads * size} × ${width}) = projected (${width}).`
    )
  );
  for (let h = 0; h < heads; h++) panel.append(strip(at(steps.heads, h, token), `head ${h}`));
  panel.append(strip(at(steps.joined, token), "joined"), strip(at(steps.attention_output, token), "projected"));
  if (view.options.retrace) panel.append(knockOuts(view, layer));
}

// A switch per head of `layer` that knocks it out (its output scaled by 0 in the inside graph) or back in.
function knockOuts(view, layer) {
  const switches = element("fieldset", { class: "knock-out" }, element("legend", {
    text: "Knock a head out: the model runs again without it, and every step shows the edited model" }));
  for (let head = 0; head < view.trace.shape.n_head; head++) {
    const out = view.ablated.some(([l, h]) => l === layer && h === head);
    const box = element("input", { type: "checkbox", "data-knock-out": `${layer}.${head}`,
      onchange: () => view.toggleHead(layer, head, `[data-knock-out="${layer}.${head}"]`) });
    box.checked = out;
    switches.append(element("label", {}, box, ` head ${head}`));
  }
  return switches;
}

function drawCross(view, panel, { token, layer, head }) {
  shareScale(panel);
  const steps = view.trace.layers[layer];
  const source = Array.from(view.trace.source_ids, Number);
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
        label: `${s} ${shown(view.options.piece(source[s]))}`,
        value,
      })),
      { bars: true }
    ),
    element("h4", { text: "over the target so far (self-attention)" }),
    visibleChips(view, at(steps.attention, head, token), token, { bars: true }),
    element("h4", { text: "Follow each source token from its key to what it gives this token" }),
    rowsTable(view, layer, head, token, "cross_"),
    strip(at(steps.cross_heads, head, token), `head ${head}'s output`),
    strip(at(steps.cross_output, token), "projected"),
    strip(at(steps.cross_residual, token), "added to the residual stream")
  );
}

function drawGraph(view, panel, { token, layer }) {
  const { trace } = view;
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
    text.dataset.position = String(view.position(i));
    text.textContent = `${view.position(i)} ${shown(view.options.piece(id))}`;
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

// The scores of gptlite.heads, a grid a score: where each head looks, its induction, and what knocking it out costs.
const ROLES = [
  ["previous_token", "the token before", "share of its attention on the token just before"],
  ["first_token", "the first token", "share on the text's first token"],
  ["current_token", "the token itself", "share on the token itself"],
  ["induction", "induction", "on random tokens repeated, share on the token after the earlier copy of this one"],
  ["ablation", "knocked out", "the text's loss with the head knocked out, less the model's own (nats a token)"],
];

// A change with its sign, "-0.000" never (a change too small to show is 0.000).
const signed = (value) => (Math.abs(value) < 5e-4 ? "0.000" : `${value > 0 ? "+" : ""}${value.toFixed(3)}`);

function drawHeadRoles(view, panel, { layer, head }) {
  const { n_layer: layers, n_head: heads } = view.trace.shape;
  const waiting = paragraph(`Running the model ${2 + layers * heads} times (the text, a probe, and the text with ` +
    "each head knocked out in turn)...");
  panel.append(
    paragraph("What each head does, in numbers, on this text (the clean model's, as gptlite.heads gives them): " +
      "where it looks, how much it acts as an induction head (it finds an earlier copy of the token and looks at " +
      "the token after it), and how much the text's loss grows without it. Choose a head to see its attention."),
    waiting
  );
  return view.headReport().promise.then((report) => {
    const grids = ROLES.map(([name, title, what]) => {
      const values = report[name];
      let largest = 0;
      for (const row of values) for (const v of row) largest = Math.max(largest, Math.abs(v));
      const scale = name === "ablation" ? largest : 1;
      const rows = values.map((row, l) => element("tr", {}, element("th", { scope: "row", text: `layer ${l}` }),
        ...row.map((v, h) => element("td", {}, element("button", {
          class: `role${l === layer && h === head ? " chosen" : ""}`, style: `background:${colour(v, scale)}`,
          "data-role": `${name}.${l}.${h}`, title: `layer ${l}, head ${h}: ${what}`,
          text: name === "ablation" ? signed(v) : v.toFixed(2),
          onclick: () => view.go({ layer: l, head: h, step: "softmax" }, '[role=tab][tabindex="0"]'),
        })))));
      const top = element("tr", {}, element("th", {}), ...values[0].map((_, h) => element("th", { scope: "col",
        text: `head ${h}` })));
      return element("div", { class: "role-grid" }, element("h4", { text: `${capitalised(title)}: ${what}` }),
        element("div", { class: "table-scroll" }, element("table", {}, element("thead", {}, top),
          element("tbody", {}, ...rows))));
    });
    waiting.replaceWith(paragraph(`The text's loss: ${report.loss.toFixed(4)} nats a token. White is 0, red above ` +
      "it, blue below; a share of attention is coloured from 0 to 1, the loss's change against the largest change."),
    ...grids);
  });
}

export const HEAD_DRAWINGS = {
  heads: drawHeads,
  cross: drawCross,
  graph: drawGraph,
  head_roles: drawHeadRoles,
};
