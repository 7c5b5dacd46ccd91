"""The ShardStream servicer: grpc.aio in and out, around the planner and the message builder.

Proto in -> `ReadPlanner.plan` (read_plan.py) -> `MessageBuilder.stream` (build.py) -> framed Arrow
out. This module only adapts them to gRPC: it registers the handlers, admits each Read stream
(admission.py: streams per server and per peer, bytes held) or refuses it with RESOURCE_EXHAUSTED
and a retry hint, runs the blocking work (manifest reads, Parquet reads, takes, IPC encoding) in
worker threads, builds the next message while the last one is sent (while the server's stream
buffer budget allows), streams with backpressure (grpc.aio awaits each write) and cuts a stream
whose client reads nothing for the write timeout (reaper.py), keeps the RPC metrics, and maps
errors (a request that does not even parse is INVALID_ARGUMENT): every ShardstreamError leaves as its own gRPC status code
(errors.py); anything else is logged and leaves as INTERNAL. What a client reads of an error names
dataset versions and shards, never a server path or an exception's text (redact.py); the server's
log keeps the rest.

ListDatasets lists every dataset it can read and skips the bad entries (registry.py): each is logged
once per process, with its detail, and `shardstream_registry_bad_entries` counts them.

Every call is authenticated first (auth.py: a bearer token or a client certificate's subject, when
the server has `--auth`) and every dataset it names is checked against the caller's patterns;
ListDatasets lists only the latest versions the caller may read. Each Read stream, and each call
refused as UNAUTHENTICATED or PERMISSION_DENIED, leaves one line in the audit log (audit.py).

Each Read stream gets an id, sent first in its initial metadata, and a `stream.start` and a
`stream.end` line in the server's log under it (stream_log.py). Stream metrics carry the dataset's
name as a bounded `dataset` label (dataset_label.py); RPC counts and times are the grpc-ecosystem
metrics, kept by an interceptor for every service (grpc_metrics.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from prometheus_client import Counter, Gauge

from shardstream.errors import (
    InternalError,
    InvalidArgumentError,
    PermissionDeniedError,
    ResourceExhaustedError,
    ShardstreamError,
    UnauthenticatedError,
)
from shardstream.extension_types import plain_schema
from shardstream.manifest import Manifest
from shardstream.registry import BadEntry, Registry
from shardstream.v1 import shardstream_pb2 as pb

from .admission import Admission, Ticket
from .audit import StreamAudit, audit_call
from .auth import OPEN, Authenticator, Principal
from .build import Message, MessageBuilder, MessageSteps
from .config import DEFAULT_WRITE_TIMEOUT_S
from .dataset_label import dataset_label, dataset_name
from .grants import GRANT_TTL_S, Grants
from .grpc_metrics import code_name, preinitialize
from .read_plan import ReadPlan, ReadPlanner
from .readahead import DEFAULT_READ_AHEAD_MESSAGES, ReadAhead
from .reader import RowGroupCache
from .reaper import Reaper, StreamGone, StreamReaped
from .redact import client_message
from .request_limits import RequestLimits
from .stream_log import STREAM_ID_KEY, StreamLog, new_stream_id

__all__ = ["SERVICE_NAME", "ShardStreamService", "dataset_info"]

log = logging.getLogger(__name__)

SERVICE_NAME = "shardstream.v1.ShardStream"
METHODS = ("GetDataset", "ListDatasets", "Read")

STREAMS_ACTIVE = Gauge(
    "shardstream_streams_active", "Read streams in progress", ["dataset"], multiprocess_mode="livesum"
)
STREAMS = Counter("shardstream_streams_total", "Read streams started (planned)", ["dataset"])
STREAM_ERRORS = Counter(
    "shardstream_stream_errors_total", "Read streams that ended with an error status", ["dataset", "code"]
)
BATCHES_SENT = Counter("shardstream_batches_sent_total", "Steps (per-rank batches) sent", ["dataset"])
MESSAGES_SENT = Counter("shardstream_messages_sent_total", "Read messages sent", ["dataset"])
ROWS_SENT = Counter("shardstream_rows_sent_total", "Rows sent", ["dataset"])
BYTES_SENT = Counter("shardstream_bytes_sent_total", "Bytes of Read messages sent", ["dataset"])
REGISTRY_BAD_ENTRIES = Gauge(
    "shardstream_registry_bad_entries",
    "Registry entries (manifests, dataset directories) ListDatasets found unreadable and skipped, at its last call",
    multiprocess_mode="livemax",
)
_LOGGED_MAX = 1000  # distinct bad entries / data-loss messages logged per process before going quiet
preinitialize(  # export 0 for the series known to exist
    SERVICE_NAME,
    {"GetDataset": "unary", "ListDatasets": "unary", "Read": "server_stream"},
    (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.CANCELLED,
    ),
)

T = TypeVar("T")
_MAX_DETAILS_CHARS = 2000  # of an error's message: status details travel in a size-limited trailer


def _lenient(parse: Callable[[bytes], T]) -> Callable[[bytes], T | None]:
    """A request deserializer that answers None for bytes that do not parse (the handler then
    refuses them with INVALID_ARGUMENT; gRPC would answer INTERNAL)."""

    def parse_or_none(data: bytes) -> T | None:
        try:
            return parse(data)
        except Exception:  # noqa: BLE001 — protobuf's DecodeError, invalid UTF-8 in a string field
            return None

    return parse_or_none


class ShardStreamService:
    """One per server process, shared by all its streams (the planner's readers and orders too)."""

    def __init__(
        self,
        registry: Registry,
        cache: RowGroupCache,
        *,
        read_ahead: int = DEFAULT_READ_AHEAD_MESSAGES,
        transform_threads: int = 1,
        limits: RequestLimits | None = None,
        admission: Admission | None = None,
        write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
        auth: Authenticator | None = None,
    ) -> None:
        self.registry = registry
        self.auth = auth or Authenticator(None)
        self.planner = ReadPlanner(registry, cache, limits)
        self.builder = MessageBuilder(transform_threads=transform_threads)
        self.admission = admission or Admission()
        self.reaper = Reaper(write_timeout_s)
        self.port = 0  # the port the server listens on, once bound (app.py)
        self.data_port = 0  # its Flight data plane's port (flight_service.py); 0: Read is served here
        self.grants: Grants | None = None  # with a data plane: what vouches for certificate callers
        self._read_ahead = ReadAhead(read_ahead, cache)
        self._logged: set[str] = set()  # what was logged once already (bad entries, data-loss messages)

    # --- plumbing ------------------------------------------------------------------------------
    def handler(self) -> grpc.GenericRpcHandler:
        """One generic handler: protobuf for the control plane, hand-framed bytes for Read."""
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "GetDataset": grpc.unary_unary_rpc_method_handler(
                    self._unary("GetDataset", self.get_dataset),
                    request_deserializer=_lenient(pb.GetDatasetRequest.FromString),
                    response_serializer=pb.DatasetInfo.SerializeToString,
                ),
                "ListDatasets": grpc.unary_unary_rpc_method_handler(
                    self._unary("ListDatasets", self.list_datasets),
                    request_deserializer=_lenient(pb.ListDatasetsRequest.FromString),
                    response_serializer=pb.ListDatasetsResponse.SerializeToString,
                ),
                "Read": grpc.unary_stream_rpc_method_handler(
                    self.read,
                    request_deserializer=_lenient(pb.ReadRequest.FromString),
                    response_serializer=None,  # messages are already wire bytes (framing.py)
                ),
            },
        )

    def _log_once(self, what: str) -> bool:
        """True the first time `what` is seen (and while fewer than _LOGGED_MAX were)."""
        if what in self._logged or len(self._logged) >= _LOGGED_MAX:
            return False
        self._logged.add(what)
        return True

    async def _abort(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        exc: BaseException,
        stream: StreamLog | None = None,
    ) -> None:
        code, details, metadata = self.status_of(method, exc, stream)
        await context.abort(code, details, trailing_metadata=metadata)

    def status_of(
        self, method: str, exc: BaseException, stream: StreamLog | None = None
    ) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
        """The status a failed call ends with (code, what the client may read, trailing metadata);
        logged as needed, and counted against its stream."""
        sid = f" (stream {stream.stream_id})" if stream is not None else ""
        if not isinstance(exc, ShardstreamError):
            log.exception("%s%s failed unexpectedly", method, sid, exc_info=exc)
            exc = InternalError(client_message(exc, self.registry.storage))
        elif exc.grpc_code == grpc.StatusCode.DATA_LOSS and self._log_once(str(exc)):
            log.warning("%s%s: %s", method, sid, exc, exc_info=exc)  # the cause chain: files and errors
        details = client_message(exc, self.registry.storage)
        if len(details) > _MAX_DETAILS_CHARS:
            details = f"{details[:_MAX_DETAILS_CHARS]}... ({len(details)} characters)"
        if stream is not None:
            stream.failed(code_name(exc.grpc_code), details)
            STREAM_ERRORS.labels(stream.label, stream.outcome).inc()
        metadata = exc.trailing_metadata() if isinstance(exc, ResourceExhaustedError) else ()
        return exc.grpc_code, details, metadata

    def _principal(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller (auth.py); UnauthenticatedError when the server has --auth and it is nobody known."""
        return self.auth.authenticate(context.invocation_metadata(), context.auth_context())

    def _unary(
        self, method: str, fn: Callable[[Any, Principal], Awaitable[T]]
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[T]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> T:
            principal = None
            try:
                principal = self._principal(context)
                if request is None:
                    raise InvalidArgumentError(f"the {method} request does not parse")
                return await fn(request, principal)
            except Exception as exc:  # noqa: BLE001 — mapped to a status in _abort
                if isinstance(exc, (UnauthenticatedError, PermissionDeniedError)):
                    dataset = getattr(request, "dataset", "")
                    audit_call(method, principal.name if principal else "-", dataset, exc.grpc_code.name, context.peer())
                await self._abort(method, context, exc)
                raise AssertionError("unreachable: abort raises") from exc

        return handle

    # --- control plane -------------------------------------------------------------------------
    async def get_dataset(self, request: pb.GetDatasetRequest, principal: Principal = OPEN) -> pb.DatasetInfo:
        manifest = await asyncio.to_thread(self.planner.resolve, request.dataset, principal)
        info = dataset_info(manifest, self.data_port)
        if self.grants is not None and self.auth.enabled and principal.subject is not None:
            info.data_grant = self.grants.issue(principal)  # the data plane cannot see the certificate
            info.data_grant_ttl_s = GRANT_TTL_S
        return info

    async def list_datasets(
        self, request: pb.ListDatasetsRequest, principal: Principal = OPEN
    ) -> pb.ListDatasetsResponse:
        del request
        listing = await asyncio.to_thread(self.registry.listing)
        REGISTRY_BAD_ENTRIES.set(len(listing.bad))
        for bad in listing.bad:
            self._report(bad)
        readable = [m for m in listing.manifests if principal.may_read(m.name, m.version)]
        return pb.ListDatasetsResponse(datasets=[dataset_info(m, self.data_port) for m in readable])

    def _report(self, bad: BadEntry) -> None:
        if self._log_once(f"{bad.ref}: {bad.reason}"):
            log.warning(
                "registry entry %s (%s) is unreadable, skipped by ListDatasets: %s%s",
                bad.ref,
                self.registry.storage.url_of(bad.key) if bad.key else bad.name,
                bad.reason,
                f" ({bad.detail})" if bad.detail else "",
            )

    # --- data plane ----------------------------------------------------------------------------
    async def read(self, request: pb.ReadRequest | None, context: grpc.aio.ServicerContext) -> None:
        peer = context.peer()
        stream = self._stream_log(request, peer)
        await context.send_initial_metadata(((STREAM_ID_KEY, stream.stream_id),))  # first: the client logs it
        audit = StreamAudit(peer, request)
        try:
            principal = self._principal(context)
            audit.principal = principal.name
            ticket = self.admission.admit(peer)
        except (ResourceExhaustedError, UnauthenticatedError) as exc:
            audit.done(exc.grpc_code.name)
            stream.refused(str(exc))
            await self._abort("Read", context, exc, stream)
            return
        outcome = "GONE"  # a cancelled stream: its client went away
        active = STREAMS_ACTIVE.labels(stream.label)  # from admission to its end; relabelled once planned
        active.inc()
        try:
            if request is None:
                raise InvalidArgumentError("the Read request does not parse")
            # In a thread: planning reads manifests and may load a tokenizer or import a codec.
            plan = await asyncio.to_thread(self.planner.plan, request, principal)
            audit.planned([str(r.manifest.ref) for r in plan.readers])  # the versions it resolved to
            active = self._started(stream, plan, active)
            await self._send(plan, context, ticket, peer, audit, stream)
            outcome = stream.outcome = "OK"
        except asyncio.CancelledError:
            stream.reason = "cancelled (the client cancelled, or the server stopped)"
            raise
        except StreamGone as exc:  # its client went away, or was cut: no status can reach it
            reaped = isinstance(exc, StreamReaped)
            stream.reason = "reaped: nothing read for --write-timeout" if reaped else "client left"
            context.set_code(grpc.StatusCode.CANCELLED)  # as the RPC metrics count it
        except Exception as exc:  # noqa: BLE001 — mapped to a status in _abort
            outcome = exc.grpc_code.name if isinstance(exc, ShardstreamError) else "INTERNAL"
            await self._abort("Read", context, exc, stream)
        finally:
            ticket.close()
            active.dec()
            audit.done(outcome)
            stream.end()

    def _stream_log(self, request: pb.ReadRequest | None, peer: str, stream_id: str | None = None) -> StreamLog:
        stream = StreamLog(stream_id or new_stream_id(), peer)
        stream.asked(request)
        if request is not None:  # labelled by name only once admitted (dataset_label.py)
            name = dataset_name(request.dataset, [s.dataset for s in request.mixture])
            stream.label = dataset_label(name, admit=False)
        return stream

    def _started(self, stream: StreamLog, plan: ReadPlan, active: Any) -> Any:
        """A planned stream: its dataset label admitted, counted, logged; its active gauge's child."""
        names = [r.manifest.name for r in plan.readers]
        label = dataset_label(dataset_name(names[0], names if plan.mixture else None), admit=True)
        if plan.pipeline:
            plan.pipeline.dataset = label
        STREAMS.labels(label).inc()
        if label != stream.label:
            active.dec()
            active = STREAMS_ACTIVE.labels(label)
            active.inc()
        stream.start(", ".join(r.manifest.ref for r in plan.readers), label)
        return active

    async def _send(
        self,
        plan: ReadPlan,
        context: grpc.aio.ServicerContext,
        ticket: Ticket,
        peer: str,
        audit: StreamAudit,
        stream: StreamLog,
    ) -> None:
        """Write the stream's messages, each built in a worker thread while the last one is written."""
        label = stream.label
        messages_sent, batches_sent = MESSAGES_SENT.labels(label), BATCHES_SENT.labels(label)
        rows_sent, bytes_sent = ROWS_SENT.labels(label), BYTES_SENT.labels(label)

        def read_ahead(steps: MessageSteps) -> None:
            # Fetch the row groups of the next message(s) while this one is built (a guess: same size).
            self._read_ahead.schedule(plan, steps.ahead(self._read_ahead.messages))

        messages = self.builder.stream(plan, read_ahead)

        async def build() -> Message | None:
            message = await asyncio.to_thread(next, messages, None)
            if message is not None:
                ticket.hold(message.nbytes)  # from built until written
            return message

        def build_next() -> asyncio.Future[Message | None]:
            return asyncio.ensure_future(build())

        pending: asyncio.Future[Message | None] | None = build_next()
        try:
            while pending is not None:
                message = await pending
                if message is None:
                    return
                n = message.nbytes
                # Build the next message while this one is written, unless the server's streams
                # already hold their buffer budget: then only after it (a slow client holds one).
                pending = build_next() if self.admission.has_room() else None
                messages_sent.inc()  # counted as handed to gRPC (a client may go before its write ends)
                batches_sent.inc(message.steps)
                rows_sent.inc(message.rows)
                bytes_sent.inc(n)
                stream.sent(message.steps, message.rows, n)
                ticket.hold(n)  # gRPC's copy, until the write completes
                await self.reaper.write(context, message.data, peer, self.port)
                audit.sent(n)
                ticket.release(2 * n)
                if pending is None:
                    pending = build_next()
        finally:
            if pending is not None:  # the client went away mid-stream
                pending.cancel()


def dataset_info(m: Manifest, data_port: int = 0) -> pb.DatasetInfo:
    """A manifest as GetDataset and ListDatasets answer it (with the server's Flight data port)."""
    return pb.DatasetInfo(
        name=m.name,
        version=m.version,
        fingerprint=m.fingerprint,
        num_rows=m.num_rows,
        num_shards=len(m.shards),
        num_bytes=m.num_bytes,
        fields=[pb.Field(name=n, type=t) for n, t in m.fields],
        arrow_schema=plain_schema(m.schema).serialize().to_pybytes(),  # no extension type a client would revive
        data_port=data_port,
    )
