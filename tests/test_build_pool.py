"""The data plane's build pool (server/serving/build_pool.py): results and errors reach the caller,
a build no thread started can be cancelled and never runs, one already started cannot, threads stay
within the limit, shutdown cancels what waits. Synchronised with events, never with sleeps."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import CancelledError

import pytest

from shardstream.server.serving.build_pool import BuildPool
from shardstream.threads import name_native

WAIT_S = 30  # a bound for a wait that should end at once: a failure, not a timing


@pytest.fixture
def pool():
    p = BuildPool(2, "test-build")
    yield p
    p.shutdown()


def _blocker(started: threading.Event, go: threading.Event, value: object = None):
    def run():
        started.set()
        assert go.wait(WAIT_S)
        return value

    return run


def test_results_and_arguments_come_back(pool):
    assert [pool.submit(pow, 2, k).result() for k in range(10)] == [2**k for k in range(10)]


def test_a_result_can_be_read_twice(pool):
    p = pool.submit(lambda: [1, 2])
    assert p.result() == [1, 2]
    assert p.result() == [1, 2]


def test_an_error_is_raised_to_whoever_waits(pool):
    def fail():
        raise KeyError("row group 7")

    p = pool.submit(fail)
    with pytest.raises(KeyError, match="row group 7"):
        p.result()
    assert pool.submit(lambda: "after").result() == "after"  # the thread survived it


def test_a_build_not_started_is_cancelled_and_never_runs():
    pool = BuildPool(1, "test-build")
    try:
        started, go = threading.Event(), threading.Event()
        busy = pool.submit(_blocker(started, go, "first"))
        assert started.wait(WAIT_S)
        ran = []
        queued = pool.submit(ran.append, 1)
        assert queued.cancel()
        assert not queued.cancel()  # once
        with pytest.raises(CancelledError):
            queued.result()
        go.set()
        assert busy.result() == "first"
        assert pool.submit(lambda: "next").result() == "next"  # ran after the cancelled one's turn
        assert ran == []
    finally:
        pool.shutdown()


def test_a_started_build_cannot_be_cancelled(pool):
    started, go = threading.Event(), threading.Event()
    p = pool.submit(_blocker(started, go, 42))
    assert started.wait(WAIT_S)
    assert not p.cancel()
    go.set()
    assert p.result() == 42


def test_builds_run_in_the_order_they_came_on_one_thread():
    pool = BuildPool(1, "test-build")
    try:
        order: list[int] = []
        pending = [pool.submit(order.append, k) for k in range(50)]
        for p in pending:
            p.result()
        assert order == list(range(50))
        assert pool.threads == 1
    finally:
        pool.shutdown()


def test_threads_start_as_needed_up_to_the_limit():
    pool = BuildPool(3, "test-build")
    try:
        for _ in range(20):  # one at a time: the thread that ran the last is idle for the next
            pool.submit(int).result()
        assert pool.threads == 1
        go = threading.Event()
        starts = [threading.Event() for _ in range(5)]
        pending = [pool.submit(_blocker(s, go, k)) for k, s in enumerate(starts)]
        for s in starts[:3]:
            assert s.wait(WAIT_S)  # three run at once
        assert pool.threads == 3
        assert not starts[3].is_set() and not starts[4].is_set()  # the rest wait for a thread
        go.set()
        assert [p.result() for p in pending] == [0, 1, 2, 3, 4]
        assert pool.threads == 3
    finally:
        pool.shutdown()


def test_shutdown_cancels_what_waits_and_refuses_more():
    pool = BuildPool(1, "test-shutdown")
    started, go = threading.Event(), threading.Event()
    busy = pool.submit(_blocker(started, go, "busy"))
    assert started.wait(WAIT_S)
    (worker,) = [t for t in threading.enumerate() if t.name == "test-shutdown_0"]
    queued = [pool.submit(int) for _ in range(3)]
    pool.shutdown()
    pool.shutdown()  # twice: nothing more
    for p in queued:
        with pytest.raises(CancelledError):
            p.result()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(int)
    go.set()
    assert busy.result() == "busy"  # the build in progress ends as it would have
    worker.join(WAIT_S)
    assert not worker.is_alive()


def test_shutdown_with_a_wait_returns_once_the_threads_have_ended():
    """A stopping server waits for its build threads (daemons: one still in C++ when the
    interpreter finalizes can abort it): shutdown(wait_s) returns only after the build in progress
    ends and its thread with it."""
    pool = BuildPool(2, "test-join")
    started, go = threading.Event(), threading.Event()
    busy = pool.submit(_blocker(started, go, "busy"))
    assert started.wait(WAIT_S)
    threads = [t for t in threading.enumerate() if t.name.startswith("test-join_")]
    seen: list[bool] = []

    def stop() -> None:
        pool.shutdown(wait_s=WAIT_S)
        seen.append(any(t.is_alive() for t in threads))

    stopping = threading.Thread(target=stop)
    stopping.start()
    deadline = time.monotonic() + WAIT_S
    while not pool._closed and time.monotonic() < deadline:  # shutdown has begun (its first step)
        time.sleep(0.001)
    go.set()
    stopping.join(WAIT_S)
    assert not stopping.is_alive()
    assert seen == [False]  # no build thread outlived shutdown
    assert busy.result() == "busy"


def test_many_callers_at_once_each_get_their_own_result(pool):
    results: dict[int, list[int]] = {}

    def caller(k: int) -> None:
        results[k] = [pool.submit(lambda a, b: a * b, k, j).result() for j in range(200)]

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert results == {k: [k * j for j in range(200)] for k in range(8)}
    assert pool.threads <= 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names in /proc are Linux's")
def test_a_build_thread_has_its_name_where_the_system_shows_it(pool):
    """`top -H` and /proc show a build thread by its name ("test-build_0"), not by the name of the
    thread that started it (gRPC's, in a server); names longer than Linux keeps are cut to 15 bytes."""

    def comm() -> str:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            return f.read().strip()

    assert pool.submit(comm).result() == "test-build_0"
    out: list[object] = []
    t = threading.Thread(target=lambda: out.extend([name_native(), comm()]), name="a-name-longer-than-fifteen")
    t.start()
    t.join(WAIT_S)
    assert out == [True, "a-name-longer-t"]
