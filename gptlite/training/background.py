"""Work done on a thread of its own while the caller goes on: functions run one at a time, in the order given.

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
"""

import queue
import threading


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
