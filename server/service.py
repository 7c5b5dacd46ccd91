"""The ShardStream servicer: grpc.aio in and out, around the planner and the message builder.

Proto in -> `ReadPlanner.plan` (read_plan.py) -> `MessageBuilder.build` (build.py) -> framed Arrow
out. This module only adapts them to gRPC: it registers the handlers, runs the blocking work
(manifest reads, Parquet reads, takes, IPC encoding) in worker threads, builds the next message
while the last one is sent and streams with backpressure (grpc.aio awaits each write), keeps the
RPC metrics, and maps errors: every ShardstreamError leaves as its own gRPC status code
(errors.py); anything else is logged and leaves as INTERNAL. What a client reads of an error names
dataset versions and shards, never a server path or an exception's text (redact.py); the server's
log keeps the rest.

ListDatasets lists every dataset it can read and skips the bad entries (registry.py): each is logged
once per process, with its detail, and `shardstream_registry_bad_entries` counts them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from prometheus_client import Counter, Gauge

from shardstream.errors import InternalError, ShardstreamError
from shardstream.manifest import Manifest
from shardstream.registry import BadEntry, Registry
from shardstream.v1 import shardstream_pb2 as pb

from .build import MessageBuilder, MessageSteps
from .read_plan import ReadPlanner
from .readahead import DEFAULT_READ_AHEAD_MESSAGES, ReadAhead
from .reader import RowGroupCache
from .redact import client_message

__all__ = ["SERVICE_NAME", "ShardStreamService", "dataset_info"]

log = logging.getLogger(__name__)

SERVICE_NAME = "shardstream.v1.ShardStream"
METHODS = ("GetDataset", "ListDatasets", "Read")

RPCS = Counter("shardstream_rpcs_total", "RPCs received", ["method"])
RPC_ERRORS = Counter(
    "shardstream_rpc_errors_total", "RPCs that ended with an error, by status code", ["method", "code"]
)
STREAMS_ACTIVE = Gauge("shardstream_streams_active", "Read streams in progress", multiprocess_mode="livesum")
BATCHES_SENT = Counter("shardstream_batches_sent_total", "Steps (per-rank batches) sent")
MESSAGES_SENT = Counter("shardstream_messages_sent_total", "Read messages sent")
ROWS_SENT = Counter("shardstream_rows_sent_total", "Rows sent")
BYTES_SENT = Counter("shardstream_bytes_sent_total", "Bytes of Read messages sent")
REGISTRY_BAD_ENTRIES = Gauge(
    "shardstream_registry_bad_entries",
    "Registry entries (manifests, dataset directories) ListDatasets found unreadable and skipped, at its last call",
    multiprocess_mode="livemax",
)
_LOGGED_MAX = 1000  # distinct bad entries / data-loss messages logged per process before going quiet
for _m in METHODS:  # export 0 for the series known to exist
    RPCS.labels(_m)
    for _code in (
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "FAILED_PRECONDITION",
        "DATA_LOSS",
        "UNAVAILABLE",
        "INTERNAL",
    ):
        RPC_ERRORS.labels(_m, _code)

T = TypeVar("T")


class ShardStreamService:
    """One per server process, shared by all its streams (the planner's readers and orders too)."""

    def __init__(
        self,
        registry: Registry,
        cache: RowGroupCache,
        *,
        read_ahead: int = DEFAULT_READ_AHEAD_MESSAGES,
        transform_threads: int = 1,
    ) -> None:
        self.registry = registry
        self.planner = ReadPlanner(registry, cache)
        self.builder = MessageBuilder(transform_threads=transform_threads)
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
                    request_deserializer=pb.GetDatasetRequest.FromString,
                    response_serializer=pb.DatasetInfo.SerializeToString,
                ),
                "ListDatasets": grpc.unary_unary_rpc_method_handler(
                    self._unary("ListDatasets", self.list_datasets),
                    request_deserializer=pb.ListDatasetsRequest.FromString,
                    response_serializer=pb.ListDatasetsResponse.SerializeToString,
                ),
                "Read": grpc.unary_stream_rpc_method_handler(
                    self.read,
                    request_deserializer=pb.ReadRequest.FromString,
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

    async def _abort(self, method: str, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        if not isinstance(exc, ShardstreamError):
            log.exception("%s failed unexpectedly", method, exc_info=exc)
            exc = InternalError(client_message(exc, self.registry.storage))
        elif exc.grpc_code == grpc.StatusCode.DATA_LOSS and self._log_once(str(exc)):
            log.warning("%s: %s", method, exc, exc_info=exc)  # the cause chain: files and errors
        RPC_ERRORS.labels(method, exc.grpc_code.name).inc()
        await context.abort(exc.grpc_code, client_message(exc, self.registry.storage))

    def _unary(
        self, method: str, fn: Callable[[Any], Awaitable[T]]
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[T]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> T:
            RPCS.labels(method).inc()
            try:
                return await fn(request)
            except Exception as exc:  # noqa: BLE001 — mapped to a status in _abort
                await self._abort(method, context, exc)
                raise AssertionError("unreachable: abort raises") from exc

        return handle

    # --- control plane -------------------------------------------------------------------------
    async def get_dataset(self, request: pb.GetDatasetRequest) -> pb.DatasetInfo:
        return dataset_info(await asyncio.to_thread(self.planner.resolve, request.dataset))

    async def list_datasets(self, request: pb.ListDatasetsRequest) -> pb.ListDatasetsResponse:
        del request
        listing = await asyncio.to_thread(self.registry.listing)
        REGISTRY_BAD_ENTRIES.set(len(listing.bad))
        for bad in listing.bad:
            self._report(bad)
        return pb.ListDatasetsResponse(datasets=[dataset_info(m) for m in listing.manifests])

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
    async def read(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        RPCS.labels("Read").inc()
        STREAMS_ACTIVE.inc()
        pending = None
        try:
            # In a thread: planning reads manifests and may load a tokenizer or import a codec.
            plan = await asyncio.to_thread(self.planner.plan, request)
            if plan.nothing_left:  # still tell the client the epoch is over
                yield await asyncio.to_thread(self.builder.end_of_epoch, plan)
                return
            steps = MessageSteps(plan)

            def submit() -> tuple[asyncio.Future[tuple[bytes, int]], int]:
                chunk = steps.next()
                # Fetch the row groups of the next message(s) while this one is built (a guess: same size).
                self._read_ahead.schedule(plan, steps.ahead(self._read_ahead.messages))
                return asyncio.ensure_future(asyncio.to_thread(self.builder.build, plan, chunk)), len(chunk)

            pending = submit()
            while pending is not None:
                task, nsteps = pending
                data, nrows = await task
                steps.record(nsteps, nrows, len(data))  # size the next messages toward max_message_bytes
                # Read ahead: build the next message while this one is being sent.
                pending = submit() if steps.remaining else None
                MESSAGES_SENT.inc()
                BATCHES_SENT.inc(nsteps)
                ROWS_SENT.inc(nrows)
                BYTES_SENT.inc(len(data))
                yield data
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 — mapped to a status in _abort
            await self._abort("Read", context, exc)
        finally:
            if pending is not None:  # the client went away mid-stream
                pending[0].cancel()
            STREAMS_ACTIVE.dec()


def dataset_info(m: Manifest) -> pb.DatasetInfo:
    """A manifest as GetDataset and ListDatasets answer it."""
    return pb.DatasetInfo(
        name=m.name,
        version=m.version,
        fingerprint=m.fingerprint,
        num_rows=m.num_rows,
        num_shards=len(m.shards),
        num_bytes=m.num_bytes,
        fields=[pb.Field(name=n, type=t) for n, t in m.fields],
        arrow_schema=m.schema.serialize().to_pybytes(),
    )
