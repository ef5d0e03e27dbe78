// The Inside view's first steps: the tokens, their vectors, the positions and a block's norm. Each is drawn by a
// function of the view, the panel it fills and the state shown, named in STEP_DRAWINGS by its id (inside/views.py).

import {
  chips, element, normLine, normSaid, number, onWhite, paragraph, shareScale, shown, strip, sumLine,
} from "./inside_draw.js";
import { at } from "./inside_data.js";

function drawTokens(view, panel, { token }) {
  const { trace, options } = view;
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
        title: `token ${view.position(index)}`,
      }))
    )
  );
}

function drawEmbedding(view, panel, { token }) {
  const steps = view.trace.steps;
  const id = view.trace.ids[token];
  panel.append(
    paragraph(
      `Token ${JSON.stringify(view.options.piece(id))} (id ${id}) becomes row ${id} of the ` +
        `token table: a vector of ${view.trace.shape.n_embd} numbers that training learned.`
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
          label: shown(view.options.piece(other)),
          value: values[i],
        })),
        { bars: true }
      )
    );
  }
}

function drawPosition(view, panel, { token }) {
  shareScale(panel);
  const { steps, shape } = view.trace;
  if (shape.position === "rotary") {
    const angles = at(steps.rotary_angles, token);
    panel.append(
      paragraph(
        `Positions: ${view.declared.choices.position}. Dimension i and i + ${shape.head_size / 2} of a head form ` +
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
      `Positions: ${view.declared.choices.position}. Position ${token} adds row ${token} to the token vector; ` +
        "the sum is what the first block reads."
    ),
    sumLine(at(steps.token_embedding, token), at(steps.position, token), at(steps.embedding, token),
      ["token", "position", "sum"]),
    strip(at(steps.token_embedding, token), "token vector"),
    strip(at(steps.position, token), `position ${token}`),
    strip(at(steps.embedding, token), "sum"),
    table(view, steps.position_table, token)
  );
}

// A table (rows, columns) drawn as an image, row `marked` outlined: the position table.
function table(view, array, marked) {
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
  array.data.forEach((v, i) => image.data.set(Math.floor(i / columns) === marked ? [0, 0, 0, 255] : onWhite(v, largest),
    i * 4));
  context.putImageData(image, 0, 0);
  return canvas;
}

function drawNorm(view, panel, { token, layer }) {
  const steps = view.trace.layers[layer];
  if (view.trace.shape.norm_position === "post") {
    panel.append(
      paragraph(
        `This model is post-norm: ${view.declared.choices.norm_position}. Its norm is ${normSaid(view)} ` +
          "(see Residual)."
      ),
      strip(at(steps.input, token), "block input")
    );
    return;
  }
  panel.append(
    paragraph(`This model is pre-norm: ${view.declared.choices.norm_position}. Before attention, the vector ` +
      `is normalised: ${normSaid(view)}.`),
    normLine(view, at(steps.input, token), at(steps.attention_normed, token)),
    strip(at(steps.input, token), "block input"),
    strip(at(steps.attention_normed, token), "normalised")
  );
}

export const INPUT_DRAWINGS = {
  tokens: drawTokens,
  embedding: drawEmbedding,
  position: drawPosition,
  norm: drawNorm,
};
