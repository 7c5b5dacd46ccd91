"""`Fleet`: a client's one session with its fleet — the layer every Loader read and checkpoint call rides.

It owns what a call to the fleet needs: the endpoints (rotated on failure), the security of every
channel, one `Connection` per endpoint (channel.py: its control channel, discovery, the grant and the
data plane's Flight client with the one FLIGHT_OPTIONS list), and the `RetryPolicy` (spec.py) every
call retries under, counted by `retry.Attempts` (jittered exponential backoff, a number of failures
in a row and a time budget):

    find_dataset   GetDataset of the endpoints in turn, from a rank's own        (a Loader's target)
    ask            any control-plane call so, e.g. a StepReader's ListDatasets (ask_in_turn)
    open_read      one Read stream on an endpoint; its session (session.py) resumes it elsewhere
    call           one checkpoint call on the data plane, on the next endpoint when it fails as a
                   stream would be resumed elsewhere (checkpoint/transport.py)

A status that says "try elsewhere" (errors.RETRYABLE_CODES: no server, a restart, an overloaded
server, a cut connection) is retried; any other error is the caller's at once. So is, for `call`, a
RESOURCE_EXHAUSTED without a retry hint (errors.clears_by_waiting): a job over its checkpoint quota
or a full root, which no wait clears — an overloaded server says when to come back.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from shardstream.errors import ShardstreamError, UnavailableError, clears_by_waiting, from_flight_error
from shardstream.v1 import shardstream_pb2 as pb

from ..credentials import ChannelSecurity
from ..spec import RetryPolicy
from .channel import Connection, DataPlane, normalize_endpoints
from .flight_call import ReadCall
from .retry import Attempts, Policy

__all__ = ["Fleet", "ask_in_turn", "find_dataset"]

log = logging.getLogger("shardstream.client")

T = TypeVar("T")


class _Connection(Protocol):
    def get_dataset(self, dataset: str, timeout_s: float) -> pb.DatasetInfo: ...


C = TypeVar("C")


def ask_in_turn(
    call: Callable[[C, float], T],
    endpoints: Sequence[str],
    first: int,
    retry: Policy,
    conn: Callable[[str], C],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`call(connection, timeout_s)` of the endpoints in turn (from the `first`-th: a rank's own) until
    one answers, on the stream session's `RetryPolicy`: after a failure that says no server answered
    (UnavailableError) the next endpoint is asked after the policy's jittered backoff, and "no server"
    is said once more than max_retries failures in a row span at least budget_s (the Loader's
    timeout_s) — a server that is still starting is waited for. Any other error is the caller's.
    `timeout_s` is what is left of the budget (at least 0.1 s)."""
    attempts = Attempts(retry, clock)
    attempts.start()  # the budget counts from the first try: it may take the whole budget
    last: ShardstreamError | None = None
    for failures in itertools.count(1):
        target = endpoints[(first + failures - 1) % len(endpoints)]
        try:
            return call(conn(target), max(0.1, retry.budget_s - attempts.failing_s))
        except UnavailableError as exc:
            last = exc
        if not attempts.failed():
            break
        sleep(attempts.backoff_s())
    raise UnavailableError(
        f"no shardstream server reachable at {', '.join(endpoints)} within {retry.budget_s:g} s: "
        f"is `shardstream serve` running there? (last error: {last})"
    )


