"""Work on a thread of its own while training goes on: `Jobs` (functions run one at a time, in the order given)
and `FileWriter` (a run's files, written and synced on such a thread).

    jobs = Jobs("gptlite-evaluation")
    done = jobs.submit(function)        # a threading.Event, set once it has run
    jobs.wait()                         # every job so far has run; a failed one's error is raised here
    jobs.close()

A job that raises stops the queue: the jobs after it are skipped, and its
error is raised in the caller's thread at the next `submit`, `wait` or
`close`. With `background=False` each job runs at once, in the caller's
thread (for work that must stay there, such as a TensorFlow strategy's
scope, which a thread does not inherit).

The thread is not a daemon: a process that ends while a job runs lets it
finish; once the main thread has ended, the queue is emptied and the thread
ends, so a process that never closed it still exits.

A `FileWriter` writes files on a thread of its own, so that training goes on while the disk writes and syncs them:

    writer = FileWriter()
    writer.write(out / "checkpoint.npz", write_checkpoint, on_written=on_disk.set)   # returns at once
    writer.write(out / "history.csv", write_history, sync=False)
    writer.write(out / "model.keras", save_model, sync="at close")   # renamed whole now, synced at the end
    ...
    writer.close()            # waits for every write; a failed write raises here at the latest

What a write needs must be copied before it is handed over (the caller's
snapshot): the thread runs `produce(temporary)` later, while the caller goes
on. Each file is written whole or not at all, as `files.atomic_path` writes
it: a temporary file beside it, synced (unless `sync=False`), then renamed
over the old one. With `sync="at close"` it is renamed unsynced, and its
last version is synced once, when the writer closes: for a file rewritten
often whose every version need not cost the disk a sync (a run's best
model, whose run is resumed from its synced checkpoint). Writes run one at
a time, in the order given (`Jobs`); a write not yet started is
dropped when a newer one of the same file comes, since only the newest
matters. `on_written()` is called once a write is over: written, dropped or
failed.

A write that fails (a full disk) makes the next `write`, `wait` or `close`
raise a `WriteError` naming the file, and the writes after it are not made;
the files written before it stay as they were. `waited_s` adds up the time
callers spent in `wait` and `close`.
"""

import dataclasses
import queue
import threading
import time

from gptlite.errors import GPTLiteError
from gptlite.files import atomic_path, sync_file


class Jobs:
    """A queue of functions run one at a time on a thread of their own (see the module's docstring)."""

    def __init__(self, name, background=True):
        self.background = background
        self._queue = queue.Queue()
        self._error = None
        self._closed = False
        self._last = None  # the Event of the last job submitted
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._run, name=name)
            self._thread.start()

    def submit(self, function):
        """Run `function()` after the jobs before it; an Event that is set once it has run (or been skipped)."""
        self.raise_failure()
        if self._closed:
            raise RuntimeError("these jobs are closed")
        done = threading.Event()
        self._last = done
        if self.background:
            self._queue.put((function, done))
        else:
            self._call(function, done)
            self.raise_failure()
        return done

    def wait(self):
        """Wait until every job submitted so far has run; raise a failed one's error."""
        if self._last is not None:
            self._last.wait()
        self.raise_failure()

    def close(self):
        """Wait for every job, end the thread, and raise a failed job's error."""
        if not self._closed:
            self._closed = True
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
        self.raise_failure()

    def raise_failure(self):
        if self._error is not None:
            raise self._error

    def _call(self, function, done):
        try:
            if self._error is None:  # after a failure the run is stopping: later jobs are skipped
                function()
        except Exception as error:
            self._error = error
        finally:
            done.set()

    def _run(self):
        while True:
            try:
                job = self._queue.get(timeout=0.5)
            except queue.Empty:
                if not threading.main_thread().is_alive():
                    return
                continue
            if job is None:
                return
            self._call(*job)


class WriteError(GPTLiteError, OSError):
    """A file could not be written (a full disk, a folder gone); the files written before are whole."""


@dataclasses.dataclass(eq=False)
class _Write:
    started: bool = False
    dropped: bool = False


class FileWriter:
    """A thread that writes files whole, one at a time (see the module's docstring)."""

    def __init__(self):
        self.waited_s = 0.0
        self.written = 0  # files written so far
        self._jobs = Jobs("gptlite-file-writer")
        self._last = {}  # path -> its last _Write
        self._synced_at_close = set()  # the paths written with sync="at close"
        self._lock = threading.Lock()

    def write(self, path, produce, sync=True, on_written=None):
        """Write `path` by `produce(temporary)` on the writer's thread; returns without waiting for it.
        `sync`: True, False or "at close" (see the module's docstring)."""
        if sync not in (True, False, "at close"):
            raise ValueError(f'sync is True, False or "at close", not {sync!r}')
        if sync == "at close":
            self._synced_at_close.add(path)
        write = _Write()
        with self._lock:
            last = self._last.get(path)
            if last is not None and not last.started:
                last.dropped = True
            self._last[path] = write

        def run():
            try:
                with self._lock:
                    write.started = not write.dropped
                if write.started:
                    with atomic_path(path, sync=sync is True) as temporary:
                        produce(temporary)
                    self.written += 1
            except OSError as error:
                raise WriteError(f"cannot write {path}: {error.strerror or error}") from None
            finally:
                if on_written is not None:
                    on_written()

        self._jobs.submit(run)

    def raise_failure(self):
        """Raise the WriteError of a write that failed, if one has."""
        self._jobs.raise_failure()

    def wait(self):
        """Wait until every write handed over is on disk; raise a failed one's WriteError."""
        started = time.perf_counter()
        try:
            self._jobs.wait()
        finally:
            self.waited_s += time.perf_counter() - started

    def close(self):
        """Sync the files written with sync="at close", wait for every write, then end the thread; raise a
        failed write's WriteError."""
        started = time.perf_counter()
        try:
            synced, self._synced_at_close = self._synced_at_close, set()
            try:
                for path in sorted(synced):
                    self._jobs.submit(lambda path=path: _sync(path))
            finally:  # a write that failed before is raised by submit: the thread ends all the same
                self._jobs.close()
        finally:
            self.waited_s += time.perf_counter() - started

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        try:
            self.close()
        except WriteError:
            if kind is None:
                raise  # otherwise the caller's own error goes on; the writes in flight have finished


def _sync(path):
    """Sync a file written before (its last version); nothing where there is none."""
    try:
        sync_file(path)
    except FileNotFoundError:
        return
    except OSError as error:
        raise WriteError(f"cannot write {path}: {error.strerror or error}") from None
