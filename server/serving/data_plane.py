"""The data plane: a Read stream is an Arrow Flight DoGet (data_plane_server.py serves it on --data-port).

The ticket is the serialized `ReadRequest`; each record batch of the stream is one Read message's
rows (provenance columns and transforms included) and carries that message's serialized
`ReadHeader` (steps, positions, skipped samples, end of epoch) as its `app_metadata`. Flight's C++
writes a batch's buffers into gRPC without a Python copy: measured against the hand-framed grpcio
Read it replaced, 1.12x the throughput per stream and 0.69x the server CPU per GB on 2 cores, 2.7x
and 0.62x on 16 (loadtest/README.md, "Data plane"). The control plane (GetDataset, ListDatasets) and
grpc.health stay on the gRPC port, which tells clients this port in `DatasetInfo.data_port`; a plain
`pyarrow.flight.FlightClient` reads a rank's stream with nothing but a ReadRequest.

What a stream needs comes from the process's stream runtime (stream_runtime.py): the planner
(exactly-once positions, schedules, mixtures, transforms), the message builder (steps over the
message cap in parts), admission (streams per server and per peer, the buffer budget:
RESOURCE_EXHAUSTED with the retry hint), authentication (a bearer token in the `authorization`
header, or a grant: below), the audit and stream log lines (the stream id rides in the response
headers), the stream metrics, the redacted error texts and their status codes (errors.py
`to_flight_error`: the exact code travels in the error's extra_info). The next message is built in
a worker thread (build_pool.py) while Flight sends this one, when the buffer budget has room for it: each build
reserves its bytes first and each message is released when Flight asks for the next (admission.py);
a stream without room waits for it, holding nothing, and a new stream without room for its first
message is refused. A build may make several messages (an unshuffled stream's, cut from the row
groups it holds: build.py); they wait built, and the next build starts as the last but one is sent.
The stream metrics are counted every 16 messages or second and when the stream ends, and the
handler thread keeps its Python thread state for the stream (thread_state.py). RPC metrics:
grpc_server_* with grpc_service="arrow.flight.protocol.FlightService", grpc_method="DoGet".

A client that stops reading is cut (reaper.py, one `Reaper` per plane): Flight asks for a stream's next message once the
last one is written, so a stream not asked for --write-timeout is reaped — its connection shut
down, which ends the blocked write — and leaves its slot and memory.

A caller the --auth file knows by its certificate's subject is known here by the grant the gRPC
port gave it, bound to that certificate by a proof of possession of its key (policy/grants.py: pyarrow's
Flight server does not expose the client's certificate); a call with a token is its token's. What
this plane cannot do from Python (its server takes no gRPC server options): server keepalive pings
(the write timeout does their work for a client that holds a stream). Certificates are followed
by data_plane_server.py, which replaces the plane on its port when they change.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from shardstream.checkpoint_format import signed_bytes
from shardstream.errors import (
    FlightStatus,
    InternalError,
    InvalidArgumentError,
    ResourceExhaustedError,
    ShardstreamError,
    UnauthenticatedError,
    UnavailableError,
    to_flight_error,
)
from shardstream.v1 import shardstream_pb2 as pb

from ..checkpoints import CHUNK_TICKET_PREFIX, CheckpointPlane
from ..policy.auth import Principal
from ..policy.grants import caller_principal
from ..read.message_steps import Message, MessageSteps, build_estimate, grown_target
from ..read.plan import ReadPlan
from .admission import Ticket, peer_host
from .audit import StreamAudit
from .build_pool import BuildPool, Pending
from .job_reports import MAX_REPORT_BYTES, REPORT_ACTION, count_sent, job_reports
from .placement import HANDOVER_AHEAD_STEPS, RANKS, REBALANCED, STREAMS_MOVING, rank_key
from .reaper import Reaper
from .rpc_metrics import KNOWN_CODES, MethodMetrics, code_name, preinitialize
from .stream_log import STREAM_ID_KEY, StreamLog, new_stream_id
from .stream_runtime import BATCHES_SENT, BYTES_SENT, MESSAGES_SENT, ROWS_SENT, STREAMS_ACTIVE, StreamRuntime
from .thread_state import HeldThreadState

__all__ = ["FLIGHT_SERVICE", "FlightDataPlane"]

log = logging.getLogger(__name__)

FLIGHT_SERVICE = "arrow.flight.protocol.FlightService"  # the grpc_service label of its RPC metrics
# Every Flight method the plane serves (Read streams and the checkpoint calls), with its grpc_type
_METHODS = {
    flight.FlightMethod.DO_GET: ("DoGet", "server_stream"),
    flight.FlightMethod.DO_PUT: ("DoPut", "bidi_stream"),
    flight.FlightMethod.DO_ACTION: ("DoAction", "server_stream"),
    flight.FlightMethod.LIST_FLIGHTS: ("ListFlights", "server_stream"),
}
# 0 for the known series; UNKNOWN too: a plain Flight error without a shardstream code
preinitialize(FLIGHT_SERVICE, dict(_METHODS.values()), (*KNOWN_CODES, grpc.StatusCode.UNKNOWN))
_RECORDERS = {m: MethodMetrics(kind, FLIGHT_SERVICE, name) for m, (name, kind) in _METHODS.items()}  # as the gRPC port's interceptor
BUILD_THREADS = 64  # messages built at once, one per stream at a time (a stream waits for its own)
BUILD_JOIN_S = 5.0  # how long a stopping data plane waits for its build threads to end
_MIDDLEWARE = "shardstream"


class _Call(flight.ServerMiddleware):  # type: ignore[misc]
    """One call of any method: its headers (the checkpoint handler reads its caller from them too),
    its stream id (sent back in the response headers), its RPC metrics."""

    def __init__(self, headers: dict[str, list[Any]], metrics: MethodMetrics) -> None:
        self.headers = headers
        self.stream_id = new_stream_id()
        self.code: grpc.StatusCode | None = None  # set by do_get when it ends the stream with a status
        self.metrics = metrics
        self.t0 = metrics.start()

    def metadata(self) -> list[tuple[str, str]]:
        """The call's headers as gRPC metadata (policy/auth.py reads `authorization` from it)."""
        return [
            (k, v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
            for k, values in self.headers.items()
            for v in values
        ]

    def sending_headers(self) -> dict[str, str]:
        return {STREAM_ID_KEY: self.stream_id}

    def call_completed(self, exception: BaseException | None) -> None:
        if exception is None:
            code = grpc.StatusCode.OK
        elif self.code is not None:
            code = self.code
        elif isinstance(exception, flight.FlightCancelledError):
            code = grpc.StatusCode.CANCELLED
        elif isinstance(exception, flight.FlightError):  # the exact code the error map put in extra_info
            code = FlightStatus.of(exception).code()
        else:
            code = grpc.StatusCode.UNKNOWN
        self.metrics.done(self.t0, code_name(code))


class _CallFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """One middleware for every method the plane serves (its headers, its metrics)."""

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[Any]]) -> _Call | None:
        metrics = _RECORDERS.get(info.method)
        return _Call(headers, metrics) if metrics is not None else None


