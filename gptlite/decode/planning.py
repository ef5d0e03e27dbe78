"""The host's plan of each decode call, from the rows' window lengths alone: which steps it runs (cached, or
recomputing a full window), how long a cache they read, which columns a prefill reads; and the windows
themselves as the host keeps them (see `gptlite.decode.engine`)."""

import numpy as np

from gptlite.decode.programs import CACHED, RECOMPUTE, RECOMPUTE_THEN_CACHED

# The shortest cache a call reads.
SHORTEST_CACHE = 64
# The narrowest prefill of a GPT's windows: a short prompt costs a short pass.
NARROWEST_PREFILL = 8


def windows(block_size, rows_ids):
    """Each row's last block_size token ids, left-aligned in (N, block_size), and their lengths (N,)."""
    window = np.zeros((len(rows_ids), block_size), dtype=np.int32)
    lengths = np.zeros(len(rows_ids), dtype=np.int32)
    for index, ids in enumerate(rows_ids):
        context = ids[-block_size:]
        window[index, : len(context)] = context
        lengths[index] = len(context)
    return window, lengths


def windows_advanced(window, lengths, tokens, going, block_size, slide):
    """The windows (S, block_size) and lengths (S,) after the going rows (S,) take `tokens` (S,), on the host:
    `Programs._advance`'s windows."""
    slid = np.concatenate([window[:, slide:], tokens[:, None], np.zeros((len(window), slide - 1), np.int32)], axis=1)
    placed = np.where(np.arange(block_size)[None, :] == lengths[:, None], tokens[:, None], window)
    moved = np.where((lengths >= block_size)[:, None], slid, placed)
    return (np.where(going[:, None], moved, window),
            np.where(going, advanced_lengths(lengths, block_size, slide), lengths).astype(np.int32))


def advanced_lengths(lengths, block_size, slide):
    """Window lengths after one step: one longer, or, for a full window, moved back by `slide`."""
    return np.where(lengths >= block_size, block_size - slide + 1, lengths + 1)


def power_of_two(count):
    """The least power of two at least `count` (1 for 0)."""
    return 1 << (max(1, count) - 1).bit_length()


def cache_span(slots, block_size):
    """The cache length that holds `slots` positions: a power of two, at least SHORTEST_CACHE, at most block_size.

    Powers of two, so that texts of every length compile each loop a few
    times at most (once per span).
    """
    return min(block_size, max(SHORTEST_CACHE, 1 << (max(1, slots) - 1).bit_length()))


def prompt_columns(window, lengths, sources, narrowest=NARROWEST_PREFILL):
    """The columns of the windows that the prefill reads: enough for the longest.

    A GPT's: a power of two, at least `narrowest`, so that a short prompt in
    a long context runs through the model at about its length rather than
    the whole window's, for a few traces at most. A Seq2Seq's windows are
    short, most often its start token alone: exactly the longest.
    """
    longest = max(1, int(np.max(lengths)))
    if sources is not None:
        return window[:, :longest]
    return window[:, :min(window.shape[1], max(narrowest, power_of_two(longest)))]


def plan_steps(lengths, block_size, max_steps, use_cache, slide, short_caches=False, limits=None, reach=0):
    """The next call for rows of window `lengths`: (steps, steps kind, cache span).

    Which steps find a full window, and so must recompute it, follows from
    the window lengths alone: a window grows by one token a step until it is
    full, then moves back by `slide`. A call holds up to `max_steps` steps
    of one kind, but one recomputing step may lead cached ones
    (RECOMPUTE_THEN_CACHED). `limits`: each row's most steps (None: no
    limit); a row past its limit waits, and its window decides nothing. Its
    cache has block_size slots, unless `short_caches`: a cached step writes
    at the longest window's length, so a call of cached steps then has
    `cache_span` of its last step's length + 1 slots (a waiting row's
    included: its cache is kept); a recomputing one, block_size. With a
    `reach` (the most positions a row is expected to fill), the span is at
    least `cache_span(reach)` and is planned as with short caches.
    """
    lengths = np.asarray(lengths)
    limits = np.full(len(lengths), max_steps) if limits is None else np.asarray(limits)
    if use_cache and len(lengths) and int(lengths.max()) + max_steps <= block_size:
        steps, kind, slots = _cached_call(lengths, max_steps, limits)
    else:
        steps, kind, slots = _call_step_by_step(lengths, block_size, max_steps, use_cache, slide, limits)
    if short_caches or reach:
        return steps, kind, cache_span(max(slots, reach), block_size)
    return steps, kind, block_size


def _cached_call(lengths, max_steps, limits):
    """(steps, kind, slots) of a call in which no window fills, as `_call_step_by_step` finds them, at once
    (most calls): every step is cached, and the call ends when its last going row has drawn its tokens. At
    step s row b's window is lengths[b] + min(s, limits[b]) long and the step writes the slot after it (a
    waiting row's included), so the last step's are the furthest."""
    steps = min(max_steps, int(limits.max()))
    if steps == 0:
        return 0, None, 0
    return steps, CACHED, int(np.max(lengths + np.minimum(steps - 1, np.maximum(limits, 0)))) + 1


def _call_step_by_step(lengths, block_size, max_steps, use_cache, slide, limits):
    """(steps, kind, slots): the call's steps, their kind and the cache slots its steps write, found by
    following the windows step by step."""
    steps, kind, slots = 0, None, 0
    while steps < max_steps:
        going = limits > steps
        if len(lengths) and not going.any():
            break
        full = (lengths >= block_size) & going
        step_kind = RECOMPUTE if full.any() or not use_cache else CACHED
        if kind is None:
            kind = step_kind
        elif kind == RECOMPUTE and steps == 1 and step_kind == CACHED:
            kind = RECOMPUTE_THEN_CACHED
        elif step_kind != kind and not (kind == RECOMPUTE_THEN_CACHED and step_kind == CACHED):
            break
        slots = max(slots, block_size if step_kind == RECOMPUTE else int(lengths.max(initial=0)) + 1)
        lengths = np.where(going, advanced_lengths(lengths, block_size, slide), lengths)
        steps += 1
    return steps, kind, slots
