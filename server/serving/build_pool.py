"""The data plane's build threads: a fixed-size pool that runs message builds first come, first served.

What `concurrent.futures.ThreadPoolExecutor` does for the data plane, at a third of its cost per
task: a Read stream hands every message's build to the pool and waits for it (data_plane.py
`_Messages`), so the hand-off is paid once a message. A Future is a Condition over an RLock with
its waiters' list, and the executor's submit takes a semaphore and a lock; a `Pending` here is one
Lock, released when its build ends. Measured in process, a no-op task submitted and waited for:
33-35 us of CPU against 10-11 (issue #26).

Threads start as tasks find none idle, up to `max_threads`, and stay for the pool's life.
`shutdown()` cancels the builds no thread has started and lets the threads end once their build does
(waiting for them up to a bound, when asked).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from queue import Empty, SimpleQueue
from typing import Any, Generic, TypeVar

from shardstream.threads import join_all, name_native

__all__ = ["BuildPool", "Pending"]

T = TypeVar("T")


class Pending(Generic[T]):
    """One build handed to the pool: its result once a thread has run it, or its error."""

    __slots__ = ("_args", "_claim", "_done", "_error", "_fn", "_value")

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        self._fn: Callable[..., T] | None = fn
        self._args = args
        self._done = threading.Lock()
        self._done.acquire()  # released once it ran or was cancelled
        self._claim = [True]  # popped (atomically) by whichever of run and cancel comes first
        self._value: T | None = None
        self._error: BaseException | None = None

    def _run(self) -> bool:
        """Run it unless it was cancelled: True when it ran (its waiters wait for `_finish`)."""
        try:
            self._claim.pop()
        except IndexError:
            return False  # cancelled before a thread took it
        fn, args, self._fn, self._args = self._fn, self._args, None, ()
        try:
            assert fn is not None
            self._value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 — handed to whoever waits for the result
            self._error = exc
        return True

    def _finish(self) -> None:
        self._done.release()

    def cancel(self) -> bool:
        """Cancel it if no thread has started it: True when it will never run."""
        try:
            self._claim.pop()
        except IndexError:
            return False
        self._fn, self._args = None, ()
        self._error = CancelledError()
        self._done.release()
        return True

    def result(self) -> T:
        """Its result, once it has run (the caller waits); its error raised, CancelledError if cancelled."""
        self._done.acquire()
        self._done.release()  # for any other caller
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class BuildPool:
    """At most `max_threads` threads that run submitted builds in the order they came."""

    def __init__(self, max_threads: int, name: str) -> None:
        if max_threads < 1:
            raise ValueError("a build pool needs a thread at least")
        self._max = max_threads
        self._name = name
        self._queue: SimpleQueue[Pending[Any] | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a task that no submit has counted on yet
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Pending[T]:
        """Run `fn(*args)` in a pool thread; RuntimeError once the pool is shut down."""
        pending: Pending[T] = Pending(fn, args)
        with self._lock:
            if self._closed:
                raise RuntimeError("the build pool is shut down")
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._max:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._queue.put(pending)
        return pending

    def _work(self) -> None:
        name_native()  # "flight-build_0" in top -H, not the gRPC thread's name it would inherit
        get, lock = self._queue.get, self._lock
        while True:
            task = get()
            if task is None:
                return
            ran = task._run()
            with lock:  # idle before its result is out: the caller's next build finds this thread
                self._idle += 1
            if ran:
                task._finish()
            del task

    @property
    def threads(self) -> int:
        """Threads started so far."""
        return len(self._threads)

    def shutdown(self, wait_s: float = 0.0) -> None:
        """Cancel the builds not started yet; each thread ends once its build does, and is waited for
        up to `wait_s` in all. The threads are daemons: one still inside Arrow's C++ (a gather with
        the GIL released) when the interpreter finalizes can abort the process, so a server that
        exits waits for them first (data_plane.py)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while True:
                try:
                    task = self._queue.get_nowait()
                except Empty:  # (a thread may take the last one meanwhile)
                    break
                if task is not None:
                    task.cancel()
            for _ in self._threads:
                self._queue.put(None)
            threads = list(self._threads)
        join_all(threads, wait_s)