class FlightDataPlane(flight.FlightServerBase):  # type: ignore[misc]
    """DoGet(ticket = serialized ReadRequest) -> the Read stream's messages as record batches."""

    def __init__(
        self,
        runtime: StreamRuntime,
        location: str,
        *,
        tls_certificates: list[tuple[bytes, bytes]] | None = None,
        client_ca: bytes | None = None,
    ) -> None:
        super().__init__(
            location,
            tls_certificates=tls_certificates,
            verify_client=client_ca is not None,
            root_certificates=client_ca,
            middleware={_MIDDLEWARE: _CallFactory()},
        )
        self.runtime = runtime
        # Checkpoints (server/checkpoints/, `serve --checkpoint-root`): None when not enabled
        self.checkpoints: CheckpointPlane | None = runtime.checkpoints
        # Every stream's message builds (one at a time per stream: _Messages)
        self.builds = BuildPool(BUILD_THREADS, "flight-build")
        # Streams whose message Flight is writing; those written to for longer than the write
        # timeout are reaped with their connection (reaper.py)
        self.reaper = Reaper(runtime.write_timeout_s, lambda: self.port)

    def shutdown(self) -> None:
        super().shutdown()  # (returns once every stream has ended)
        self.reaper.stop()
        self.builds.shutdown(wait_s=BUILD_JOIN_S)  # builds started ahead for streams that ended

    def _principal(self, call: _Call, ticket: bytes) -> Principal:
        """The caller: by its token, or by the grant the gRPC port gave its certificate (policy/grants.py)."""
        return self.runtime.data_principal(call.headers, call.metadata(), ticket)

    # --- checkpoints: DoPut, DoAction, ListFlights and chunk DoGets (server/checkpoints/plane.py) ----
    def _checkpoint_plane(self) -> CheckpointPlane:
        if self.checkpoints is None:
            raise to_flight_error(
                grpc.StatusCode.FAILED_PRECONDITION, "this server keeps no checkpoints (serve --checkpoint-root URL)"
            )
        return self.checkpoints

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        self._checkpoint_plane().do_put(context.get_middleware(_MIDDLEWARE), descriptor, reader, writer)

    def do_action(self, context: Any, action: Any) -> Any:
        if action.type == REPORT_ACTION:  # a Loader's stall report (job_reports.py)
            return self._report(context.get_middleware(_MIDDLEWARE), action)
        return self._checkpoint_plane().do_action(context.get_middleware(_MIDDLEWARE), action)

    def _report(self, call: _Call, action: Any) -> Iterator[bytes]:
        """A "loader.report" (job_reports.py): its caller authenticated as a Read stream's before
        its body is read (a grant's proof is over the body, hashed once its size is within bounds),
        then the body's size checked and the report taken."""
        body = action.body if action.body is not None else pa.py_buffer(b"")

        def within() -> bytes:
            if body.size > MAX_REPORT_BYTES:
                raise InvalidArgumentError(f"a {REPORT_ACTION} body is {body.size} bytes, over {MAX_REPORT_BYTES}")
            return bytes(body.to_pybytes())

        try:
            svc = self.runtime
            caller_principal(svc.auth, svc.grants, call.headers, call.metadata(), lambda: signed_bytes(REPORT_ACTION, within()))
            answer = job_reports().report(within())
        except BaseException as exc:  # noqa: BLE001 — mapped to a Flight error
            code, details, _ = self.runtime.status_of(REPORT_ACTION, exc)
            call.code = code
            raise to_flight_error(code, details) from None
        return iter([json.dumps(answer).encode()])

    def list_flights(self, context: Any, criteria: bytes) -> Any:
        return self._checkpoint_plane().list_flights(context.get_middleware(_MIDDLEWARE), criteria)

    # --- DoGet ---------------------------------------------------------------------------------
    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        call: _Call = context.get_middleware(_MIDDLEWARE)
        if ticket.ticket.startswith(CHUNK_TICKET_PREFIX):
            return self._checkpoint_plane().do_get(call, ticket.ticket)
        svc = self.runtime
        peer = context.peer()
        try:
            request: pb.ReadRequest | None = pb.ReadRequest.FromString(ticket.ticket)
        except Exception:  # noqa: BLE001 — protobuf's DecodeError, invalid UTF-8 in a string field
            request = None
        stream = svc.stream_log(request, peer, call.stream_id)
        audit = StreamAudit(peer, request)
        try:
            principal = self._principal(call, ticket.ticket)
            audit.principal = principal.name
            admitted = svc.admission.admit(peer)
        except (ResourceExhaustedError, UnauthenticatedError) as exc:
            audit.done(exc.grpc_code.name)
            stream.refused(str(exc))
            raise self._fail(call, exc, stream) from None
        active = STREAMS_ACTIVE.labels(stream.label)
        active.inc()
        read = _Stream(call, stream, audit, admitted, active)
        if request is not None:  # the rank it serves: what the placement of a supervisor's workers evens out
            read.rank = rank_key(peer_host(peer), request)
            RANKS.open(read.rank)
        try:
            if request is None:
                raise InvalidArgumentError(
                    "the ticket is not a ReadRequest (the Read request does not parse)"
                )
            plan = svc.planner.plan(request, principal)
            audit.planned([str(r.manifest.ref) for r in plan.readers])
            read.active = svc.stream_started(stream, plan, active)
            read.messages = _Messages(self, plan, admitted, context.is_cancelled)
            read.conform = plan.pipeline is not None
            read.movable = plan.movable
            read.handover = plan.handover
            read.stride = plan.stride
            first = read.messages.first()
        except BaseException as exc:
            error = self._fail(call, exc, stream)  # first: the stream's end line names the error
            read.end(exc.grpc_code.name if isinstance(exc, ShardstreamError) else "INTERNAL")
            raise error from None
        assert first is not None
        return flight.GeneratorStream(first.batch.schema, self._send(read, first))

    def _send(self, read: _Stream, first: Message) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        """The stream's (batch, header) pairs; Flight asks for the next once the last is written."""
        call, stream, audit, admitted, messages = read.call, read.log, read.audit, read.admitted, read.messages
        assert messages is not None
        schema = first.batch.schema
        label = stream.label
        sent = _Sent(label, stream)
        conform = read.conform
        outcome = "GONE"  # until it ends otherwise: Flight stopped asking, its client went away
        stream.reason = "client left"
        message: Message | None = first
        key, writing = self.reaper.watch(stream)
        held = HeldThreadState()
        placement = self.runtime.placement if read.movable else None
        # A stream asked to move (placement.shed_one) whose client opens the successor itself
        # (ReadRequest.handover): its next message that ends a step names the step it ends before
        # (move_at, HANDOVER_AHEAD_STEPS steps on), from which its client opens the successor as it
        # reads that header; the stream ends, OK, once it sent the steps before.
        moving, move_at = False, 0
        try:
            while message is not None:
                batch = message.batch
                if conform and batch.schema != schema:  # e.g. a message whose samples a transform all skipped
                    batch = _conform(batch, schema)
                n = message.nbytes
                stream.sent(message.steps, message.rows, n)
                if message is first:  # the stream's id, for the client's log lines
                    message.header.stream_id = stream.stream_id
                steps = message.header.steps
                if moving and not move_at and steps and not steps[-1].more_parts:
                    # (on the epoch's last message too: its client moves its next epoch's stream)
                    move_at = steps[-1].step + read.stride * (1 + HANDOVER_AHEAD_STEPS)
                    message.header.move_at = move_at
                metadata = message.header.SerializeToString()
                messages.ahead()  # the next message builds while Flight writes this one
                writing.since = now = time.monotonic()
                sent.count(stream, now)
                yield batch, metadata
                writing.since = None
                audit.sent(n)
                if message.holds:  # Flight asked for the next: this one is written
                    admitted.release(message.holds)
                del batch, metadata
                if placement is not None and _ends_a_step(message):
                    if move_at and steps and steps[-1].step + read.stride >= move_at:
                        messages.cancel()  # handed over: its client reads the rest from the successor
                        break
                    if not moving and placement.shed_one():
                        if not read.handover:
                            messages.cancel()  # at a step boundary: a less busy worker takes it from the next step
                            raise UnavailableError(REBALANCED)
                        moving = True
                        STREAMS_MOVING.inc()
                message = messages.next()
            outcome = stream.outcome = "OK"
            stream.reason = "moved" if move_at else ""
        except _Gone:  # its client left while it waited for room in the buffer budget
            messages.cancel()
        except GeneratorExit:
            messages.cancel()
            self.reaper.left(writing)  # reaped if its connection was shut down for another stream
            raise
        except BaseException as exc:  # noqa: BLE001 — mapped to a Flight error
            outcome = exc.grpc_code.name if isinstance(exc, ShardstreamError) else "INTERNAL"
            stream.reason = ""
            raise self._fail(call, exc, stream) from None
        finally:
            if moving:
                STREAMS_MOVING.dec()
            sent.flush(stream)
            self.reaper.forget(key)
            # a rank whose epoch went out whole still counts here while its client reads it
            read.end(outcome, linger=outcome == "OK" and not moving)
            held.release()

    def _fail(self, call: _Call, exc: BaseException, stream: StreamLog) -> flight.FlightError:
        """The Flight error that ends the call (the runtime's status_of logs and counts it)."""
        code, details, _ = self.runtime.status_of("Read", exc, stream)
        call.code = code
        retry = exc.retry_after_s if isinstance(exc, ResourceExhaustedError) else None
        return to_flight_error(code, details, retry, stream.stream_id)


