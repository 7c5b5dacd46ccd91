"""The ShardStream servicer: the control plane on grpc.aio, and what its data plane shares with it.

GetDataset and ListDatasets are proto in -> registry -> proto out. GetDataset's answer names the
port of this process's data plane (data_plane.py: Read streams as Arrow Flight DoGet), and to a
caller it authenticated by its client certificate it gives a grant bound to that certificate
(grants.py). The servicer also holds what every Read stream of the process shares: the planner
(server/read/plan.py), the message builder (server/read/build.py), admission (admission.py: streams per server and per
peer, bytes held), read-ahead, the stream metrics, the stream log and the one mapping of errors to
statuses (`status_of`): every ShardstreamError leaves as its own gRPC status code (errors.py; a
request that does not even parse is INVALID_ARGUMENT); anything else is logged and leaves as
INTERNAL. What a client reads of an error names dataset versions and shards, never a server path or
an exception's text (redact.py); the server's log keeps the rest.

ListDatasets lists every dataset it can read and skips the bad entries (server/transforms/ops.py): each is logged
once per process, with its detail, and `shardstream_registry_bad_entries` counts them.

Every call is authenticated first (auth.py: a bearer token or a client certificate's subject, when
the server has `--auth`) and every dataset it names is checked against the caller's patterns;
ListDatasets lists only the latest versions the caller may read. Each call refused as
UNAUTHENTICATED or PERMISSION_DENIED leaves one line in the audit log (audit.py), as each Read
stream does. Stream metrics carry the dataset's name as a bounded `dataset` label
(dataset_label.py); RPC counts and times are the grpc-ecosystem metrics, kept by an interceptor for
every service of this port (rpc_metrics.py) and by the data plane for its DoGet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from prometheus_client import Counter, Gauge

from shardstream import __version__
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

from ..config import DEFAULT_WRITE_TIMEOUT_S
from ..read.build import MessageBuilder
from ..read.plan import ReadPlan, ReadPlanner
from ..read.readahead import DEFAULT_READ_AHEAD_MESSAGES, ReadAhead
from ..read.reader import RowGroupCache
from ..read.request_limits import RequestLimits
from .admission import Admission
from .audit import audit_call
from .auth import OPEN, Authenticator, Principal, has_token
from .dataset_label import dataset_label, dataset_name
from .grants import GRANT_TTL_S, Grants, peer_fingerprint
from .redact import client_message
from .rpc_metrics import code_name, preinitialize
from .stream_log import StreamLog, new_stream_id

__all__ = ["SERVICE_NAME", "ShardStreamService", "dataset_info"]

# Every control-plane answer names the server's version in its initial metadata (`shardstream ping`).
VERSION_METADATA = (("x-shardstream-version", __version__),)

log = logging.getLogger(__name__)

SERVICE_NAME = "shardstream.v1.ShardStream"
METHODS = ("GetDataset", "ListDatasets")

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
preinitialize(SERVICE_NAME, {"GetDataset": "unary", "ListDatasets": "unary"})  # 0 for the known series

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
        self.write_timeout_s = write_timeout_s  # a stream Flight writes no further for this long is reaped
        self.port = 0  # the port the server listens on, once bound (server/lifecycle.py)
        self.data_port = 0  # its Flight data plane's port (data_plane_server.py), once bound
        self.grants: Grants | None = None  # with a data plane: what vouches for certificate callers
        self.read_ahead = ReadAhead(read_ahead, cache)  # each stream's next row groups, fetched ahead
        self._logged: set[str] = set()  # what was logged once already (bad entries, data-loss messages)

    # --- plumbing ------------------------------------------------------------------------------
    def handler(self) -> grpc.GenericRpcHandler:
        """One generic handler: the control plane (Read streams are the Flight data plane's)."""
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
        self, method: str, fn: Callable[[Any, Principal, grpc.aio.ServicerContext | None], Awaitable[T]]
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[T]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> T:
            principal = None
            try:
                await context.send_initial_metadata(VERSION_METADATA)
                principal = self._principal(context)
                if request is None:
                    raise InvalidArgumentError(f"the {method} request does not parse")
                return await fn(request, principal, context)
            except Exception as exc:  # noqa: BLE001 — mapped to a status in _abort
                if isinstance(exc, (UnauthenticatedError, PermissionDeniedError)):
                    dataset = getattr(request, "dataset", "")
                    audit_call(method, principal.name if principal else "-", dataset, exc.grpc_code.name, context.peer())
                await self._abort(method, context, exc)
                raise AssertionError("unreachable: abort raises") from exc

        return handle

    # --- control plane -------------------------------------------------------------------------
    async def get_dataset(
        self,
        request: pb.GetDatasetRequest,
        principal: Principal = OPEN,
        context: grpc.aio.ServicerContext | None = None,
    ) -> pb.DatasetInfo:
        manifest = await asyncio.to_thread(self.planner.resolve, request.dataset, principal)
        info = dataset_info(manifest, self.data_port)
        grant = self._grant(principal, context)
        if grant is not None:
            info.data_grant = grant  # the data plane cannot see the certificate
            info.data_grant_ttl_s = GRANT_TTL_S
        return info

    def _grant(self, principal: Principal, context: grpc.aio.ServicerContext | None) -> bytes | None:
        """A grant for a caller this call authenticated by its client certificate (not by a token),
        bound to that certificate's fingerprint (grants.py); None for any other caller."""
        if self.grants is None or not self.auth.enabled or principal.subject is None or context is None:
            return None
        if has_token(context.invocation_metadata()):
            return None  # a token's caller sends its token to the data plane too
        cert = peer_fingerprint(context.auth_context())
        return None if cert is None else self.grants.issue(principal, cert)

    async def list_datasets(
        self,
        request: pb.ListDatasetsRequest,
        principal: Principal = OPEN,
        context: grpc.aio.ServicerContext | None = None,
    ) -> pb.ListDatasetsResponse:
        del request
        listing = await asyncio.to_thread(self.registry.listing)
        REGISTRY_BAD_ENTRIES.set(len(listing.bad))
        for bad in listing.bad:
            self._report(bad)
        readable = [m for m in listing.manifests if principal.may_read(m.name, m.version)]
        response = pb.ListDatasetsResponse(
            datasets=[dataset_info(m, self.data_port) for m in readable], data_port=self.data_port
        )
        grant = self._grant(principal, context)  # a certificate's caller: for the checkpoint calls
        if grant is not None:
            response.data_grant = grant
            response.data_grant_ttl_s = GRANT_TTL_S
        return response

    def _report(self, bad: BadEntry) -> None:
        if self._log_once(f"{bad.ref}: {bad.reason}"):
            log.warning(
                "registry entry %s (%s) is unreadable, skipped by ListDatasets: %s%s",
                bad.ref,
                self.registry.storage.url_of(bad.key) if bad.key else bad.name,
                bad.reason,
                f" ({bad.detail})" if bad.detail else "",
            )

    # --- what the data plane (data_plane.py) shares with this servicer ------------------------
    def stream_log(
        self, request: pb.ReadRequest | None, peer: str, stream_id: str | None = None
    ) -> StreamLog:
        """A new stream's log lines (stream_log.py), labelled by the dataset it asks for."""
        stream = StreamLog(stream_id or new_stream_id(), peer)
        stream.asked(request)
        if request is not None:  # labelled by name only once admitted (dataset_label.py)
            name = dataset_name(request.dataset, [s.dataset for s in request.mixture])
            stream.label = dataset_label(name, admit=False)
        return stream

    def stream_started(self, stream: StreamLog, plan: ReadPlan, active: Any) -> Any:
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
