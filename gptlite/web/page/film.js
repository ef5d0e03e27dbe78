// The film view: a run's frames (train.py --film), each the model at one step, as `Film.to_json` gives them
// (gptlite/inside/film.py): a step slider on the loss curve; at the frame chosen, its losses, each head's scores
// with a line per head over every frame and the step it took its role, the loss on random tokens repeated twice
// (each half), the token table in 2-D and what the model writes after the probe's first half. The page shows the
// Inside view of the probe at the frame chosen (onFrame). Everything shown is also text; the slider takes the keys.

// Colours for the embedding's groups (Okabe and Ito's, told apart with any colour vision), in group_names' order.
const GROUP_COLOURS = ["#d55e00", "#0072b2", "#cc79a7", "#009e73", "#e69f00", "#56b4e9", "#999999"];
const PATTERN_WORDS = { previous_token: "previous token", first_token: "first token", current_token: "current token",
  induction: "induction", ablation: "loss when knocked out" };

// --- the film's numbers (no page needed: tests/web/test_film_data.py runs these in Node)

// The index of the frame whose step is `step`, else the nearest before it (0 where none is).
export function frameOfStep(frames, step) {
  let found = 0;
  frames.forEach((frame, index) => { if (frame.step <= step) found = index; });
  return found;
}

// [least, largest] of numbers, widened where they are equal.
export function extent(values) {
  const finite = values.filter((value) => value !== null && Number.isFinite(value));
  const least = Math.min(...finite);
  const largest = Math.max(...finite);
  return least === largest ? [least - 1, largest + 1] : [least, largest];
}

// A step's place on the slider's axis, 0 to 1: log(1 + step), since frames are dense early.
export function stepPlace(step, lastStep) {
  return Math.log1p(step) / Math.log1p(Math.max(1, lastStep));
}

// What window.gptliteFilm() returns: the frames' steps and losses, the frame shown, its heads' scores, the onsets,
// the probe's two halves' losses and the embedding's points with their tokens.
export function filmContract(film, index) {
  const frame = film.frames[index];
  return {
    frames: film.frames.map(({ step, train_loss, val_loss }) => ({ step, train_loss, val_loss })),
    frame: index,
    step: frame.step,
    heads: frame.heads,
    onsets: film.onsets,
    probe_loss: frame.probe_loss,
    writes: frame.writes,
    embedding: film.embedding.points[index].map(([x, y], token) => ({ x, y, token: film.embedding.tokens[token],
      group: film.embedding.groups[token] })),
  };
}

// --- drawing

const number = (value, digits = 4) => (value === null || value === undefined ? "none" : value.toFixed(digits));

export class FilmView {
  // `root`: the film's section; `film`: Film.to_json's; `onFrame(index)`: called when the reader picks a frame.
  constructor(root, film, onFrame) {
    this.root = root;
    this.film = film;
    this.onFrame = onFrame;
    this.pattern = "induction";
    this.index = film.frames.length - 1;
  }

  show(index = this.index) {
    this.index = Math.max(0, Math.min(this.film.frames.length - 1, index));
    const { root } = this;
    if (!root.querySelector(".film-slider")) this.build();
    const frame = this.film.frames[this.index];
    const slider = root.querySelector(".film-slider");
    slider.value = String(this.index);
    slider.setAttribute("aria-valuetext", `step ${frame.step}`);
    root.querySelector(".film-now").textContent = `frame ${this.index + 1} of ${this.film.frames.length}: step `
      + `${frame.step}; train loss ${number(frame.train_loss)} (the steps since the frame before), validation `
      + `loss ${number(frame.val_loss)}`;
    this.drawLosses();
    this.drawHeads();
    this.drawProbe();
    this.drawEmbedding();
    this.drawWriting();
    root.dataset.state = "done";
  }

  pick(index) {
    if (index === this.index) return;
    this.show(index);
    this.onFrame(this.index);
  }