@dataclass
class _Stream:
    """One Read stream of this plane: its call, its log and audit lines, its admission ticket, its
    active gauge's child and, once planned, its messages; `end` releases what it holds, once."""

    call: _Call
    log: StreamLog
    audit: StreamAudit
    admitted: Ticket
    active: Any
    messages: _Messages | None = None
    conform: bool = False  # its messages may differ from its first in their columns (transforms)
    movable: bool = False  # its client follows it to another worker (ReadRequest.movable)
    handover: bool = False  # ... and opens the successor itself (ReadRequest.handover)
    stride: int = 1  # its step stride (the plan's)
    rank: Any = None  # its rank's key in this process's RankTally (placement.RANKS), once counted

    def end(self, outcome: str, linger: bool = False) -> None:
        self.admitted.close()
        self.active.dec()
        if self.rank is not None:
            RANKS.close(self.rank, linger)
        self.audit.done(outcome)
        self.log.end()


class _Sent:
    """A stream's messages, steps, rows and bytes sent, counted in its metrics every FLUSH_MESSAGES
    messages or FLUSH_S seconds and when it ends, not a message at a time (four counters under a
    lock each: ~5 us a message of the send loop's Python, which the server pays 2-3 times over)."""

    FLUSH_MESSAGES = 16
    FLUSH_S = 1.0

    def __init__(self, label: str, stream: StreamLog) -> None:
        self._messages, self._steps = MESSAGES_SENT.labels(label), BATCHES_SENT.labels(label)
        self._rows, self._bytes = ROWS_SENT.labels(label), BYTES_SENT.labels(label)
        self._pending = 0  # messages not counted yet
        self._counted = (stream.steps, stream.rows, stream.bytes)  # the stream's, counted so far
        self._at = time.monotonic()

    def count(self, stream: StreamLog, now: float) -> None:
        """One more message of `stream` sent (its StreamLog counts its steps, rows and bytes)."""
        self._pending += 1
        if self._pending >= self.FLUSH_MESSAGES or now - self._at >= self.FLUSH_S:
            self.flush(stream, now)

    def flush(self, stream: StreamLog, now: float | None = None) -> None:
        steps, rows, nbytes = self._counted
        if self._pending:
            self._messages.inc(self._pending)
            self._steps.inc(stream.steps - steps)
            self._rows.inc(stream.rows - rows)
            count_sent(stream.rows - rows)  # the server's samples per second (job_reports.py)
            self._bytes.inc(stream.bytes - nbytes)
        self._pending = 0
        self._counted = (stream.steps, stream.rows, stream.bytes)
        self._at = time.monotonic() if now is None else now


