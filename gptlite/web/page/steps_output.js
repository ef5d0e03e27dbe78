// The Inside view's last steps: the residual stream, the feed-forward, the final norm, the logits and the
// probabilities after the sampling settings.

import { nextTokenProbabilities, settingOf } from "./gptlite.js";
import {
  chips, element, normLine, normSaid, number, paragraph, shareScale, shown, strip, sumLine,
} from "./inside_draw.js";
import { at } from "./inside_data.js";

function drawResidual(view, panel, { token, layer }) {
  shareScale(panel);
  const steps = view.trace.layers[layer];
  const post = view.trace.shape.norm_position === "post";
  panel.append(
    paragraph(
      "Attention's output is added to the vector it read (the residual stream): the block " +
        `changes the vector rather than replacing it${post ? `, and the sum is normalised (${normSaid(view)})` : ""}.`
    ),
    sumLine(at(steps.input, token), at(steps.attention_output, token), at(steps.attention_residual, token),
      ["input", "output", "sum", post]),
    strip(at(steps.input, token), "block input"),
    strip(at(steps.attention_output, token), "attention's output"),
    strip(at(steps.attention_residual, token), post ? "sum, normalised" : "sum")
  );
}

function drawFeedForward(view, panel, { token, layer }) {
  const steps = view.trace.layers[layer];
  const kind = view.declared.choices.mlp;
  const hidden = at(steps.hidden, token);
  const order = Array.from(hidden.keys())
    .sort((a, b) => Math.abs(hidden[b]) - Math.abs(hidden[a]))
    .slice(0, 10);
  panel.append(
    paragraph(
      `The feed-forward works on each token alone: it widens the vector to ${hidden.length} ` +
        `numbers, applies ${kind}, and narrows it back: x (${view.trace.shape.n_embd}) · W_in ` +
        `(${view.trace.shape.n_embd} × ${(steps.expanded ?? steps.gate).dims[1] * (steps.gate ? 2 : 1)}) → ` +
        `activations (${hidden.length}) · W_out (${hidden.length} × ${view.trace.shape.n_embd}) = output ` +
        `(${view.trace.shape.n_embd}).`
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

function drawFeedForwardResidual(view, panel, { token, layer }) {
  shareScale(panel);
  const steps = view.trace.layers[layer];
  const post = view.trace.shape.norm_position === "post";
  panel.append(
    paragraph(
      `The feed-forward's output is added to the residual stream${post ? ", and normalised" : ""}: ` +
        `the block's output, which the next block reads.`
    ),
    sumLine(at(steps.attention_residual, token), at(steps.feed_forward_output, token), at(steps.output, token),
      ["after attention", "feed-forward's output", "block output", post]),
    strip(at(steps.attention_residual, token), "after attention"),
    strip(at(steps.feed_forward_output, token), "feed-forward's output"),
    strip(at(steps.output, token), "block output")
  );
}

function drawFinalNorm(view, panel, { token }) {
  const { steps, shape } = view.trace;
  const last = view.trace.layers[shape.n_layer - 1];
  panel.append(
    paragraph(
      `This model is ${shape.norm_position}-norm: ${view.declared.choices.norm_position}` +
        (shape.norm_position === "post" ? ". The last block's output goes to the head as it is." :
          `. The last block's output is normalised once more: ${normSaid(view)}.`)
    ),
    shape.norm_position === "post" ? "" : normLine(view, at(last.output, token), at(steps.final_normed, token)),
    strip(at(last.output, token), "last block's output"),
    strip(at(steps.final_normed, token), "to the head")
  );
}

function drawLogits(view, panel, { token }) {
  const logits = at(view.trace.steps.logits, token);
  const order = Array.from(logits.keys())
    .sort((a, b) => logits[b] - logits[a])
    .slice(0, 10);
  panel.append(
    paragraph(
      `The head scores every one of the ${logits.length} tokens of the vocabulary as the next: ` +
        `${view.declared.choices.tie_weights}: h (${view.trace.shape.n_embd}) · W (${view.trace.shape.n_embd} × ` +
        `${logits.length}) = logits (${logits.length}).`
    ),
    chips(
      order.map((id) => ({ label: shown(view.options.piece(id)), value: logits[id] })),
      { bars: true }
    )
  );
  if (logits.length <= 4096) {
    panel.append(strip(logits, "logits", (id) => `logit of ${JSON.stringify(view.options.piece(id))} (id ${id})`));
  }
}

// The temperature as a slider beside its box: the bars follow as it moves.
function temperatureSlider(view) {
  const slider = element("input", { type: "range", min: "0", max: "2", step: "0.05", "aria-label": "temperature slider",
    value: String(view.live.temperature ?? 1) });
  slider.oninput = () => {
    view.live.temperature = Number(slider.value);
    view.go({}, '[aria-label="temperature slider"]');
  };
  return element("label", {}, "temperature ", slider, ` ${view.live.temperature ?? 1}`);
}

// What the writer used, in a line: its settings and seed (where the text has tokens it wrote; else nothing).
function writerSettings(view) {
  const settings = view.options.settings;
  const written = view.textIds().length > (view.options.promptLength ?? Infinity);
  if (!settings || !written) return "";
  const said = view.options.sampling.filter(({ name }) => name in settings)
    .map(({ name, empty }) => `${name.replace(/_/g, " ")} ${settings[name] ?? empty ?? "none"}`);
  return paragraph(`The writer used ${said.join(", ")}.`);
}

// The likeliest token's probability worked out from the logits: e^(its logit / T) over the sum of the kept tokens'
// (with no repetition penalty, which changes the logits first; at temperature 0 the likeliest takes it all).
function probabilityLine(view, token, kept, probabilities) {
  const temperature = view.live.temperature ?? 1;
  if (temperature === 0 || (view.live.repetition_penalty ?? 1) !== 1 || !kept.length) return "";
  const logits = at(view.trace.steps.logits, token);
  const top = kept[0];
  let total = 0;
  for (const id of kept) total += Math.exp((logits[id] - logits[top]) / temperature);
  return paragraph(`p(${JSON.stringify(view.options.piece(top))}) = e^(logit / T) / Σ e^(each kept token's logit / ` +
    `T) = 1 / Σ e^((logit − ${number(logits[top])}) / ${temperature}) over the ${kept.length} kept = 1 / ` +
    `${number(total)} = ${(100 / total).toFixed(2)}% (shown: ${(probabilities[top] * 100).toFixed(2)}%).`);
}

function drawProbabilities(view, panel, { token }) {
  const controls = element("div", { class: "live" }, temperatureSlider(view));
  for (const name of view.declared.live) {
    const declared = view.options.sampling.find((s) => s.name === name);
    const input = element("input", {
      "aria-label": name,
      value: view.live[name] ?? "",
      placeholder: declared.empty ?? "",
      title: declared.help,
    });
    input.onchange = () => {
      const { value, error } = settingOf(declared, input.value);
      const refocus = `.live [aria-label="${name}"]`;
      if (error) {
        view.notes.push(error);
        view.go({}, refocus);
        return;
      }
      view.live[name] = value;
      view.go({}, refocus);
    };
    controls.append(element("label", {}, `${name.replace(/_/g, " ")} `, input));
  }
  const { probabilities, drawn, produced } = view.probabilities(token);
  const plain = nextTokenProbabilities(at(view.trace.steps.logits, token), { temperature: 1 }, null);
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
        `(their probabilities sum to ${total.toFixed(6)}). The grey bar behind each is its probability at ` +
        "temperature 1 with no other setting: the model's own."
    ),
    probabilityLine(view, token, order, probabilities),
    controls,
    writerSettings(view),
    chips(
      order
        .slice(0, 20)
        .map((id) => ({
          label: shown(view.options.piece(id)),
          text: `${(probabilities[id] * 100).toFixed(2)}%`,
          value: probabilities[id],
          ghost: plain[id],
          title: `${(plain[id] * 100).toFixed(2)}% at temperature 1`,
        })),
      { bars: true, scale: 1 }
    )
  );
  if (drawn !== null) {
    const written = view.textIds()[view.position(token) + 1];
    panel.append(
      paragraph(
        `With seed ${view.options.settings.seed}, the draw for new token ${produced} picks ` +
          `${JSON.stringify(view.options.piece(drawn))}` +
          (written !== undefined ? `; the writer wrote ` + `${JSON.stringify(view.options.piece(written))}.` : ".")
      )
    );
  }
}

export const OUTPUT_DRAWINGS = {
  residual: drawResidual,
  feed_forward: drawFeedForward,
  feed_forward_residual: drawFeedForwardResidual,
  final_norm: drawFinalNorm,
  logits: drawLogits,
  probabilities: drawProbabilities,
};
