"""The one thread that owns the model: it decodes the queued requests in one running batch, between its calls
admitting those that have arrived and retiring those that have ended (continuous batching)."""

import collections
import dataclasses
import queue
import threading
import time
import traceback

import numpy as np

from gptlite.decode.engine import Engine
from gptlite.decode.planning import SHORTEST_CACHE
from gptlite.decode.rows import TextRows
from gptlite.decode.settings import SamplingConfig
from gptlite.errors import GPTLiteError
from gptlite.serving.parsing import Completion
from gptlite.tasks import task as tasks

# Tokens per engine call at most: new requests join the batch between calls.
DECODE_STEPS = 32
# How the worker's engine decodes (see `Engine`): caches as short as its rows need, rows of any sampling settings
# in one program, and prefills compiled too, as the warm-up builds them before the server says it is ready.
ENGINE_SETTINGS = dict(short_caches=True, mixed_settings=True, compiled_prefill=True)


class QueueFull(Exception):
    pass


@dataclasses.dataclass(eq=False)
class Job:
    """A request waiting for, or being decoded by, the worker; `emit` hands each event to the event loop.

    Events: ("pieces", [(choice index, text, finish reason or None, logprobs or None), ...]) as the
    choices grow (a request that does not stream gets one, whole, at the end), then ("done", prompt
    tokens, completion tokens) for each choice; or ("error", message), ("failure", message).
    """

    rows: list  # each choice's prompt
    completion: Completion
    emit: object
    cancelled: bool = False
    live: int = 0  # choices still decoding
    rows_ids: list = None  # each choice's prompt as the model reads it (a Seq2Seq's: its start token)
    sources: object = None  # a Seq2Seq's: each choice's source ids (N, block_size)
    prompt_tokens: list = None
    texts: list = None
    reasons: list = None
    logprobs: list = None
    completion_tokens: list = None


class _Choice:
    """One choice of a job, the key of its row in the worker's TextRows: where its next token's text starts,
    counted as OpenAI counts it for log-probabilities."""

    def __init__(self, job, index, prompt_length):
        self.job, self.index = job, index
        self.offset = prompt_length

    def logprobs(self, tokenizer, drawn):
        """The `_Logprobs` of the tokens a call added to the choice (a Drawn)."""
        new = _Logprobs()
        top = self.job.completion.logprobs
        for position, token_id in enumerate(drawn.ids):
            token = tokenizer.decode([int(token_id)])
            new.add(token, float(drawn.logprobs[position]),
                    {tokenizer.decode([int(i)]): float(value) for i, value in
                     zip(drawn.top_ids[position][:top], drawn.top_logprobs[position][:top])}, self.offset)
            self.offset += len(token)
        return new


@dataclasses.dataclass
class _Logprobs:
    """OpenAI's `logprobs` of a choice: each token, its log-probability, the likeliest tokens', where it starts."""

    tokens: list = dataclasses.field(default_factory=list)
    token_logprobs: list = dataclasses.field(default_factory=list)
    top_logprobs: list = dataclasses.field(default_factory=list)
    text_offset: list = dataclasses.field(default_factory=list)

    def add(self, token, logprob, top, offset):
        self.tokens.append(token)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(offset)

    def extend(self, other):
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            getattr(self, name).extend(getattr(other, name))