class _Gone(Exception):
    """The client left while its stream waited for room in the buffer budget."""


class _Messages:
    """One stream's messages, built in the plane's pool once the stream has reserved what the
    build may take (admission.py); `ahead()` starts the next build while Flight writes this
    message when the budget has room for it, and `next()` waits for room otherwise. A build may
    make several messages (the builder's `builds`: an unshuffled stream's, cut from its row groups):
    they wait here, built, and the next build starts as the last but one of them is being written."""

    def __init__(
        self, plane: FlightDataPlane, plan: ReadPlan, admitted: Ticket, cancelled: Callable[[], bool]
    ) -> None:
        svc = plane.runtime
        self._pool = plane.builds
        self._plan = plan
        self._admitted = admitted
        self._cancelled = cancelled
        self._lock = threading.Lock()  # the builds of one stream run one at a time, in order
        self._last: Message | None = None  # the last message built (its size sizes the next reservation)
        self._built: deque[Message] = deque()  # built, not yet handed to Flight
        # the message target: the plan's, grown while the buffer budget has room (message_steps.py
        # `grown_target`), looked at again before every build as streams come and go
        self._target = plan.max_message_bytes
        admission = svc.admission

        def before_build(steps: MessageSteps) -> None:
            if plan.target_grows:
                steps.target = self._target = grown_target(
                    plan.max_message_bytes, plan.message_cap_bytes, admission.limits.buffer_bytes, admission.streams
                )
            svc.read_ahead.schedule(plan, steps.ahead(svc.read_ahead.messages))

        self._it = svc.builder.builds(plan, before_build)
        self._pending: Pending[list[Message]] | None = None
        self._pending_reserved = 0

    def _build(self, reserved: int) -> list[Message]:
        """The next build's messages, built under a reservation of `reserved` bytes that they then
        replace (none: the stream is over)."""
        try:
            with self._lock:
                built = next(self._it, [])
        except BaseException:
            self._admitted.release(reserved)
            raise
        self._admitted.settle(reserved, sum(m.holds for m in built))
        if built:
            self._last = built[-1]
        return built

    def _take(self, built: list[Message]) -> Message | None:
        if not built:
            return None
        self._built.extend(built[1:])
        return built[0]

    def first(self) -> Message | None:
        """The stream's first message; ResourceExhaustedError when the budget has no room for it."""
        reserved = build_estimate(self._plan, None)
        self._admitted.reserve_or_refuse(reserved)
        return self._take(self._build(reserved))

    def ahead(self) -> None:
        if self._pending is not None or len(self._built) > 1:  # (the next build: under the last two)
            return
        reserved = build_estimate(self._plan, self._last, self._target)
        if self._admitted.reserve(reserved):
            self._pending_reserved = reserved
            self._pending = self._pool.submit(self._build, reserved)

    def next(self) -> Message | None:
        if self._built:
            return self._built.popleft()
        pending, self._pending = self._pending, None
        if pending is not None:
            return self._take(pending.result())
        reserved = build_estimate(self._plan, self._last, self._target)
        if not self._admitted.reserve(reserved, wait=True, cancelled=self._cancelled):
            raise _Gone
        return self._take(self._build(reserved))

    def cancel(self) -> None:
        if self._pending is not None and self._pending.cancel():
            self._admitted.release(self._pending_reserved)  # it never ran


def _ends_a_step(message: Message) -> bool:
    """Whether the client has whole steps once `message` is in (its last step is not cut in parts) and
    more are to come (a stream at its epoch's end is not worth moving)."""
    header = message.header
    steps = header.steps
    return not (header.end_of_epoch or (steps and steps[-1].more_parts))


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` as the stream's schema (a Flight stream has one), or INTERNAL naming the difference."""
    try:
        return batch.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise InternalError(
            f"a message's columns ({batch.schema.names}) differ from the stream's first ({schema.names}): {exc}"
        ) from exc
