"""The stream session's retry loop alone (client/transport/session.py), over scripted calls.

The calls here are stand-ins for Read calls (client/transport/flight_call.py's ReadCall) — iterators of (header,
payload) that end, or raise the project's error for a status code, where the script says — so every branch of the retry loop (resume at
the first missing step, next endpoint, budget reset by progress, non-retryable codes, stop, idle
watchdog) is exercised deterministically. The same loop against real servers, killed and restarted,
is tested end to end in test_loader_e2e.py, test_striped.py and test_server.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

import grpc
import pytest

from shardstream.client.spec import RetryPolicy
from shardstream.client.transport.session import CallRegistry, StreamSession
from shardstream.errors import (
    DataLossError,
    InternalError,
    NotFoundError,
    ShardstreamError,
    UnavailableError,
    status_error,
)
from shardstream.v1 import shardstream_pb2 as pb

NO_WAIT = RetryPolicy(max_retries=3, backoff_base_s=0.0, budget_s=0.0)


def ScriptedError(code: grpc.StatusCode) -> ShardstreamError:  # noqa: N802 — reads as the class it was
    return status_error(code, f"scripted {code.name}")


class ScriptedCall:
    """Yields a header per step in `steps` (one step per message), then ends or raises `then`."""

    def __init__(
        self, steps: list[int], then: grpc.StatusCode | None = None, block: threading.Event | None = None
    ):
        self.steps, self.then, self.block = steps, then, block
        self.cancelled = threading.Event()
        self.stream_id = ""

    def __iter__(self) -> Iterator[tuple[pb.ReadHeader, None]]:
        for s in self.steps:
            yield pb.ReadHeader(steps=[pb.StepInfo(step=s, rows=1)]), None
        if self.block is not None:  # a server that keeps the connection but sends nothing
            self.cancelled.wait(30)
            raise ScriptedError(grpc.StatusCode.CANCELLED)
        if self.then is not None:
            raise ScriptedError(self.then)

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


def session(script: Iterable[ScriptedCall], *, retry: RetryPolicy = NO_WAIT, stride: int = 1):
    opened: list[tuple[str, int]] = []
    calls_left = iter(script)

    def open_call(endpoint: str, request: pb.ReadRequest) -> ScriptedCall:
        opened.append((endpoint, request.first_step))
        return next(calls_left)

    calls = CallRegistry(open_call)
    s = StreamSession(
        calls,
        lambda step: pb.ReadRequest(first_step=step, step_stride=stride),
        endpoints=("a:1", "b:2", "c:3"),
        endpoint=1,
        first_step=0,
        step_stride=stride,
        retry=retry,
        what="toy@1 epoch 0",
    )
    return s, calls, opened


def steps_read(s: StreamSession, n: int) -> list[int]:
    out = []
    for _ in range(n):
        msg = s.next_message()
        assert msg is not None
        out.extend(st.step for st in msg[0].steps)
    return out


def test_a_broken_stream_resumes_on_the_next_endpoint_at_the_first_missing_step() -> None:
    s, _, opened = session(
        [
            ScriptedCall([0, 2], then=grpc.StatusCode.UNAVAILABLE),
            ScriptedCall([4], then=None),  # ends before the steps it owes: broken too
            ScriptedCall([6, 8]),
        ],
        stride=2,
    )
    assert steps_read(s, 5) == [0, 2, 4, 6, 8]
    assert opened == [("b:2", 0), ("c:3", 4), ("a:1", 6)]
    assert s.next_step == 10 and s.failures == 0  # progress reset the budget


def test_the_budget_counts_failures_in_a_row_and_names_where_it_gave_up() -> None:
    s, _, opened = session(
        [ScriptedCall([0]), *(ScriptedCall([], then=grpc.StatusCode.UNAVAILABLE) for _ in range(4))]
    )
    assert steps_read(s, 1) == [0]
    with pytest.raises(
        UnavailableError,
        match=r"gave up on toy@1 epoch 0 at step 1 after 3 retries in [0-9.]+ s over a:1, b:2, c:3",
    ):
        s.next_message()
    assert len(opened) == 4  # the first call (which ended early: failure 1), then 3 retries


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN]
)
def test_overload_drain_and_cut_connections_are_retried(code: grpc.StatusCode) -> None:
    s, _, opened = session([ScriptedCall([0], then=code), ScriptedCall([1])])
    assert steps_read(s, 2) == [0, 1] and [o[1] for o in opened] == [0, 1]


def test_a_non_retryable_code_is_raised_at_once_as_its_error() -> None:
    s, _, opened = session([ScriptedCall([], then=grpc.StatusCode.NOT_FOUND), ScriptedCall([0])])
    with pytest.raises(NotFoundError, match="scripted NOT_FOUND"):
        s.next_message()
    assert len(opened) == 1


def test_stop_ends_a_session_waiting_out_its_backoff() -> None:
    slow = RetryPolicy(max_retries=3, backoff_base_s=30.0, backoff_max_s=30.0)
    s, calls, _ = session([ScriptedCall([], then=grpc.StatusCode.UNAVAILABLE)] * 4, retry=slow)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(s.next_message()))
    t.start()
    deadline = time.monotonic() + 10
    while s.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # wait until the session is backing off
    calls.stop()
    t.join(10)
    assert not t.is_alive() and result == [None]


def test_the_idle_watchdog_cancels_a_silent_stream_which_is_then_resumed() -> None:
    silent = ScriptedCall([0], block=threading.Event())
    s, calls, opened = session([silent, ScriptedCall([1])])
    assert steps_read(s, 1) == [0]
    got: list[object] = []
    t = threading.Thread(target=lambda: got.extend(steps_read(s, 1)))
    t.start()
    deadline = time.monotonic() + 10
    while not silent.cancelled.is_set() and time.monotonic() < deadline:
        calls.check_idle(0.05)  # what the consumer's get() does while it waits
        time.sleep(0.01)
    t.join(10)
    assert silent.cancelled.is_set() and got == [1]
    assert opened == [("b:2", 0), ("c:3", 1)]


def test_the_budget_also_lasts_its_time_so_a_restarting_server_is_waited_for() -> None:
    # max_retries=1 alone would give up at the second failure; the time budget keeps the stream trying
    policy = RetryPolicy(max_retries=1, backoff_base_s=0.001, backoff_max_s=0.005, budget_s=0.3)
    down = (ScriptedCall([], then=grpc.StatusCode.UNAVAILABLE) for _ in range(1_000_000))
    s, _, opened = session(down, retry=policy)
    t0 = time.monotonic()
    with pytest.raises(UnavailableError, match="gave up"):
        s.next_message()
    assert time.monotonic() - t0 >= 0.3  # reported no earlier than the budget
    assert len(opened) > 2


@pytest.mark.parametrize(
    ("code", "error"), [(grpc.StatusCode.DATA_LOSS, DataLossError), (grpc.StatusCode.INTERNAL, InternalError)]
)
def test_data_loss_and_internal_are_tried_once_more_on_the_next_endpoint(
    code: grpc.StatusCode, error: type
) -> None:
    s, _, opened = session(
        [
            ScriptedCall([0], then=code),  # retried once, elsewhere
            ScriptedCall([1], then=code),  # progress does not buy another: the caller's
            ScriptedCall([2]),
        ]
    )
    assert steps_read(s, 2) == [0, 1]
    with pytest.raises(error, match=f"scripted {code.name}"):
        s.next_message()
    assert opened == [("b:2", 0), ("c:3", 1)]
