"""Files written on a thread of their own, so that training goes on while the disk writes and syncs them.

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
a time, in the order given (`background.Jobs`); a write not yet started is
dropped when a newer one of the same file comes, since only the newest
matters. `on_written()` is called once a write is over: written, dropped or
failed.

A write that fails (a full disk) makes the next `write`, `wait` or `close`
raise a `WriteError` naming the file, and the writes after it are not made;
the files written before it stay as they were. `waited_s` adds up the time
callers spent in `wait` and `close`.
"""

import dataclasses
import threading
import time

from gptlite.errors import GPTLiteError
from gptlite.files import atomic_path, sync_file
from gptlite.training.background import Jobs


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