  build() {
    const { root, film } = this;
    root.replaceChildren();
    const label = document.createElement("label");
    label.className = "film-label";
    label.append("step ");
    const slider = document.createElement("input");
    Object.assign(slider, { type: "range", min: "0", max: String(film.frames.length - 1), step: "1" });
    slider.className = "film-slider";
    slider.oninput = () => this.pick(Number(slider.value));
    label.append(slider);
    const now = document.createElement("p");
    now.className = "film-now";
    now.setAttribute("role", "status");
    const parts = ["losses", "heads", "probe", "embedding", "writing"].map((name) => {
      const part = document.createElement("div");
      part.className = `film-${name}`;
      return part;
    });
    root.append(label, now, ...parts);
  }

  // The run's losses at every frame against the step (on a log scale: frames are dense early), the frame shown
  // marked; a click on the curve picks the nearest frame.
  drawLosses() {
    const { frames } = this.film;
    const width = 360;
    const height = 120;
    const last = frames[frames.length - 1].step;
    const [least, largest] = extent(frames.flatMap((frame) => [frame.train_loss, frame.val_loss]));
    const x = (step) => 30 + stepPlace(step, last) * (width - 40);
    const y = (loss) => 8 + (1 - (loss - least) / (largest - least)) * (height - 30);
    const line = (name) => frames.filter((frame) => frame[name] !== null)
      .map((frame) => `${x(frame.step).toFixed(1)},${y(frame[name]).toFixed(1)}`).join(" ");
    const here = frames[this.index];
    const marks = frames.map((frame, index) => `<line x1="${x(frame.step)}" x2="${x(frame.step)}" y1="${height - 20}"
      y2="${height - 16}" stroke="${index === this.index ? "#222" : "#bbb"}"/>`).join("");
    const part = this.root.querySelector(".film-losses");
    part.innerHTML = `<h3>Loss</h3><svg class="graph film-curve" viewBox="0 0 ${width} ${height}" width="${width}"
      role="img" aria-label="the run's losses at each frame">
      <polyline points="${line("train_loss")}" fill="none" stroke="#0072b2" stroke-width="1.5"/>
      <polyline points="${line("val_loss")}" fill="none" stroke="#d55e00" stroke-width="1.5"/>
      <line x1="${x(here.step)}" x2="${x(here.step)}" y1="4" y2="${height - 16}" stroke="#222" stroke-dasharray="3 2"/>
      ${marks}
      <text x="2" y="${y(largest) + 4}">${largest.toFixed(2)}</text>
      <text x="2" y="${y(least)}">${least.toFixed(2)}</text>
      <text x="30" y="${height - 3}">step 0</text><text x="${width - 4}" y="${height - 3}" text-anchor="end">step
      ${last}</text>
    </svg><p class="legend"><span style="color:#0072b2">━ train</span>
      <span style="color:#d55e00">━ validation</span>
      loss against the step, on a log scale; a tick a frame, the dashed line the one shown; click the curve to pick the
      nearest frame</p>`;
    part.append(this.framesAsText());
    part.querySelector("svg").onclick = (event) => {
      const box = event.currentTarget.getBoundingClientRect();
      const place = ((event.clientX - box.left) / box.width * width - 30) / (width - 40);
      const step = Math.expm1(place * Math.log1p(Math.max(1, last)));
      const nearest = frames.reduce((best, frame, index) => (Math.abs(frame.step - step)
        < Math.abs(frames[best].step - step) ? index : best), 0);
      this.pick(nearest);
    };
  }

  // Every frame's numbers as a table under a tap: its step, losses, the largest score of each pattern and the
  // probe's two halves.
  framesAsText() {
    const { film } = this;
    const details = document.createElement("details");
    details.className = "numbers";
    const largest = (frame, pattern) => Math.max(...frame.heads[pattern].flat()).toFixed(3);
    const rows = film.frames.map((frame, index) => `<tr${index === this.index ? ' class="lit"' : ""}>
      <th>${frame.step}</th><td>${number(frame.train_loss)}</td><td>${number(frame.val_loss)}</td>
      ${film.patterns.map((pattern) => `<td>${largest(frame, pattern)}</td>`).join("")}
      <td>${frame.probe_loss.first_half.toFixed(3)}</td><td>${frame.probe_loss.second_half.toFixed(3)}</td></tr>`);
    details.innerHTML = `<summary>every frame as numbers</summary><div class="table-scroll"><table class="rows">
      <thead><tr><th>step</th><th>train</th><th>validation</th>${film.patterns.map((pattern) =>
        `<th>${PATTERN_WORDS[pattern]} (largest)</th>`).join("")}<th>1st half</th><th>2nd half</th></tr></thead>
      <tbody>${rows.join("")}</tbody></table></div>`;
    return details;
  }

