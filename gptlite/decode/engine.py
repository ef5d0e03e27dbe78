"""The decode engine: one object that owns the decoding state of a batch of slots.

    engine = Engine(model)
    first = engine.admit([prompt_ids], SamplingConfig(seed=1))      # {row: Drawn}, each row's first token
    while engine.rows:
        for row, drawn in engine.step(8).items():                 # up to 8 tokens of every row
            ...                                                     # engine.retire(row) once it has ended

Every caller decodes through it: `generate` and `stream`, a Seq2Seq's
targets (and so evaluation and the attention view's greedy target), beam
search, and the server, which admits requests into the running batch
between steps (continuous batching).

The life of a slot:

    free --admit--> prefill: the window runs through the model once; the
                    first token is chosen from its last position
         --step---> each step feeds every row its pending token at its own
                    position, writes its key and value into the cache and
                    chooses the next token (a full window moves `slide`
                    tokens and is recomputed: every position shifted)
         --retire-> free (its row of the state stays, inactive, until a
                    resize drops it or an admission reuses it)

The state (`DecodeState`), one row per slot, kept on the device between calls
and handed whole to the compiled loop, which gives it back:

    window (S, block_size)  each row's last tokens, left-aligned
    lengths (S,)            how many of them are real
    cache                   keys and values of window[:, :lengths], one (S, 2, K, span, D) tensor a block
    pending (S,)            the token chosen last, not yet in the window
    settings                each row's sampling settings, a RowSettings of (S,) tensors
    seeds (S,), produced (S,)  each row's seed and how many tokens it has drawn: its noise's coordinates
    context                 what every step reads besides: a Seq2Seq's source keys, values and mask; () for a GPT

and on the host: which slot holds which row (`rows`), and each slot's length,
count, activity and settings again (`HostRows`), from which each call is
planned (`gptlite.decode.planning`): which steps recompute and how long a
cache the steps read (`short_caches`: a power of two from
SHORTEST_CACHE up to block_size, enough for the longest active row, so that
a batch of many short texts reads no empty cache; with a `reach`, the
caller's bound on the rows' lengths, the span that holds it from the first
call; otherwise block_size).

Randomness is explicit: token t of a row draws its noise from (the row's
seed, t) (`sampling.uniform_noise`), so a row's text depends on its seed
alone, not on what shares its batch, when it was admitted or how its steps
were split into calls. Sampling is the Gumbel-max trick on that noise.
"""

import collections
import dataclasses
import functools

import keras
import numpy as np
from keras import ops

from gptlite.backend.runtime import running
from gptlite.decode.planning import (advanced_lengths, cache_span, NARROWEST_PREFILL, plan_steps, power_of_two,
                                     prompt_columns, SHORTEST_CACHE, windows, windows_advanced)
from gptlite.decode.programs import CACHED, CHUNK_SIZE, fit_cache, programs_for, RECOMPUTE
from gptlite.decode.sampling import row_configs, RowSettings

# Which of a process's prefills of one shape starts compiling it (see Engine._prefill): a process that decodes
# once or twice compiles nothing more, one that goes on (a loop of calls, a chat, an evaluation) soon runs faster.
PREFILL_THAT_COMPILES = 3


@dataclasses.dataclass
class Drawn:
    """One row's tokens from one call: ids (n,); with log-probabilities asked for, the model's log-probability
    of each (n,) and the TOP_LOGPROBS likeliest tokens' ids and log-probabilities (n, TOP_LOGPROBS)."""

    ids: np.ndarray
    logprobs: np.ndarray = None
    top_ids: np.ndarray = None
    top_logprobs: np.ndarray = None


class DecodeState(collections.namedtuple("DecodeState",
                                         "window lengths cache pending settings seeds produced context")):
    """The decoding state of a batch of slots, one row a slot, on the device; the compiled loop takes it and
    gives it back whole (see the module's docstring for each part)."""

    __slots__ = ()


class HostRows(collections.namedtuple("HostRows", "lengths produced active settings")):
    """What the host keeps of each slot to plan calls from: its window's length, how many tokens it has drawn,
    whether it holds a row, and its settings (a RowSettings of NumPy arrays)."""

    __slots__ = ()

    @classmethod
    def empty(cls, capacity):
        return cls(np.zeros(capacity, np.int32), np.zeros(capacity, np.int32), np.zeros(capacity, bool),
                   RowSettings(*(np.ones(capacity, np.float32) for _ in RowSettings._fields)))

    def taken(self, order):
        """The slots `order` (an index array), in that order."""
        return keras.tree.map_structure(lambda values: values[order], self)


