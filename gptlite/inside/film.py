"""A run's film read back: `film(out_dir)` gives the frames a run kept with `film=True` (`training.film`), each the
model's weights at one step with the losses the run logged there, and what each frame shows of the model's inside.

    movie = gptlite.film("runs/notes")
    movie.frames[3].step, movie.frames[3].val_loss        # the run's own figures at that frame
    model = movie.frames[3].model()                        # a GPT with that step's weights
    movie.heads(3)                                         # gptlite.heads on the film's probe, at that frame
    movie.trace(3)                                         # gptlite.trace of the probe, at that frame
    movie.onsets()["induction"]                            # the step each head became an induction head, (L, H)
    movie.probe_loss(3)                                    # loss on random tokens repeated: first half, second
    movie.embedding()                                      # the token table in 2-D, frame by frame, aligned
    print(movie.table())                                   # a line a frame

Every number is computed from the frame's weights by the functions the rest of gptlite uses: a frame's heads are
`gptlite.heads(frame.model(), movie.probe_ids, calibrate=False)`, its trace `gptlite.trace(frame.model(), ...)`.
"""

import dataclasses
import json
import pathlib

import numpy as np
from keras import ops

from gptlite.errors import InputError
from gptlite.inside import FILM_FOLDER, FILM_INDEX, heads as head_scores, trace as tracing
from gptlite.model.gpt import GPT
from gptlite.weights import saving

# The film index's format (`training.film` writes it).
FORMAT = 1


def frame_file(step, suffix=".npz"):
    """The name of the file of the frame at `step` in a film's folder: its weights (.npz), or in a page's film
    folder its inside graph (.onnx)."""
    return f"step-{step:06d}{suffix}"
# Probes of random tokens repeated twice that a frame's in-context loss is the mean over (`probe_loss`), drawn as
# `heads.probe_ids` draws its one (seeds 0 to PROBE_ROWS - 1).
PROBE_ROWS = 16
# The groups a character's point in the embedding's picture is coloured by, in the legend's order.
CHARACTER_GROUPS = ("vowels", "consonants", "capitals", "digits", "punctuation", "whitespace", "other")
VOWELS = set("aeiou")


@dataclasses.dataclass(frozen=True)
class Frame:
    """One frame of a film: the `step` it was taken at, the run's mean training loss since the frame before (None
    at the first) and its validation loss there, and the file of its weights."""

    step: int
    train_loss: float
    val_loss: float
    path: pathlib.Path
    film: object = dataclasses.field(repr=False, compare=False)

    def model(self):
        """A new GPT with this frame's weights."""
        return self.film.given(self.film.new_model(), self)


@dataclasses.dataclass(frozen=True)
class ProbeLoss:
    """The mean next-token loss (nats a token) on probes of random tokens repeated twice: predicting the first
    half's tokens (nothing earlier to copy) and the second half's (each copied from the first)."""

    first_half: float
    second_half: float


def film(out_dir):
    """The film of the run in `out_dir` (a `Film`); an InputError where it has none."""
    return Film(out_dir)


