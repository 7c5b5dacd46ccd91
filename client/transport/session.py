"""One Read stream with its retries, backoff, failover and idle watchdog — the only such loop.

A `StreamSession` reads the steps first_step, first_step + stride, ... of one epoch. When the stream
breaks, ends before the steps it owes, or its server is unavailable, overloaded or draining, the
session reopens it — on the next endpoint — at the first step not yet received, after a jittered
exponential backoff, within a retry budget (`RetryPolicy`: a number of failures in a row and a time)
that any progress resets. DATA_LOSS and INTERNAL are tried once more on the next endpoint (that
server's copy may be the bad one), once per session (a stream's epoch); any other error, or a second
one of those, is the caller's.
Both the single stream of a rank (prefetch.py) and each of its striped streams (striped.py) are one.
A step the server sends in parts (larger than its message cap) is handed on whole, once its last
part is in (parts.py); the next step moves with whole steps only, so a stream that breaks mid-step
resumes at that step. An overloaded server's retry hint (RESOURCE_EXHAUSTED with
`grpc-retry-pushback-ms`, the error's `retry_after_s`) lengthens the backoff before this session tries
it again. The calls are `flight_call.ReadCall`s: what fails raises a `ShardstreamError`, whose exact
status code (`.status`) decides what is retried (errors.RETRYABLE_CODES, RETRY_ONCE_CODES).

`CallRegistry` holds the calls of one prefetch thread: `stop()` cancels them all, and the consumer's
`check_idle()` cancels the one the thread has waited on for longer than the idle timeout (a hung
server that still answers keepalive pings), which the session then treats as a broken stream.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from shardstream.errors import RETRY_ONCE_CODES, RETRYABLE_CODES, ShardstreamError, UnavailableError
from shardstream.v1 import shardstream_pb2 as pb

from .. import metrics
from ..parts import StepParts
from ..spec import RetryPolicy
from .flight_call import Message, ReadCall, ReadOpener
from .retry import Attempts

__all__ = ["CallRegistry", "Message", "StreamSession"]

log = logging.getLogger("shardstream.client")


class CallRegistry:
    """The Read calls in progress of one prefetch thread; cancels them on stop or when one idles."""

    def __init__(self, open_call: ReadOpener) -> None:
        self._open_call = open_call
        self._lock = threading.Lock()
        self._calls: set[ReadCall] = set()
        self._waiting: tuple[ReadCall, float] | None = None  # (call, since when the thread waits on it)
        self.stopped = threading.Event()

    def open(self, endpoint: str, request: pb.ReadRequest) -> ReadCall:
        call = self._open_call(endpoint, request)
        with self._lock:
            self._calls.add(call)
        if self.stopped.is_set():
            call.cancel()
        return call

    def close(self, call: ReadCall) -> None:
        call.cancel()
        with self._lock:
            self._calls.discard(call)

    def waiting(self, call: ReadCall | None) -> None:
        """Mark the thread as blocked on `call` from now, or (None) as no longer blocked (see check_idle).
        Two calls around the wait, not a context manager: it is called for every message."""
        self._waiting = None if call is None else (call, time.monotonic())

    def check_idle(self, timeout_s: float) -> None:
        """Cancel the call the thread has waited on for more than timeout_s (called by the consumer)."""
        waiting = self._waiting
        if waiting is not None and time.monotonic() - waiting[1] > timeout_s:
            self._waiting = None
            log.warning("no data from the server for %.0f s: switching endpoints", timeout_s)
            waiting[0].cancel()

    def stop(self) -> None:
        self.stopped.set()
        with self._lock:
            for call in self._calls:
                call.cancel()


class StreamSession:
    """One epoch's Read stream of steps first_step, first_step + stride, ..., resumed where it broke."""

    def __init__(
        self,
        calls: CallRegistry,
        request_at: Callable[[int], pb.ReadRequest],
        *,
        endpoints: tuple[str, ...],
        endpoint: int,
        first_step: int,
        step_stride: int,
        retry: RetryPolicy,
        what: str,
        rank_metrics: metrics.RankMetrics | None = None,
    ) -> None:
        self._calls = calls
        self._metrics = rank_metrics or metrics.for_rank(None, 0)
        self._request_at = request_at  # the Read that starts at a given step
        self.endpoints = endpoints
        self.endpoint = endpoint  # index of the endpoint in use
        self._first_step = first_step
        self.next_step = first_step  # the first of its steps not yet received
        self.step_stride = step_stride
        self._retry = retry
        self._attempts = Attempts(retry)  # failures in a row, without progress, and since when
        self._what = what  # for errors: "web@3 epoch 2", "... (stream 1 of 4)"
        self._call: ReadCall | None = None
        self._it: Iterator[Message] | None = None
        # A DATA_LOSS/INTERNAL was retried elsewhere in this session. Not reset by progress: a resumed
        # stream delivers the steps before the bad one, and a reset would retry once per step.
        self._retried_once = False
        self._parts = StepParts()  # of a step sent in parts, until its last one
        self._pushback: dict[int, float] = {}  # endpoint -> when it said it may be tried again

    @property
    def first_step(self) -> int:
        """The first of its steps."""
        return self._first_step

    def open(self) -> None:
        """Open the stream now, to be read later: its server plans it and builds its first message
        meanwhile (a successor opened before the stream it follows ends: prefetch.py). A failure to
        open is met when it is read, with the session's retries."""
        if self._call is not None or self._calls.stopped.is_set():
            return
        try:
            self._call = self._calls.open(self.endpoints[self.endpoint], self._request_at(self.next_step))
        except ShardstreamError:
            return  # next_message opens it again (discovery failed: retried there)
        self._it = iter(self._call)

    def moved(self) -> None:
        """Its server asked the stream to move (ReadHeader.move_at): the next stream opened on its
        endpoint asks where to read first (GetDataset names the least busy worker)."""
        if self._call is not None:
            self._call.moved()

    def next_message(self) -> Message | None:
        """The stream's next message (None once stopped); reopens the stream as needed."""
        while not self._calls.stopped.is_set():
            endpoint = self.endpoints[self.endpoint]
            error: ShardstreamError | None = None
            try:
                if self._call is None:
                    self._call = self._calls.open(endpoint, self._request_at(self.next_step))
                    self._it = iter(self._call)
                assert self._it is not None
                self._calls.waiting(self._call)
                try:
                    header, rows = next(self._it)
                finally:
                    self._calls.waiting(None)
            except StopIteration:
                pass  # the stream ended before the steps it owes
            except ShardstreamError as exc:  # the read call's (or its discovery's): flight_call.ReadCall
                if self._calls.stopped.is_set():
                    return None
                code = exc.status
                if code in RETRY_ONCE_CODES and not self._retried_once:
                    self._retried_once = True
                    log.warning("%s from %s: trying another endpoint once", code.name, endpoint)
                elif code not in RETRYABLE_CODES:
                    raise
                error = exc
                if exc.retry_after_s is not None:
                    self._pushback[self.endpoint] = time.monotonic() + exc.retry_after_s
            else:
                whole = self._parts.add(header, rows)
                if whole is None:
                    continue  # more parts of this step follow
                header, rows = whole
                if header.steps:
                    self.next_step += len(header.steps) * self.step_stride
                    self._attempts.progress()  # progress resets the retry budget
                return header, rows
            if not self.retry(error):
                return None
        return None

    def retry(self, error: BaseException | None) -> bool:
        """Give up on the current call and back off before the next endpoint; False when stopped.

        Raises UnavailableError once the retry budget (failures in a row and time) is spent."""
        stream_id = self._stream_id()  # before close() cancels the call
        self.close()
        attempts = self._attempts
        more = attempts.failed()
        self._metrics.retries.inc()
        if not more:
            failing_s = attempts.failing_s
            raise UnavailableError(
                f"gave up on {self._what} at step {self.next_step} after {self.failures - 1} retries in "
                f"{failing_s:.1f} s over {', '.join(self.endpoints)} (last error: {error or 'stream ended early'})"
            )
        if len(self.endpoints) > 1:
            self._metrics.failovers.inc()
        left = self.endpoints[self.endpoint]
        self.endpoint = (self.endpoint + 1) % len(self.endpoints)
        wait = attempts.backoff_s()
        # An endpoint that asked to be left alone (a busy server's hint) is not tried before then.
        until = self._pushback.pop(self.endpoint, 0.0)
        wait = max(wait, min(until - time.monotonic(), self._retry.backoff_max_s))
        # The server's stream id: its stream.end line says how that stream ended.
        log.log(
            logging.WARNING if self.endpoints[self.endpoint] != left else logging.INFO,
            "%s: stream %s on %s ended at step %d (%s); %s %s in %.2f s (retry %d)",
            self._what,
            stream_id,
            left,
            self.next_step,
            error or "stream ended early",
            "failing over to" if self.endpoints[self.endpoint] != left else "retrying",
            self.endpoints[self.endpoint],
            wait,
            self.failures,
        )
        return not self._calls.stopped.wait(wait)

    @property
    def failures(self) -> int:
        """Failures in a row, without progress."""
        return self._attempts.failures

    def _stream_id(self) -> str:
        """The server's id of the current stream, '-' if it sent none yet."""
        return (self._call.stream_id if self._call is not None else "") or "-"

    def close(self) -> None:
        if self._call is not None:
            self._calls.close(self._call)
        self._call = self._it = None
        self._parts.reset()