class Engine:
    """The decoding state of a batch of slots, and the operations on it: `admit`, `step`, `retire`,
    and `beam_search`.

    `capacity` slots to start with; with `resizable`, the batch grows (in
    powers of two) to admit more rows and shrinks once few are left, so that
    a handful of compiled programs serve every load. `use_cache=False`
    recomputes the window for every token (the same text: it is there to
    check the cache against); `slide` is how far a full window moves.
    Programs leave out the top-k, top-p and min-p filters where no row uses
    them; with `mixed_settings` (rows that come and go with any settings,
    as a server's do) one program decides at each step instead, so that no
    row's arrival needs another compiled. `compiled_prefill`: the prefill
    compiles (XLA) where the model's is a plain graph (a GPT's, so that a
    process's first token waits for no compiler): for a process that builds
    its programs before it decodes (a server's warm-up), whose admissions
    then cost less than half. `reach`: where the caller knows it, the most
    positions a row will fill (a generation's longest prompt and its new
    tokens): every call's cache then has `cache_span(reach)` slots from the
    first, so that one program serves the whole generation and no step reads
    the empty slots past it (a row that goes further lengthens the cache, as
    with short caches). `recompute_by_prefill` (an attribute, which a caller
    may also set and clear later): a GPT's recomputing steps run one prefill
    call a step rather than through the recomputing loop, the same text, so
    that a process that has built its prefills need not wait for that loop
    to compile (a server's warm-up builds it last); such a step costs 1.1x
    (8 rows) to 1.5x (one row) the loop's at the `cpu` preset's shape.
    """

    def __init__(self, model, capacity=1, *, resizable=False, short_caches=False, use_cache=True, slide=1,
                 mixed_settings=False, compiled_prefill=False, reach=0, recompute_by_prefill=False):
        self.model = model
        self.programs = programs_for(model)
        self.block_size = model.config.block_size
        self.vocabulary_size = model.config.vocab_size
        self.resizable, self.short_caches, self.use_cache, self.slide = resizable, short_caches, use_cache, slide
        self.mixed_settings, self.compiled_prefill = mixed_settings, compiled_prefill
        self.reach = min(int(reach), self.block_size)
        self.recompute_by_prefill = recompute_by_prefill
        self.capacity = capacity
        self.rows = {}  # row handle -> its slot
        self._next_handle = 0
        self._clear()

    def _clear(self):
        """No state: the next admission fills the batch afresh."""
        self.state = None
        self.host = HostRows.empty(self.capacity)

    # --- admitting rows

    def admit(self, rows_ids, sampling, sources=None, logprobs=False, next_steps=None):
        """Prefill new rows into free slots; {row handle: Drawn, its first token}, in the order given.

        rows_ids: each row's token ids (its window is the last block_size).
        sampling: one SamplingConfig for every row (each row then gets a seed
        made from its seed, see `SamplingConfig.for_rows`) or a list of one
        per row, whose seeds are taken as they are (None: a random one).
        sources: a Seq2Seq's source ids (N, S), or None. `logprobs`: the
        first tokens come with their log-probabilities. `next_steps`: the
        caller's next call is `step(next_steps, logprobs)`; where the batch
        starts afresh, that step's program is then built while the prefill
        runs (its compile overlaps the prefill's, see `Compiled.prepare`).
        """
        count = len(rows_ids)
        if not self.resizable and count > self.capacity - len(self.rows):
            raise ValueError(f"{count} rows do not fit in {self.capacity - len(self.rows)} free slots")
        configs = row_configs(sampling, count)
        window, lengths = windows(self.block_size, rows_ids)
        settings = RowSettings.of(configs, self.vocabulary_size)
        seeds = np.array([config.seed % 2**31 for config in configs], np.int32)
        starting = not self.rows
        if starting:
            # The batch starts afresh: its free slots are padding rows, inactive.
            self.capacity = power_of_two(count) if self.resizable else self.capacity
            self._clear()
        # Rows joining a running batch are prefilled in a power of two rows, so that few programs serve every count.
        padded = self.capacity if starting else power_of_two(count)
        pad = lambda array: np.concatenate([array, np.repeat(array[:1], padded - count, axis=0)])
        window, lengths, settings, seeds = keras.tree.map_structure(pad, (window, lengths, settings, seeds))
        sources = None if sources is None else pad(np.asarray(sources, np.int32))
        if starting and next_steps and sources is None:
            self._prepare_step(window, lengths, settings, seeds, count, next_steps, logprobs)
        # With a reach, the prefill writes the cache at the span every call will read: the first step would
        # otherwise widen it eagerly, which at the cpu preset's size costs about a third of a call of 32 steps.
        span = cache_span(self.reach, self.block_size) if self.reach else None
        # An engine of short caches prefills at their spans too: fewer programs, for a process that decodes long.
        narrowest = SHORTEST_CACHE if self.short_caches else NARROWEST_PREFILL
        inputs = (prompt_columns(window, lengths, sources, narrowest), lengths, sources, settings, seeds,
                  np.zeros(padded, np.int32))
        pending, cache, context, *scores = self._prefill(logprobs, settings, span, inputs)(*inputs)
        new = DecodeState(window, lengths, cache, pending, settings, seeds, np.ones(padded, np.int32), context)
        if starting:
            self.state = new
            slots = list(range(count))
        else:
            slots = self._merge(new, count)
        handles = []
        for index, slot in enumerate(slots):
            self.rows[self._next_handle] = slot
            self.host.lengths[slot], self.host.produced[slot], self.host.active[slot] = lengths[index], 1, True
            for host_values, values in zip(self.host.settings, settings):
                host_values[slot] = values[index]
            handles.append(self._next_handle)
            self._next_handle += 1
        tokens = keras.ops.convert_to_numpy(pending)[:count, None]
        scores = [keras.ops.convert_to_numpy(value)[:count, None] for value in scores] or [[None] * count] * 3
        return {handle: Drawn(tokens[index], *(value[index] for value in scores))
                for index, handle in enumerate(handles)}

    def _prefill(self, logprobs, settings, span, inputs):
        """The prefill program for `inputs`. A GPT's is a plain graph, so that a process's first token waits for
        no compiler; under TensorFlow, a process's PREFILL_THAT_COMPILES-th prefill of one shape starts compiling
        it with XLA on a thread of its own, and the prefills after it run compiled once that is done (at the `cpu`
        preset's size, about 1 ms against 3)."""
        needs = (logprobs, *self._needs(settings))
        prefill = self.programs.prefill(*needs, compiled_prefill=self.compiled_prefill, span=span)
        if prefill.xla or not running().compiles_prefill_aside:
            return prefill
        compiled = self.programs.prefill(*needs, compiled_prefill=True, span=span)
        if compiled.ready(*inputs):
            return compiled
        if prefill.calls(*inputs) + 1 >= PREFILL_THAT_COMPILES:
            compiled.prepare(*inputs, aside=True)
        return prefill

    def _prepare_step(self, window, lengths, settings, seeds, count, max_steps, logprobs):
        """Prepare the program of the first `step(max_steps, logprobs)` after the prefill of a fresh batch: the
        state it will be given, as step() will make it, with a zero cache and zero pending tokens."""
        active = np.arange(len(window)) < count
        steps, kind, span = plan_steps(lengths[active], self.block_size, max_steps, self.use_cache, self.slide,
                                       self.short_caches, reach=self.reach)
        loop = self.programs.loop("sample", kind, self.slide, logprobs, *self._needs(settings.rows(active)))
        if not self.programs.first_preparation(loop, len(window), span):
            return  # prepared before in this process: its program is ready, and the state need not be made
        state = DecodeState(window, lengths, self.model.empty_cache(len(window), span),
                            np.zeros(len(window), np.int32), settings, seeds, np.ones(len(window), np.int32), ())
        loop.prepare(state, _active_limits(active, max_steps), np.int32(steps))

    def _merge(self, new, count):
        """Place the first `count` rows of `new` (a prefill's DecodeState) into free slots; their slots."""
        if self.resizable and len(self.rows) + count > self.capacity:
            self._resize(power_of_two(len(self.rows) + count))
        slots = [slot for slot in range(self.capacity) if not self.host.active[slot]][:count]
        span = max(ops.shape(self.state.cache[0])[3], ops.shape(new.cache[0])[3])
        old, new = (state._replace(cache=fit_cache(state.cache, span)) for state in (self.state, new))
        if running().rows_on_device():  # the rows stay on the device, placed by one program
            taken = np.zeros(self.capacity, np.int32)
            taken[slots] = np.arange(count)
            placed = np.zeros(self.capacity, bool)
            placed[slots] = True
            self.state = self.programs.placed(old, new, taken, placed)
        else:
            # On a CPU with NumPy: no program to compile for each batch size and count of joining rows (0.1-0.15 s
            # each under JAX, 8 of a server's 20), at about the cost of that program's call (both copy the state).
            old, new = (keras.tree.map_structure(np.asarray, state) for state in (old, new))
            self.state = keras.tree.map_structure(functools.partial(_rows_placed, slots=slots), old, new)
        return slots

    def _resize(self, capacity):
        """Move the active rows to the first slots of a batch of `capacity`."""
        kept = sorted(self.rows.items(), key=lambda item: item[1])
        order = np.zeros(capacity, np.int32)
        order[:len(kept)] = [slot for _, slot in kept]
        self.state = keras.tree.map_structure(functools.partial(_rows_taken, order=order,
                                                                 on_host=not running().rows_on_device()),
                                              self.state)
        self.host = self.host.taken(order)._replace(active=np.arange(capacity) < len(kept))
        self.rows = {handle: slot for slot, (handle, _) in enumerate(kept)}
        self.capacity = capacity

    def _needs(self, settings):
        """(filtering, penalised, sampling): whether some row of `settings` (a RowSettings) filters tokens (None:
        decided in the program, with mixed_settings), has a repetition penalty, samples rather than takes the
        likeliest token (the noise of every row is then drawn: two random operations a row). Each is a program
        of its own, so that programs leave out what no row needs."""
        if self.mixed_settings:
            return None, settings.penalises(), True
        return settings.filters(self.vocabulary_size), settings.penalises(), settings.samples()

    def retire(self, handle):
        """Free a row's slot. A resizable batch with a quarter of its slots in use shrinks to fit them at its next
        step: rows that end together (a server's, sent together) then free theirs with no resize between."""
        slot = self.rows.pop(handle)
        self.host.active[slot] = False
        if not self.rows:
            self._clear()

    def _shrink(self):
        if self.resizable and self.capacity >= 4 and len(self.rows) <= self.capacity // 4:
            self._resize(power_of_two(len(self.rows)))

    # --- stepping

    def step(self, max_steps=CHUNK_SIZE, logprobs=False, limits=None):
        """Draw up to `max_steps` (<= CHUNK_SIZE) tokens for every active row in one call; {row handle: Drawn}.

        A call holds steps of one kind: it may draw fewer tokens than asked,
        where the window of some row fills (or, with a wide slide, has moved).
        `limits`: {row handle: the most tokens it draws in this call}, for rows
        about to end: a row that has drawn them waits, as it is, while the
        others go on, and its full window no longer splits their calls.
        """
        if not self.rows:
            return {}
        self._shrink()
        limits = self._limits(max_steps, limits)  # (S,): 0 for a free slot
        if not limits.any():
            return {handle: Drawn(np.zeros(0, np.int32)) for handle in self.rows}
        active = self.host.active
        steps, kind, span = plan_steps(self.host.lengths[active], self.block_size, max_steps, self.use_cache,
                                       self.slide, self.short_caches, limits[active], self.reach)
        state = self.state._replace(cache=fit_cache(self.state.cache, span))
        if kind == RECOMPUTE and self.recompute_by_prefill and not state.context:
            drawn, self.state, scores = self._recomputed_by_prefill(state, limits, steps, logprobs)
        else:
            loop = self.programs.loop("sample", kind, self.slide, logprobs,
                                      *self._needs(self.host.settings.rows(active)))
            drawn, self.state, scores = loop(state, limits, np.int32(steps))
        taken = np.minimum(steps, limits)  # (S,)
        if kind == CACHED:  # no window was full: each grew a token a step it took
            lengths = self.host.lengths + taken
        else:
            lengths = self.host.lengths
            for step in range(steps):
                lengths = np.where(step < limits, advanced_lengths(lengths, self.block_size, self.slide), lengths)
        self.host = self.host._replace(lengths=lengths, produced=self.host.produced + taken)
        drawn = keras.ops.convert_to_numpy(drawn)
        scores = [keras.ops.convert_to_numpy(value) for value in scores]
        return {handle: Drawn(drawn[slot, :taken[slot]], *(value[slot, :taken[slot]] for value in scores))
                for handle, slot in self.rows.items()}

    def _recomputed_by_prefill(self, state, limits, steps, logprobs):
        """What the recomputing loop gives for `steps` steps (see `step`), each step a call of the prefill program:
        each going row's window takes its pending token (a full one moves first, as `Programs._advance` moves it),
        then the prefill draws the row's next token from the whole window, with that token's noise."""
        window, pending = np.array(state.window), np.array(state.pending)
        lengths, produced = self.host.lengths.copy(), np.array(state.produced)
        drawn = np.zeros((len(window), CHUNK_SIZE), np.int32)
        recorded = []
        prefill = None
        for step in range(steps):
            going = step < limits
            window, lengths = windows_advanced(window, lengths, pending, going, self.block_size, self.slide)
            inputs = (window, lengths, None, state.settings, state.seeds, produced + step)
            prefill = prefill or self._prefill(logprobs, self.host.settings.rows(self.host.active), None, inputs)
            tokens, cache, _, *scores = prefill(*inputs)
            pending = np.where(going, keras.ops.convert_to_numpy(tokens), pending)
            drawn[:, step] = pending
            recorded.append([keras.ops.convert_to_numpy(value) for value in scores])
        scores = tuple(np.stack(values, axis=1) for values in zip(*recorded))  # (S, steps, ...) each, if asked for
        state = state._replace(window=window, lengths=lengths, cache=cache, pending=pending,
                               produced=produced + np.minimum(steps, limits))
        return drawn, state, scores

    def _limits(self, max_steps, limits):
        """Each slot's most tokens in a call: max_steps for an active row (or its limit, if lower), 0 for a free
        slot."""
        slots = _active_limits(self.host.active, max_steps)
        for handle, limit in (limits or {}).items():
            slot = self.rows[handle]
            slots[slot] = min(slots[slot], max(0, int(limit)))
        return slots

    # --- beam search

    def beam_search(self, rows_ids, max_new_tokens, beams, end_token, sources=None):
        """The likeliest continuation of each row found by beam search: an int array (N, up to max_new_tokens).

        Every beam of every row is a slot; decoding ends early once every
        beam has chosen `end_token` (None: never). The engine must be empty.
        """
        count = len(rows_ids)
        if max_new_tokens == 0:
            return np.zeros((count, 0), "int32")
        window, lengths = windows(self.block_size, rows_ids)
        window, lengths = np.repeat(window, beams, axis=0), np.repeat(lengths, beams)  # (N * beams, block_size)
        if sources is not None:
            sources = np.repeat(np.asarray(sources, np.int32), beams, axis=0)
        self.capacity = len(window)
        self._clear()
        scores = np.full((count, beams), -np.inf, dtype="float32")
        scores[:, 0] = 0  # the copies of a row are one beam until the first choice
        finished = np.zeros(len(window), dtype=bool)
        end_token = np.int32(-1 if end_token is None else end_token)
        pending, scores, finished, window, device_lengths, cache, context = self.programs.beam_prefill(
            window, prompt_columns(window, lengths, sources), lengths, sources, scores, finished, end_token)
        sequences = keras.ops.convert_to_numpy(pending)[:, None]  # (N * beams, produced)
        while sequences.shape[1] < max_new_tokens and not keras.ops.convert_to_numpy(finished).all():
            steps, kind, span = plan_steps(lengths, self.block_size, max_new_tokens - sequences.shape[1],
                                           self.use_cache, self.slide, self.short_caches, reach=self.reach)
            drawn, parents, window, device_lengths, cache, pending, scores, finished = self.programs.loop(
                "beam", kind, self.slide)(window, device_lengths, fit_cache(cache, span), pending, context, scores,
                                          finished, end_token, np.int32(steps))
            for _ in range(steps):
                lengths = advanced_lengths(lengths, self.block_size, self.slide)
            drawn, parents = keras.ops.convert_to_numpy(drawn), keras.ops.convert_to_numpy(parents)
            for step in range(steps):
                sequences = np.concatenate([sequences[parents[:, step]], drawn[:, step, None]], axis=1)
        self._clear()
        return sequences[::beams]  # beams come sorted by score: the first of each row is the best


def _rows_taken(value, order, on_host):
    """value's rows (axis 0) in `order`. On a CPU with NumPy: Keras's `take` costs about 1 ms a call in eager
    TensorFlow, 10 ms for a state's 14 arrays at the `cpu` preset's shape, NumPy's 1.3 ms in all; on a GPU
    the rows stay on it."""
    if on_host:
        return np.take(keras.ops.convert_to_numpy(value), order, axis=0)
    return ops.take(value, order, axis=0)


def _rows_placed(kept, new, slots):
    """A NumPy copy of `kept` (S, ...) whose rows `slots` are the first len(slots) rows of `new`."""
    kept = np.array(kept)  # a copy: a backend's arrays seen through NumPy are read-only
    kept[slots] = new[:len(slots)]
    return kept


def _active_limits(active, max_steps):
    """(S,) int32: max_steps for each active slot of the boolean `active`, 0 for a free one."""
    return np.where(active, max_steps, 0).astype(np.int32)