  // Each head's score of one pattern at the frame shown, with a line of that score over every frame (the label
  // score dashed, the frame shown marked) and the step from which it stayed above it.
  drawHeads() {
    const { film } = this;
    const part = this.root.querySelector(".film-heads");
    const chooser = Object.keys(PATTERN_WORDS).map((name) => `<button type="button" data-pattern="${name}"
      aria-pressed="${name === this.pattern}">${PATTERN_WORDS[name]}</button>`).join("");
    const frame = film.frames[this.index];
    const scores = frame.heads[this.pattern];
    const rows = scores.map((heads, layer) => `<tr><th>layer ${layer}</th>${heads.map((score, head) => {
      const onset = film.onsets[this.pattern]?.[layer][head];
      return `<td><div class="film-score">head ${head}: ${score.toFixed(3)}</div>${this.sparkline(layer, head)}
        <div class="film-onset">${this.pattern === "ablation" ? "" : onset === null || onset === undefined
          ? "no onset" : `from step ${onset}`}</div></td>`;
    }).join("")}</tr>`).join("");
    const threshold = film.label_scores[this.pattern];
    part.innerHTML = `<h3>What each head does</h3><div class="steps">${chooser}</div>
      <p class="legend">${this.pattern === "ablation" ? "the probe's loss with the head knocked out, less the model's"
        : `the share of the head's attention where ${this.pattern === "induction" ? "an" : "a"}
        ${PATTERN_WORDS[this.pattern]} head looks (gptlite.heads), its line over every frame;
        dashed: ${threshold}, the score from which a head is labelled; "from step": where it crossed it and stayed`}</p>
      <div class="table-scroll"><table class="film-grid">${rows}</table></div>`;
    part.querySelectorAll("button[data-pattern]").forEach((button) => {
      button.onclick = () => { this.pattern = button.dataset.pattern; this.drawHeads(); };
    });
  }

  sparkline(layer, head) {
    const { frames } = this.film;
    const width = 120;
    const height = 36;
    const values = frames.map((frame) => frame.heads[this.pattern][layer][head]);
    const threshold = this.film.label_scores[this.pattern];
    // A share runs from 0 to 1; its line from 0 to the largest any head reached (twice the label score at least).
    const allHeads = frames.flatMap((frame) => frame.heads[this.pattern].flat());
    const [least, largest] = this.pattern === "ablation" ? extent(allHeads)
      : [0, Math.max(2 * threshold, ...allHeads)];
    const last = frames[frames.length - 1].step;
    const x = (step) => 2 + stepPlace(step, last) * (width - 4);
    const y = (value) => 2 + (1 - (value - least) / (largest - least)) * (height - 4);
    const points = frames.map((frame, index) => `${x(frame.step).toFixed(1)},${y(values[index]).toFixed(1)}`);
    const here = frames[this.index];
    return `<svg class="film-spark" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}"
      aria-label="layer ${layer} head ${head}'s ${PATTERN_WORDS[this.pattern]} score at each frame">
      ${threshold === undefined ? "" : `<line x1="0" x2="${width}" y1="${y(threshold)}" y2="${y(threshold)}"
        stroke="#999" stroke-dasharray="2 2"/>`}
      <polyline points="${points.join(" ")}" fill="none" stroke="#222"/>
      <circle cx="${x(here.step)}" cy="${y(values[this.index])}" r="2.5" fill="#d55e00"/></svg>`;
  }

