"""The ShardStream servicer: proto in -> plan + reader -> framed Arrow out.

Handlers are thin: they validate the request into plan objects, run the blocking work (Parquet
reads, takes, IPC encoding) in worker threads, and stream the result with backpressure (grpc.aio
awaits each write). Every ShardstreamError leaves as its own gRPC status code (errors.py); anything
else is logged and leaves as INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np
import pyarrow as pa
from prometheus_client import Counter, Gauge, Histogram

from shardstream.errors import FailedPreconditionError, InternalError, InvalidArgumentError, ShardstreamError
from shardstream.framing import encode_batch, encode_read_response, ipc_bytes
from shardstream.manifest import DatasetRef, Manifest
from shardstream.mixture import MixtureOrder, MixturePlan, SourceInfo, parse_mixture
from shardstream.plan import DatasetOrder, ShuffleSpec, StepLayout
from shardstream.registry import Registry
from shardstream.v1 import shardstream_pb2 as pb

from .readahead import DEFAULT_READ_AHEAD_MESSAGES, ReadAhead
from .reader import DatasetReader, RowGroupCache
from .selection import check_mixture_columns, take_selection
from .transforms import Pipeline, build_pipeline

__all__ = ["SERVICE_NAME", "ShardStreamService"]

log = logging.getLogger(__name__)

SERVICE_NAME = "shardstream.v1.ShardStream"
DEFAULT_MAX_MESSAGE_BYTES = 2 << 20  # several small steps travel together up to ~2 MiB
MAX_STEPS_PER_MESSAGE = 4096
MAX_CACHED_ORDERS = 64
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
BATCH_BUILD_SECONDS = Histogram(
    "shardstream_batch_build_seconds",
    "Time to build one Read message (read, take, encode)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
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


@dataclass(frozen=True)
class _ReadPlan:
    readers: list[DatasetReader]  # one per source (one for a plain dataset)
    selector: DatasetOrder | MixtureOrder
    mixture: bool
    layout: StepLayout
    columns: list[str]
    rank: int
    epoch: int
    first_step: int
    end_step: int
    stride: int
    max_message_bytes: int
    seed: int = 0
    pipeline: Pipeline | None = None


class ShardStreamService:
    def __init__(
        self,
        registry: Registry,
        cache: RowGroupCache,
        *,
        read_ahead: int = DEFAULT_READ_AHEAD_MESSAGES,
        transform_threads: int = 1,
    ) -> None:
        self.registry = registry
        self._cache = cache
        self._read_ahead = ReadAhead(read_ahead, cache)
        # Per-sample transform work (Pillow, FFmpeg, the tokenizer release the GIL) runs here, apart
        # from the threads that build messages, so a message's samples decode on every core.
        self.transform_threads = max(1, transform_threads)
        self._transform_pool = (
            ThreadPoolExecutor(self.transform_threads, thread_name_prefix="transform")
            if self.transform_threads > 1
            else None
        )
        self._readers: dict[tuple[str, int], DatasetReader] = {}
        self._readers_lock = threading.Lock()
        # Epoch orders are shared by every stream of the same (dataset, seed, shuffle).
        self._orders: OrderedDict[tuple[str, int, ShuffleSpec], DatasetOrder] = OrderedDict()

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

    @staticmethod
    async def _abort(method: str, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        if not isinstance(exc, ShardstreamError):
            log.exception("%s failed unexpectedly", method, exc_info=exc)
            exc = InternalError(f"internal error: {type(exc).__name__}: {exc}")
        RPC_ERRORS.labels(method, exc.grpc_code.name).inc()
        await context.abort(exc.grpc_code, str(exc))

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

    def _reader(self, manifest: Manifest) -> DatasetReader:
        key = (manifest.name, manifest.version)
        with self._readers_lock:
            r = self._readers.get(key)
            if r is None or r.manifest.fingerprint != manifest.fingerprint:
                paths = [self.registry.shard_path(manifest, s.uri) for s in manifest.shards]
                r = self._readers[key] = DatasetReader(manifest, paths, self._cache)
            return r

    async def _resolve(self, dataset: str) -> Manifest:
        ref = DatasetRef.parse(dataset)
        if ref.version is not None:
            with self._readers_lock:
                cached = self._readers.get((ref.name, ref.version))
            if cached is not None:
                return cached.manifest
        return await asyncio.to_thread(self.registry.resolve, ref)

    # --- control plane -------------------------------------------------------------------------
    async def get_dataset(self, request: pb.GetDatasetRequest) -> pb.DatasetInfo:
        return dataset_info(await self._resolve(request.dataset))

    async def list_datasets(self, request: pb.ListDatasetsRequest) -> pb.ListDatasetsResponse:
        del request

        def scan() -> list[Manifest]:
            return [self.registry.resolve(name) for name in self.registry.names()]

        return pb.ListDatasetsResponse(datasets=[dataset_info(m) for m in await asyncio.to_thread(scan)])

    # --- data plane ----------------------------------------------------------------------------
    def _order(self, reader: DatasetReader, seed: int, spec: ShuffleSpec) -> DatasetOrder:
        key = (reader.manifest.fingerprint, seed, spec)
        with self._readers_lock:
            order = self._orders.get(key)
            if order is None:
                order = self._orders[key] = DatasetOrder(key[0], reader.locator.block_sizes, seed, spec)
                while len(self._orders) > MAX_CACHED_ORDERS:
                    self._orders.popitem(last=False)
            self._orders.move_to_end(key)
            return order

    async def _pinned(self, dataset: str, fingerprint: str) -> Manifest:
        manifest = await self._resolve(dataset)
        if fingerprint and fingerprint != manifest.fingerprint:
            raise FailedPreconditionError(
                f"{manifest.ref} has fingerprint {manifest.fingerprint[:12]}…, the request pins "
                f"{fingerprint[:12]}…: the dataset changed under this job"
            )
        return manifest

    async def _plan(self, req: pb.ReadRequest) -> _ReadPlan:
        if req.world_size < 1 or req.rank >= req.world_size:
            raise InvalidArgumentError(
                f"rank must be in [0, world_size), got rank={req.rank}, world_size={req.world_size}"
            )
        spec = ShuffleSpec.parse(req.shuffle.mode or "none", req.shuffle.window or None)
        selector: DatasetOrder | MixtureOrder
        if req.mixture:
            weights = parse_mixture([(s.dataset, s.weight) for s in req.mixture])
            manifests = [await self._pinned(s.dataset, s.fingerprint) for s in req.mixture]
            readers = [self._reader(m) for m in manifests]
            plan = MixturePlan(
                [
                    SourceInfo(m.ref, m.fingerprint, m.num_rows, w)
                    for m, (_, w) in zip(manifests, weights, strict=True)
                ],
                req.seed,
                req.mixture_block,
                req.mixture_epoch_samples,
            )
            selector = MixtureOrder(plan, [self._order(r, req.seed, spec) for r in readers])
            columns = check_mixture_columns(readers, list(req.columns))
        else:
            manifest = await self._pinned(req.dataset, req.fingerprint)
            readers = [self._reader(manifest)]
            selector = self._order(readers[0], req.seed, spec)
            columns = readers[0].check_columns(list(req.columns))
        pipeline = None
        if req.transforms or req.on_error:
            first = readers[0]
            schema = pa.schema([first.manifest.schema.field(c) for c in columns])

            def describe(source: int, shard: int, row: int) -> str:
                m = readers[source].manifest
                return f"{m.ref} shard {shard} ({m.shards[shard].uri}) row {row}"

            # In a thread: building may load a tokenizer or import a codec library (the loop never waits).
            pipeline = await asyncio.to_thread(
                build_pipeline, list(req.transforms), req.on_error, schema, describe
            )
        layout = StepLayout(
            selector.num_rows, req.start_offset, req.world_size, req.batch_size, req.drop_last
        )
        if req.first_step > layout.num_steps:
            raise InvalidArgumentError(
                f"first_step {req.first_step} is past the epoch's {layout.num_steps} steps"
            )
        end = (
            layout.num_steps if req.num_steps == 0 else min(layout.num_steps, req.first_step + req.num_steps)
        )
        return _ReadPlan(
            readers=readers,
            selector=selector,
            mixture=bool(req.mixture),
            layout=layout,
            columns=columns,
            rank=req.rank,
            epoch=req.epoch,
            first_step=req.first_step,
            end_step=end,
            stride=max(1, req.step_stride),
            max_message_bytes=req.max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES,
            seed=req.seed,
            pipeline=pipeline,
        )

    def _build(self, plan: _ReadPlan, steps: range) -> tuple[bytes, int]:
        t0 = time.perf_counter()
        header = pb.ReadHeader(epoch=plan.epoch)
        ranges = []
        for step in steps:
            gs, ge = plan.layout.global_range(step)
            ps, pe = plan.layout.rank_range(step, plan.rank)
            header.steps.add(
                step=step, position_start=ps, position_end=pe, global_start=gs, global_end=ge, rows=pe - ps
            )
            ranges.append(np.arange(ps, pe, dtype=np.int64))
        if steps and plan.end_step == plan.layout.num_steps and steps[-1] + plan.stride >= plan.end_step:
            header.end_of_epoch = True
            header.dropped = plan.layout.dropped
        positions = np.concatenate(ranges) if ranges else np.empty(0, np.int64)
        src, rows = plan.selector.select(plan.epoch, positions)
        batch = take_selection(plan.readers, src, rows, plan.columns, mixture=plan.mixture)
        if plan.pipeline:
            batch = self._transform(plan, header, batch, positions)
        data = encode_batch(header, batch)  # the IPC stream written straight into the message
        BATCH_BUILD_SECONDS.observe(time.perf_counter() - t0)
        return data, batch.num_rows

    def _transform(
        self, plan: _ReadPlan, header: pb.ReadHeader, batch: pa.RecordBatch, positions: np.ndarray
    ) -> pa.RecordBatch:
        """Run the request's transforms over a message's rows; set each step's rows and skips."""
        assert plan.pipeline is not None
        step_ids = [st.step for st in header.steps]
        steps = np.repeat(np.array(step_ids, np.int64), [st.rows for st in header.steps])
        out, per_step = plan.pipeline.apply(
            batch,
            seed=plan.seed,
            epoch=plan.epoch,
            positions=positions,
            steps=steps,
            step_ids=step_ids,
            pool=self._transform_pool,
            threads=self.transform_threads,
        )
        for st, res in zip(header.steps, per_step, strict=True):
            st.rows = res.rows
            st.skipped.extend(res.skipped)
        return out

    async def read(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        RPCS.labels("Read").inc()
        STREAMS_ACTIVE.inc()
        pending = None
        try:
            plan = await self._plan(request)
            if plan.first_step >= plan.end_step and plan.end_step == plan.layout.num_steps:
                # Nothing left: still tell the client the epoch is over.
                header = pb.ReadHeader(epoch=plan.epoch, end_of_epoch=True, dropped=plan.layout.dropped)
                none = np.empty(0, np.int64)
                empty = take_selection(plan.readers, none, none, plan.columns, mixture=plan.mixture)
                if plan.pipeline:
                    empty = self._transform(plan, header, empty, none)
                yield encode_read_response(header, ipc_bytes(empty))
                return
            step, per_message = plan.first_step, 1  # one step first, for a quick first batch

            def submit() -> tuple[asyncio.Future[tuple[bytes, int]], int]:
                nonlocal step
                chunk = range(step, min(plan.end_step, step + per_message * plan.stride), plan.stride)
                step = chunk[-1] + plan.stride
                # Fetch the row groups of the next message(s) while this one is built (a guess: same size).
                ahead = per_message * self._read_ahead.messages * plan.stride
                self._read_ahead.schedule(plan, range(step, min(plan.end_step, step + ahead), plan.stride))
                return asyncio.ensure_future(asyncio.to_thread(self._build, plan, chunk)), len(chunk)

            pending = submit()
            while pending is not None:
                task, nsteps = pending
                data, nrows = await task
                if nrows:  # size the next messages toward max_message_bytes
                    per_message = max(
                        1, min(MAX_STEPS_PER_MESSAGE, plan.max_message_bytes * nsteps // len(data))
                    )
                # Read ahead: build the next message while this one is being sent.
                pending = submit() if step < plan.end_step else None
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
