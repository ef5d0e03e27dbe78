"""Files written on a thread of their own, so that training goes on while the disk writes and syncs them.

    writer = FileWriter()
    writer.write(out / "checkpoint.npz", write_checkpoint, after_the_last=True)   # returns at once
    writer.write(out / "history.csv", write_history, sync=False)
    ...
    writer.close()            # waits for every write; a failed write raises here at the latest

What a write needs must be copied before it is handed over (the caller's
snapshot): the thread runs `produce(temporary)` later, while the caller goes
on. Each file is written whole or not at all, as `files.atomic_path` writes
it: a temporary file beside it, synced (unless `sync=False`), then renamed
over the old one. Writes run one at a time, in the order given; a write not
yet started is dropped when a newer one of the same file comes (only the
newest matters).

With `after_the_last`, a write first waits for the last write of its file to
be on disk (a checkpoint starts only once the one before it is whole); the
first time that wait is needed, `on_slow_disk()` is called, to say so once.
`waited_s` adds up the time callers spent waiting. A write that fails (a
full disk) makes the next `write`, `wait` or `close` raise a `WriteError`
naming the file, and the writes after it are not made; the files written
before it stay as they were.
"""

import dataclasses
import queue
import threading
import time

from gptlite.errors import GPTLiteError
from gptlite.files import atomic_path


class WriteError(GPTLiteError, OSError):
    """A file could not be written (a full disk, a folder gone); the files written before are whole."""


@dataclasses.dataclass(eq=False)
class _Write:
    path: object
    produce: object
    sync: bool
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    started: bool = False
    dropped: bool = False


class FileWriter:
    """A thread that writes files whole, one at a time (see the module's docstring)."""

    def __init__(self, on_slow_disk=None):
        self.on_slow_disk = on_slow_disk
        self.waited_s = 0.0
        self.written = 0  # files written so far
        self._queue = queue.Queue()
        self._last = {}  # path -> its last _Write
        self._lock = threading.Lock()
        self._error = None
        self._told = False
        self._closed = False
        # Not a daemon: a process that ends while a write is in flight finishes it first (see _run).
        self._thread = threading.Thread(target=self._run, name="gptlite-file-writer")
        self._thread.start()

    def write(self, path, produce, sync=True, after_the_last=False):
        """Write `path` by `produce(temporary)` on the writer's thread; returns without waiting for it (see the
        module's docstring for `sync` and `after_the_last`)."""
        self._raise_failure()
        if self._closed:
            raise RuntimeError("this FileWriter is closed")
        if after_the_last:
            last = self._last.get(path)
            if last is not None and not last.done.is_set():
                if not self._told and self.on_slow_disk is not None:
                    self._told = True
                    self.on_slow_disk()
                self._wait_for([last])
                self._raise_failure()
        job = _Write(path, produce, sync)
        with self._lock:
            last = self._last.get(path)
            if last is not None and not last.started:
                last.dropped = True
            self._last[path] = job
        self._queue.put(job)

    def wait(self):
        """Wait until every write handed over is on disk; raise a failed one's WriteError."""
        self._wait_for(list(self._last.values()))
        self._raise_failure()

    def close(self):
        """Wait for every write, then end the thread; raise a failed write's WriteError."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            started = time.perf_counter()
            self._thread.join()
            self.waited_s += time.perf_counter() - started
        self._raise_failure()

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        try:
            self.close()
        except WriteError:
            if kind is None:
                raise  # otherwise the caller's own error goes on; the writes in flight have finished

    def _wait_for(self, writes):
        started = time.perf_counter()
        for job in writes:
            job.done.wait()
        self.waited_s += time.perf_counter() - started

    def _raise_failure(self):
        if self._error is not None:
            raise self._error

    def _run(self):
        while True:
            try:
                job = self._queue.get(timeout=0.5)
            except queue.Empty:
                # The main thread ended without closing the writer (an abort): everything queued is written,
                # so end too, and let the process exit.
                if not threading.main_thread().is_alive():
                    return
                continue
            if job is None:
                return
            with self._lock:
                job.started = not job.dropped
            try:
                if job.started and self._error is None:
                    with atomic_path(job.path, sync=job.sync) as temporary:
                        job.produce(temporary)
                    self.written += 1
            except OSError as error:
                self._error = WriteError(f"cannot write {job.path}: {error.strerror or error}")
            except Exception as error:  # a bug in `produce`: raised in the caller's thread, traceback kept
                self._error = error
            finally:
                job.done.set()