  // The loss on probes of random tokens repeated twice, each half's, at every frame and the one shown.
  drawProbe() {
    const { frames } = this.film;
    const width = 360;
    const height = 100;
    const last = frames[frames.length - 1].step;
    const [least, largest] = extent(frames.flatMap((frame) => [frame.probe_loss.first_half,
      frame.probe_loss.second_half]));
    const x = (step) => 30 + stepPlace(step, last) * (width - 40);
    const y = (loss) => 6 + (1 - (loss - least) / (largest - least)) * (height - 14);
    const line = (half) => frames.map((frame) => `${x(frame.step).toFixed(1)},${y(frame.probe_loss[half])
      .toFixed(1)}`).join(" ");
    const { first_half: first, second_half: second } = frames[this.index].probe_loss;
    this.root.querySelector(".film-probe").innerHTML = `<h3>Learning from the context</h3>
      <p>Loss on random tokens repeated twice: the first half <b>${first.toFixed(3)}</b>, the second half
      <b>${second.toFixed(3)}</b> nats a token. Nothing can predict the first half; the second can be copied from the
      first, and its loss falls once heads that do so (induction heads) form.</p>
      <svg class="graph" viewBox="0 0 ${width} ${height}" width="${width}" role="img"
        aria-label="each half's loss at each frame">
      <polyline points="${line("first_half")}" fill="none" stroke="#999" stroke-width="1.5"/>
      <polyline points="${line("second_half")}" fill="none" stroke="#009e73" stroke-width="1.5"/>
      <line x1="${x(frames[this.index].step)}" x2="${x(frames[this.index].step)}" y1="2" y2="${height - 6}"
        stroke="#222" stroke-dasharray="3 2"/>
      <text x="2" y="${y(largest) + 4}">${largest.toFixed(1)}</text>
      <text x="2" y="${y(least)}">${least.toFixed(1)}</text>
      </svg><p class="legend"><span style="color:#999">━ first half</span>
      <span style="color:#009e73">━ second half</span></p>`;
  }

  // The token table's two principal directions at the frame shown, turned to follow the frame before's, on axes
  // that hold every frame's points (so that they move rather than jump), coloured by group.
  drawEmbedding() {
    const { embedding } = this.film;
    const size = 300;
    const all = embedding.points.flat();
    const [xLeast, xLargest] = extent(all.map(([x]) => x));
    const [yLeast, yLargest] = extent(all.map(([, y]) => y));
    const x = (value) => 10 + (value - xLeast) / (xLargest - xLeast) * (size - 20);
    const y = (value) => 10 + (1 - (value - yLeast) / (yLargest - yLeast)) * (size - 20);
    const colour = (group) => GROUP_COLOURS[embedding.group_names.indexOf(group)] ?? "#999";
    const points = embedding.points[this.index].map(([px, py], token) => {
      const text = embedding.tokens[token];
      const shown = text.length === 1 && text.trim() ? text : "•";
      return `<text x="${x(px).toFixed(1)}" y="${y(py).toFixed(1)}" fill="${colour(embedding.groups[token])}"
        text-anchor="middle" dominant-baseline="middle"><title>${JSON.stringify(text).replace(/</g, "&lt;")}: `
        + `${embedding.groups[token]}</title>${shown.replace(/&/g, "&amp;").replace(/</g, "&lt;")}</text>`;
    }).join("");
    const legend = embedding.group_names.filter((group) => embedding.groups.includes(group))
      .map((group) => `<span style="color:${colour(group)}">■ ${group}</span>`).join(" ");
    this.root.querySelector(".film-embedding").innerHTML = `<h3>The token table in two dimensions</h3>
      <svg class="graph film-points" viewBox="0 0 ${size} ${size}" width="${size}" role="img"
        aria-label="each token's embedding, projected on its two principal directions">${points}</svg>
      <p class="legend">${legend}; each token's vector projected on the table's two principal directions, turned
        to follow the frame before</p>`;
  }

  // What the frame writes (greedy) after the probe's first half, beside what the probe goes on with.
  drawWriting() {
    const { film } = this;
    const half = Math.floor(film.probe_ids.length / 2);
    const opening = film.probe_tokens.slice(0, half).join("");
    const part = this.root.querySelector(".film-writing");
    part.innerHTML = "<h3>What it writes</h3>";
    const line = (words, text) => {
      const row = document.createElement("p");
      const code = document.createElement("code");
      code.textContent = text;
      row.append(words, code);
      return row;
    };
    part.append(line("after ", opening), line("it writes ", film.frames[this.index].writes),
      line("where the probe goes on ", film.probe_tokens.slice(half).join("")));
  }
}
