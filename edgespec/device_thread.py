"""One long-lived thread for an engine's model calls (``edgespec serve``'s loading and generations).

onnxruntime's CUDA EP keeps per *calling thread* a context: cuBLAS and cuDNN handles, and the CUDA
graphs a session captured (its source: "cuda_graph_ is put under PerThreadContext"). A session run
from a thread it never ran on builds that context again and captures every graph again, and the
context stays with the session after the thread has ended. Measured on an H200 (session 75, run 15,
``scripts/gpu/bench.py --sections threads``, SmolLM2 INT4, 64 tokens with prompt lookup): 0.07 s a
generation on the thread that loaded the engine, 0.22-0.49 s on a fresh thread each, and +77 MiB of
GPU memory for every such thread, never given back while the engine lived. ``edgespec serve`` used to start a
thread per generation; it now loads the engine and runs every generation on one ``DeviceThread``.
On the CPU EP the thread changes nothing but where the calls run.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future


class DeviceThread:
    """A daemon thread that runs the jobs given to it one after the other, in order. ``submit(fn, ...)``
    returns a ``concurrent.futures.Future``; ``call(fn, ...)`` waits for the result (run at once where
    the caller is this thread). A daemon, as the server's worker threads were: a generation that does
    not stop at shutdown does not hold the process."""

    def __init__(self, name: str = "edgespec-device"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args, kw = job
            if not fut.set_running_or_notify_cancel():
                continue
            result = None
            try:
                result = fn(*args, **kw)
            except BaseException as e:  # noqa: BLE001 - the caller's, through its future
                fut.set_exception(e)
            else:
                fut.set_result(result)
            # (nothing of a finished job kept alive while the thread waits: its result neither, which it was
            # until session 77, a generation's until the next request)
            del job, fut, fn, args, kw, result

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, fn, *args, **kw) -> Future:
        """Run ``fn(*args, **kw)`` on the thread after the jobs before it; RuntimeError once closed."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the device thread is closed")
            fut: Future = Future()
            self._jobs.put((fut, fn, args, kw))
        return fut

    def call(self, fn, *args, **kw):
        """``fn(*args, **kw)`` on the thread, its result or its exception here."""
        if threading.current_thread() is self.thread:
            return fn(*args, **kw)
        return self.submit(fn, *args, **kw).result()

    def close(self, timeout: float | None = None) -> bool:
        """No more jobs; the thread ends after those already given. Waits up to ``timeout`` seconds
        (None: until it ends; 0: not at all); False if it is still running."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._jobs.put(None)
        if threading.current_thread() is not self.thread and timeout != 0:
            self.thread.join(timeout)
        return not self.thread.is_alive()