class Film:
    """The frames of a run's film, in step order, and what each shows (see the module's docstring). A frame's
    figures are computed once, when first asked for."""

    def __init__(self, out_dir):
        self.out_dir = pathlib.Path(out_dir)
        document = read_index(self.out_dir)
        self.config = document["model_config"]
        self.probe, self.probe_ids = document["probe"], np.asarray(document["probe_ids"], np.int32)
        self.frames = [Frame(row["step"], row["train_loss"], row["val_loss"],
                             self.out_dir / FILM_FOLDER / row["file"], self) for row in document["frames"]]
        if not self.frames:
            raise InputError(f"the film in {self.out_dir} has no frame yet")
        self._model = None  # one model that the figures load each frame's weights into in turn
        self._holds = None  # the frame whose weights it holds
        self._figures = {}  # (what, frame index) -> a figure computed once: the frames' figures do not change

    def __len__(self):
        return len(self.frames)

    def new_model(self):
        model = GPT.from_config(self.config)
        model.build((None, None))
        return model

    def weights(self, frame):
        """The weights of `frame` as its file holds them, checked: an InputError names a missing or damaged one."""
        if not frame.path.exists():
            raise InputError(f"the film's frame at step {frame.step} is missing: {frame.path}")
        try:
            with np.load(frame.path) as saved:
                return {name: saved[name] for name in saved.files}
        except (OSError, ValueError, EOFError) as error:
            raise InputError(f"the film's frame at step {frame.step} is damaged ({frame.path}): {error}") from None

    def frame(self, index):
        """The frame at `index`, or the one `index` is already."""
        return index if isinstance(index, Frame) else self.frames[index]

    def given(self, model, frame):
        """`model` (the film's shape) given `frame`'s weights, checked as `weights` checks them."""
        try:
            saving.load_weights_by_layer(model, self.weights(frame))
        except (ValueError, KeyError) as error:
            raise InputError(f"the film's frame at step {frame.step} does not fit its model ({frame.path}): "
                             f"{error}") from None
        return model

    def loaded(self, index):
        """The film's one model, given frame `index`'s weights (until another frame is loaded)."""
        frame = self.frame(index)
        if self._model is None:
            self._model = self.new_model()
        if self._holds is not frame:
            self._holds = None  # a frame that fails to load leaves the model holding none
            self.given(self._model, frame)
            self._holds = frame
        return self._model

    def trace(self, index, **options):
        """`gptlite.trace` of frame `index`'s model on the film's probe (`options` as `trace` takes them)."""
        return tracing.trace(self.loaded(index), self.probe_ids, **options)

    def once(self, what, index, compute):
        """The figure `what` of frame `index`, computed by `compute()` the first time it is asked for."""
        if (what, index) not in self._figures:
            self._figures[what, index] = compute()
        return self._figures[what, index]

    def heads(self, index):
        """`gptlite.heads` of frame `index` on the film's probe (no calibration: frame 0 is the initialisation)."""
        return self.once("heads", index,
                         lambda: head_scores.heads(self.loaded(index), self.probe_ids, calibrate=False))

    def scores(self):
        """Every head's scores over every frame: {name: (F, L, H)} for each of `heads.PATTERNS` and `ablation`."""
        reports = [self.heads(index) for index in range(len(self))]
        return {name: np.stack([getattr(report, name) for report in reports])
                for name in (*head_scores.PATTERNS, "ablation")}

    def onsets(self):
        """For each attention pattern, the step from which each head's score stayed at or above the pattern's
        label score (`heads.LABEL_SCORES`) to the film's last frame: {pattern: (L, H) object array}, None where
        it never did."""
        found = {}
        for pattern, scores in self.scores().items():
            if pattern not in head_scores.LABEL_SCORES:
                continue
            above = scores >= head_scores.LABEL_SCORES[pattern]  # (F, L, H)
            # The first frame of the last unbroken run of frames above, where that run reaches the last frame.
            stays = np.flip(np.logical_and.accumulate(np.flip(above, 0), 0), 0)
            onset = np.full(scores.shape[1:], None, object)
            for layer, head in zip(*np.nonzero(stays[-1])):
                onset[layer, head] = self.frames[int(np.argmax(stays[:, layer, head]))].step
            found[pattern] = onset
        return found

    def probe_loss(self, index):
        """Frame `index`'s loss on PROBE_ROWS probes of random tokens repeated twice, each half's (`ProbeLoss`)."""
        return self.once("probe_loss", index, lambda: self._probe_loss(index))

    def _probe_loss(self, index):
        model = self.loaded(index)
        probes = np.stack([head_scores.probe_ids(model, seed) for seed in range(PROBE_ROWS)])  # (R, S + 2n)
        count = (probes.shape[1] - len(model.tokenizer.text_start_ids)) // 2
        start = probes.shape[1] - 2 * count
        logits = model(ops.convert_to_tensor(probes[:, :-1]))
        log_probabilities = ops.convert_to_numpy(ops.log_softmax(ops.cast(logits, "float32"), axis=-1))
        losses = -np.take_along_axis(log_probabilities, probes[:, 1:, None], axis=-1)[..., 0]  # (R, T - 1)
        # Target t is token t + 1: the first half's tokens after its first, the second half's after its first.
        first = losses[:, start:start + count - 1].mean()
        second = losses[:, start + count:start + 2 * count - 1].mean()
        return ProbeLoss(float(first), float(second))

    def embedding(self):
        """The token table of every frame in 2-D: each frame's two principal components, turned (and mirrored where
        that fits better) to lie closest to the frame before's, so that points move rather than jump. A dict:
        `points` (F, V, 2), `tokens` (each token's text) and `groups` (each token's group, `CHARACTER_GROUPS`)."""
        return self.once("embedding", None, self._embedding)

    def _embedding(self):
        points = []
        for index in range(len(self)):
            table = np.asarray(ops.convert_to_numpy(ops.cast(
                self.loaded(index).embedding.token_embedding.embeddings, "float32")), np.float64)
            centred = table - table.mean(axis=0)
            _, _, directions = np.linalg.svd(centred, full_matrices=False)
            projected = centred @ directions[:2].T  # (V, 2)
            if points:  # orthogonal Procrustes: the turn that takes these points nearest the frame before's
                left, _, right = np.linalg.svd(projected.T @ points[-1])
                projected = projected @ (left @ right)
            points.append(projected)
        model = self.loaded(0)
        tokens = model.tokenizer.pieces(np.arange(model.config.vocab_size))
        return {"points": np.stack(points), "tokens": tokens, "groups": [token_group(token) for token in tokens]}

    def continuation(self, index):
        """What frame `index` writes, greedy, after the probe's first half: as many tokens as the rest of the
        probe, for a reader to set beside it."""
        return self.once("continuation", index, lambda: self._continuation(index))

    def _continuation(self, index):
        from gptlite.decode import generation

        half = len(self.probe_ids) // 2
        model = self.loaded(index)
        prompt = model.tokenizer.decode(self.probe_ids[:half])
        written = generation.generate(model, prompt, max_new_tokens=len(self.probe_ids) - half, temperature=0)
        return written[len(prompt):]

    def table(self):
        """The film as lines of text: a line a frame, with its losses, each pattern's largest head score, the
        probe's two halves' losses and what it writes."""
        lines = [f"the film of {self.out_dir}: {len(self)} frames; probe {self.probe!r}",
                 f"{'step':>6} {'train':>7} {'val':>7} {'prev':>5} {'first':>5} {'curr':>5} {'induct':>6} "
                 f"{'1st half':>8} {'2nd half':>8}  writes"]
        scores = self.scores()
        for index, frame in enumerate(self.frames):
            loss = self.probe_loss(index)
            train = "" if frame.train_loss is None else f"{frame.train_loss:.4f}"
            lines.append(f"{frame.step:>6} {train:>7} {frame.val_loss:>7.4f} "
                         + " ".join(f"{scores[pattern][index].max():>{width}.3f}" for pattern, width in
                                    zip(head_scores.PATTERNS, (5, 5, 5, 6)))
                         + f" {loss.first_half:>8.3f} {loss.second_half:>8.3f}  {self.continuation(index)!r}")
        onsets = self.onsets()
        for pattern in head_scores.PATTERNS:
            marked = [f"layer {layer} head {head} at step {onsets[pattern][layer, head]}"
                      for layer, head in zip(*np.nonzero(onsets[pattern] != None))]  # noqa: E711 (object array)
            lines.append(f"{head_scores.LABELS[pattern]} heads: " + ("; ".join(marked) if marked else "none"))
        return "\n".join(lines)

    def to_json(self):
        """The film as plain JSON, as the page's film view reads it (docs/inspection.md): the probe, and for each
        frame its step, losses, head scores (`heads`), the probe's two halves' losses and what it writes; the steps
        of each head's onset; the embedding's points by frame with each token's text and group."""
        scores = self.scores()
        onsets = self.onsets()
        shown = self.embedding()
        model = self.loaded(len(self) - 1)
        return {
            "probe": self.probe, "probe_ids": [int(i) for i in self.probe_ids],
            "probe_tokens": model.tokenizer.pieces(self.probe_ids),
            "patterns": list(head_scores.PATTERNS), "label_scores": head_scores.LABEL_SCORES,
            "labels": head_scores.LABELS,
            "frames": [{"step": frame.step, "train_loss": frame.train_loss, "val_loss": frame.val_loss,
                        "heads": {name: scores[name][index].tolist() for name in scores},
                        "probe_loss": dataclasses.asdict(self.probe_loss(index)),
                        "writes": self.continuation(index)} for index, frame in enumerate(self.frames)],
            "onsets": {pattern: steps.tolist() for pattern, steps in onsets.items()},
            "embedding": {"points": np.round(shown["points"], 5).tolist(), "tokens": shown["tokens"],
                          "groups": shown["groups"], "group_names": list(CHARACTER_GROUPS)},
        }

    def _repr_html_(self):
        """In Jupyter: the film's view, as the exported page shows it (`notebook.film_html`)."""
        from gptlite.inside import notebook

        return notebook.film_html(self.to_json())

    def induction_onset(self):
        """The step at which the film's first induction head formed (`onsets`), or None."""
        steps = [step for step in self.onsets()["induction"].ravel() if step is not None]
        return min(steps) if steps else None


def token_group(token):
    """The group of a token's text in the embedding's picture (`CHARACTER_GROUPS`)."""
    if len(token) != 1:
        return "other"
    if token.isspace():
        return "whitespace"
    if token.isdigit():
        return "digits"
    if token.isupper():
        return "capitals"
    if token.isalpha():
        return "vowels" if token in VOWELS else "consonants"
    return "punctuation" if token.isprintable() else "other"


def read_index(out_dir):
    """The film index of the run in `out_dir`, or an InputError saying why there is none."""
    path = pathlib.Path(out_dir) / FILM_INDEX
    if not path.exists():
        raise InputError(f"no film in {out_dir}: train with `film=True` to keep one")
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read the film's index {path}: {error}") from None
    if document.get("format") != FORMAT:
        raise InputError(f"{path} was written by another version of gptlite (format {document.get('format')}, "
                         f"this one reads {FORMAT})")
    return document