class Worker:
    """The one thread that owns the model: it runs the decode engine over the queued jobs (continuous
    batching), and answers attention requests between its calls."""

    def __init__(self, model, settings):
        self.model, self.settings = model, settings
        self.jobs = queue.Queue()
        self.waiting = 0
        self.compiling = 0  # warm-up plans not built yet of those before ready (see warm_up)
        self.planned = 0  # warm-up plans before ready
        self.building = 0  # warm-up plans after ready not built yet (see warm_up)
        self._on_ready = None
        self._lock = threading.Lock()
        self._admissible = collections.deque()  # jobs taken from the queue, waiting for room in the batch
        self._warm_plans = collections.deque()  # (batch size, prefill width) still to build before ready
        self._later_plans = []  # (batch size, None) to build after ready: full windows' recomputing loops
        self._readied = threading.Event()
        # Every request's rows, keyed by their _Choice, join one running batch.
        self.engine = Engine(model, resizable=True, **ENGINE_SETTINGS)
        self.rows = TextRows(self.engine, model.tokenizer)
        self._thread = threading.Thread(target=self._run, name="gptlite-decode", daemon=True)
        # Builds warm-up plans beside the worker's thread (see warm_up).
        self._helper = threading.Thread(target=self._warm_beside, name="gptlite-warm-up", daemon=True)

    def start(self):
        if not self._thread.is_alive():
            self._thread.start()
        if (self._warm_plans or self._later_plans) and self._helper.ident is None:  # not started yet
            self._helper.start()

    def submit(self, job):
        with self._lock:
            if self.waiting >= self.settings.max_queue:
                raise QueueFull
            self.waiting += 1
        self.jobs.put(job)

    def call(self, function):
        """Run `function(model)` on the worker thread; a concurrent.futures.Future of its result."""
        import concurrent.futures

        future = concurrent.futures.Future()
        self.jobs.put((function, future))
        return future

    def warm_up(self, on_ready=None):
        """Plan the programs the worker will meet, to compile before it says it is ready (`ready`): for each
        batch size it can grow to, the prefill of each width with the cached step after it and the rows
        that join a running batch. `on_ready()` is called on the thread that built the last of them (at once,
        here, where there is nothing to build). Then, after ready, each batch size's loop of a full window's
        recomputing steps: until they are built, a full window's steps run through the prefill programs
        (`Engine.recompute_by_prefill`), the same text at 1.1-1.5x the time a step, so no request waits for them.

        Two threads build the plans: the worker's, between requests, and a
        helper beside it, so that one plan's programs are traced (Python,
        one at a time) while another's compile or first run (the backend's
        own code, which the other core runs). Requests that come meanwhile
        are served between two plans (one waits for the plan being compiled
        at most, then for its own programs). On a warm compile cache each
        plan's programs are loaded, not traced or compiled (see
        `gptlite.decode.compiled`). Programs that only some requests need
        (log-probabilities, a repetition penalty) are built when first asked
        for. The plans after ready are the helper's alone, one after the
        other once the last before it is built, so that they do not delay it.
        """
        from gptlite.backend.runtime import running

        self._on_ready = on_ready
        if not running().compiles:
            self._ready()  # nothing to build: the backend (torch) decodes eagerly
            return
        block_size = self.model.config.block_size
        # Prompts of each prefill width (a power of two), whose rows' next steps read a cache of its span; None:
        # full windows, recomputed.
        widths = sorted({min(block_size, SHORTEST_CACHE << k)
                         for k in range(max(1, block_size // SHORTEST_CACHE).bit_length())})
        capacities = [1 << k for k in range(_padded(self.settings.max_batch).bit_length())]
        self._warm_plans.extend((capacity, width) for capacity in capacities for width in widths)
        self.planned = self.compiling = len(self._warm_plans)
        self._later_plans = [(capacity, None) for capacity in capacities]
        self.building = len(self._later_plans)
        self.engine.recompute_by_prefill = True

    @property
    def ready(self):
        """Whether every program planned before ready is built: from then on, no request waits for a compiler."""
        return self.compiling == 0

    def status(self):
        """What `/health` says of the worker."""
        compiling = self.compiling  # read once: the worker's thread counts it down meanwhile
        return {"status": "warming" if compiling else "ok", "waiting": self.waiting, "compiling": compiling,
                "programs": self.planned, "building": self.building}

    def _ready(self):
        self._readied.set()
        if self._on_ready is not None:
            self._on_ready()
            self._on_ready = None

    def _warm_beside(self):
        """The helper's work: plans before ready beside the worker's thread, then, once ready (the last plan
        before it may still be the worker's), the plans after it, one by one."""
        while True:
            try:
                if not self._warm_next():
                    break
            except Exception:  # a plan that fails leaves its programs to be built when first needed
                traceback.print_exc()
        self._readied.wait()
        for plan in self._later_plans:
            try:
                self._build(*plan)
            except Exception:
                traceback.print_exc()
            if self.building == 1:  # the last: the worker's next recomputing steps are its loops'
                self.engine.recompute_by_prefill = False
            self.building -= 1

    def _warm_next(self):
        """Build the next plan before ready, if one is left (then True)."""
        try:
            capacity, width = self._warm_plans.popleft()
        except IndexError:  # the other thread took the last
            return False
        try:
            self._build(capacity, width)
        finally:
            with self._lock:
                self.compiling -= 1
                ready = self.compiling == 0
            if ready:
                self._ready()
        return True

    def _build(self, capacity, width):
        """Build the programs of a batch of `capacity` rows of `width` (None: full windows)."""
        block_size = self.model.config.block_size
        length = block_size if width is None else max(1, width - 1)
        engine = Engine(self.model, capacity, **ENGINE_SETTINGS)

        # One row starts the batch, then rows join it as a running batch's do, in every power of two that
        # fits (1, 2, .. capacity / 2), so that placing them into its free slots is built too (on a GPU; on a
        # CPU they are placed with NumPy).
        def admit(count):
            rows_ids, sources = tasks.warm_rows(self.model, length, count)
            engine.admit(rows_ids, [SamplingConfig(seed=0)] * count, sources)

        admit(1)
        joining = 1
        while len(engine.rows) + joining <= capacity:
            admit(joining)
            joining *= 2
        if capacity >= 4:
            # Then more than half a batch joins one row left: the worker's batch, which shrank to fit that
            # row, grows back to take them (as when the clients of rows that ended together come back).
            for handle in list(engine.rows)[1:]:
                engine.retire(handle)
            admit(capacity - 1)
        engine.step(1)

    def _run(self):
        while True:
            try:
                idle = not self.rows and not self._admissible
                self._take(block=idle and not self._warm_plans)
                self._admit()
                if self.rows:
                    self._step()
                elif self._warm_plans and not self._admissible:
                    self._warm_next()
            except Exception as error:  # the worker must live on: the requests get a 500, the server keeps serving
                traceback.print_exc()
                self._fail_all(f"decoding failed: {type(error).__name__}: {error}")

    def _take(self, block):
        """Move queued jobs to the admissible ones, and run calls at once. An idle worker
        waits for the first job, then `batch_window_ms` for others to prefill with it."""
        deadline = None
        while True:
            try:
                if block and deadline is None:
                    item = self.jobs.get()
                    deadline = time.monotonic() + self.settings.batch_window_ms / 1000
                elif deadline is not None:
                    item = self.jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                else:
                    item = self.jobs.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                function, future = item
                try:
                    future.set_result(function(self.model))
                except Exception as error:  # handed to the waiting request
                    future.set_exception(error)
                continue
            with self._lock:
                self.waiting -= 1
            self._admissible.append(item)

    def _admit(self):
        """Prefill the admissible jobs that fit into the running batch, in the order they came."""
        if not self._admissible:
            return
        jobs = []
        room = self.settings.max_batch - len(self.rows)
        while self._admissible and (len(self._admissible[0].rows) <= room or not self.rows and not jobs):
            job = self._admissible.popleft()
            if job.cancelled:
                continue
            room -= len(job.rows)
            jobs.append(job)
        if not jobs:
            return
        choices, rows_ids, sources, configs = [], [], [], []
        try:
            for job in jobs:
                self._start(job)
                choices += [_Choice(job, index, len(prompt) if job.completion.echo else 0)
                            for index, prompt in enumerate(job.rows)]
                rows_ids += job.rows_ids
                sources.append(job.sources)
                configs += job.completion.sampling.for_rows(len(job.rows))  # a request's n choices: n seeds
            asked = [choice.job.completion for choice in choices]
            sources = None if sources[0] is None else np.concatenate(sources)  # a Seq2Seq's
            written = self.rows.admit(choices, rows_ids, configs, sources,
                                      logprobs=any(completion.logprobs is not None for completion in asked),
                                      answers=[completion.chat for completion in asked],
                                      streaming=[completion.stream for completion in asked])
        except GPTLiteError as error:
            for job in jobs:
                job.emit(("error", str(error)))
            return
        self._deliver(written)

    def _start(self, job):
        count = len(job.rows)
        job.live = count
        job.texts, job.reasons, job.completion_tokens = [""] * count, [None] * count, [0] * count
        job.logprobs = [_Logprobs() if job.completion.logprobs is not None else None for _ in range(count)]
        job.rows_ids, job.sources, job.prompt_tokens = job.completion.decoding_rows(self.model)
        if job.completion.echo:
            echoed = [(prompt, _prompt_logprobs(self.model, ids, job.completion.logprobs)
                       if job.completion.logprobs is not None else None)
                      for prompt, ids in zip(job.rows, job.rows_ids)]
            job.texts = [prompt for prompt, _ in echoed]
            job.logprobs = [logprobs for _, logprobs in echoed]
            if job.completion.stream:
                job.emit(("pieces", [(index, prompt, None, logprobs)
                                     for index, (prompt, logprobs) in enumerate(echoed)]))

    def _step(self):
        for choice in self.rows.keys():
            if choice.job.cancelled:
                self.rows.cancel(choice)
        if self.rows:
            self._deliver(self.rows.step(DECODE_STEPS, logprobs=any(
                choice.job.completion.logprobs is not None for choice in self.rows.keys())))

    def _deliver(self, written):
        """Hand each choice its new text (`Written`, from the worker's TextRows); close the jobs that have ended."""
        streamed = {}  # job -> its choices' new pieces
        ended = []
        for choice, row in written.items():
            job = choice.job
            logprobs = None if job.completion.logprobs is None else choice.logprobs(self.model.tokenizer, row.drawn)
            job.texts[choice.index] += row.text
            if logprobs is not None:
                job.logprobs[choice.index].extend(logprobs)
            if job.completion.stream and (row.text or row.finish_reason):
                streamed.setdefault(job, []).append((choice.index, row.text, row.finish_reason, logprobs))
            if row.finish_reason:
                ended.append((choice, row))
        for job, pieces in streamed.items():
            job.emit(("pieces", pieces))
        for choice, row in ended:
            self._finish_choice(choice, row)

    def _finish_choice(self, choice, row):
        job = choice.job
        job.reasons[choice.index], job.completion_tokens[choice.index] = row.finish_reason, row.tokens
        job.live -= 1
        if job.live == 0:
            if not job.completion.stream:
                job.emit(("pieces", [(index, text, reason, logprobs) for index, (text, reason, logprobs) in
                                     enumerate(zip(job.texts, job.reasons, job.logprobs))]))
            job.emit(("done", job.prompt_tokens, job.completion_tokens))

    def _fail_all(self, message):
        choices = self.rows.keys()
        for choice in choices:
            self.rows.cancel(choice)
        for job in {id(choice.job): choice.job for choice in choices}.values():
            job.emit(("failure", message))


def _prompt_logprobs(model, ids, top):
    """OpenAI's `logprobs` of an echoed prompt's token `ids` (as `prompt_ids` gives them), from one forward pass
    over its last block_size tokens (a token before them, or the first, has no log-probability: null)."""
    import numpy as np
    from keras import ops

    tokenizer = model.tokenizer
    start = len(tokenizer.text_start_ids)
    window = ids[-model.config.block_size:]
    logits = ops.convert_to_numpy(ops.cast(model(np.array([window], np.int32)), "float32"))[0]  # (T, V)
    log_probabilities = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    first = len(ids) - len(window)  # the index in ids of window[0]
    result, offset = _Logprobs(), 0
    for index in range(start, len(ids)):
        token = tokenizer.decode([ids[index]])
        before = index - first - 1  # the window position whose logits predict this token
        if before < 0:
            result.add(token, None, None, offset)
        else:
            ranked = np.argsort(-log_probabilities[before])[:top]
            result.add(token, float(log_probabilities[before, ids[index]]),
                       {tokenizer.decode([int(i)]): float(log_probabilities[before, i]) for i in ranked}, offset)
        offset += len(token)
    return result


def _padded(rows):
    """The batch size that `rows` rows are decoded in: the next power of two."""
    return 1 << (rows - 1).bit_length()