def find_dataset(
    dataset: str,
    endpoints: Sequence[str],
    first: int,
    retry: Policy,
    conn: Callable[[str], _Connection],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> pb.DatasetInfo:
    """GetDataset(`dataset`) of the endpoints in turn, on the RetryPolicy (ask_in_turn)."""
    return ask_in_turn(lambda c, timeout_s: c.get_dataset(dataset, timeout_s), endpoints, first, retry, conn, clock, sleep)


class Fleet:
    """The endpoints, their connections and the one RetryPolicy of a Loader, a StepReader or a
    Checkpointer (see the module docstring). `owner` names it in the error of a call after close()."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        security: ChannelSecurity | None,
        retry: RetryPolicy,
        *,
        owner: str = "client",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoints = tuple(normalize_endpoints(endpoints if isinstance(endpoints, str) else list(endpoints)))
        self.security = security or ChannelSecurity()
        self.retry = retry
        self._owner = owner
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._conns: dict[str, Connection] = {}
        self._closed = False
        self._pick = 0  # the endpoint the next data-plane call goes to (call), moved on failure
        self.data_target = ""  # host:port of the data plane the last call went to

    # --- connections -------------------------------------------------------------------------------
    def conn(self, endpoint: str) -> Connection:
        """The connection to `endpoint` (made on first use); RuntimeError once closed."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"this {self._owner} is closed")
            found = self._conns.get(endpoint)
            if found is None:
                found = self._conns[endpoint] = Connection(endpoint, self.security)
            return found

    @property
    def connected(self) -> bool:
        """Whether a connection is open (close() has something to close)."""
        return bool(self._conns)

    def close(self) -> None:
        """Close every connection; later calls raise RuntimeError (a stream still reading keeps its client)."""
        with self._lock:
            self._closed = True
            conns = list(self._conns.values())
            self._conns.clear()
        for c in conns:
            c.close()

    # --- the calls ---------------------------------------------------------------------------------
    def find_dataset(self, dataset: str, first: int) -> pb.DatasetInfo:
        """GetDataset of the endpoints in turn from the `first`-th, on the RetryPolicy (find_dataset).
        The endpoint that answers remembers its data plane: a Read there asks no GetDataset again."""
        return find_dataset(dataset, self.endpoints, first, self.retry, self.conn, self._clock, self._sleep)

    def ask(self, call: Callable[[Connection, float], T], first: int = 0, retry: Policy | None = None) -> T:
        """`call(connection, timeout_s)` of the endpoints in turn from the `first`-th, on the
        RetryPolicy (or `retry`) (ask_in_turn): a control-plane call any server of the fleet may answer."""
        return ask_in_turn(call, self.endpoints, first, retry or self.retry, self.conn, self._clock, self._sleep)

    def open_read(self, endpoint: str, request: pb.ReadRequest, timeout_s: float | None = None) -> ReadCall:
        """One Read stream on `endpoint` (a `flight_call.ReadCall`); the stream session retries it."""
        return self.conn(endpoint).read(request, timeout_s)

    def call(self, fn: Callable[[DataPlane], T], retry: Policy | None = None) -> T:
        """`fn(plane)` on the data plane of the current endpoint; when it (or its discovery) fails with
        a status a stream is resumed elsewhere for, again on the next endpoint after the RetryPolicy's
        backoff (`retry`'s, when given: a longer budget), until its budget is spent (then the last error
        is raised). Only for idempotent calls: every checkpoint call is (chunks are content addressed,
        a part is replaced whole, a commit is create-if-absent)."""
        attempts = Attempts(retry or self.retry, self._clock)
        while True:
            pick = self._pick
            endpoint = self.endpoints[pick % len(self.endpoints)]
            conn = self.conn(endpoint)
            try:
                plane = conn.data_plane(None)
                self.data_target = plane.target
                return fn(plane)
            except (flight.FlightError, pa.ArrowException) as exc:
                error = from_flight_error(exc, target=self.data_target)
                if not clears_by_waiting(error):
                    raise error from exc
                failed: BaseException = exc
            except ShardstreamError as exc:  # discovery's (no server there, a restart)
                if not clears_by_waiting(exc):
                    raise
                error, failed = exc, exc
            with self._lock:  # moved on once per failure, not once per thread that saw it
                if self._pick == pick:
                    self._pick += 1
                    conn.forget_data_port()  # asked again when the call comes back to it
            if not attempts.failed():
                if error is failed:
                    raise error
                raise error from failed
            wait = attempts.backoff_s()
            log.warning(
                "a data-plane call on %s failed (%s); retrying on %s in %.2f s (retry %d)",
                endpoint,
                error,
                self.endpoints[self._pick % len(self.endpoints)],
                wait,
                attempts.failures,
            )
            self._sleep(wait)
