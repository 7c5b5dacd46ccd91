"""The prefetch thread of a Loader: streams, failover, decode, handed over a bounded queue.

One `_Producer` per iteration of a Loader. It streams the rank's steps epoch by epoch, reconnecting
(to the next endpoint) at the first step it lacks when a stream breaks, a server is unavailable or
a stream goes silent, with jittered exponential backoff within a retry budget that progress resets.
Decoded batches (and any exception, wrapped) go to the consumer through a bounded queue.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import pyarrow as pa

from shardstream.errors import DataLossError, UnavailableError, from_grpc_error
from shardstream.framing import read_ipc
from shardstream.plan import StepLayout
from shardstream.v1 import shardstream_pb2 as pb

from . import metrics
from .convert import splitter
from .striped import stream_epoch_striped

if TYPE_CHECKING:
    from .loader import Loader

__all__ = ["BatchInfo", "SkippedSample"]

log = logging.getLogger("shardstream.client")

DEFAULT_BACKOFF_BASE_S = 0.05
DEFAULT_BACKOFF_MAX_S = 2.0
PROVENANCE = ("_shard", "_row", "_source")
_POLL_S = 0.1
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,  # a draining server cancels its streams
    grpc.StatusCode.UNKNOWN,  # a connection cut mid-stream
}


@dataclass(frozen=True)
class BatchInfo:
    """Where a batch came from: epoch, global positions, and each row's (source,) shard and row."""

    epoch: int
    step: int  # global step index in the epoch, counted from the stream's start offset
    position_start: int  # this rank's global positions [position_start, position_end)
    position_end: int
    global_start: int  # the global step's positions over all ranks
    global_end: int
    shards: np.ndarray  # int32 index into the manifest's shard list, per row
    rows: np.ndarray  # int64 row within the shard, per row
    sources: np.ndarray | None = None  # int32 index into the mixture's sources (mixtures only)
    # Samples of this step a server-side transform could not process (on_error="skip"): left out.
    skipped: tuple[SkippedSample, ...] = ()


@dataclass(frozen=True)
class SkippedSample:
    """A sample left out of a batch because a transform could not process it (on_error="skip")."""

    position: int  # global position in the epoch's order
    shard: int
    row: int
    source: int | None  # mixture source index (mixtures only)
    reason: str


@dataclass
class _Item:
    epoch: int
    next_epoch: int  # the cursor once this item is handed over
    next_offset: int
    dropped: int = 0
    batch: Any = None
    info: BatchInfo | None = None


class _Done:
    pass


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Producer:
    """The background thread: streams, failover, decode; hands results over a bounded queue."""

    def __init__(self, loader: Loader, epoch: int, offset: int) -> None:
        self._ld = loader
        self._queue: queue.Queue[_Item | _Done | _Failed] = queue.Queue(maxsize=loader.prefetch)
        self._stop = threading.Event()
        self._calls: set[Any] = set()  # the gRPC calls in progress (several when striped)
        self._call_lock = threading.Lock()
        self._waiting_since: float | None = None  # when the thread began waiting for a message
        self._endpoint = loader.rank % len(loader.endpoints)
        self._thread = threading.Thread(
            target=self._run, args=(epoch, offset), name=f"shardstream-prefetch-r{loader.rank}", daemon=True
        )
        self._thread.start()

    def get(self) -> _Item | _Done:
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the shardstream prefetch thread died without a result") from None
                self._check_idle()
                continue
            if isinstance(item, _Failed):
                raise item.exc
            return item

    def _watched(self, call: Any) -> Iterator[Any]:
        """The call's messages, noting when the thread waits on the network (see _check_idle)."""
        it = iter(call)
        while True:
            self._waiting_since = time.monotonic()
            try:
                msg = next(it)
            except StopIteration:
                return
            finally:
                self._waiting_since = None
            yield msg

    def _check_idle(self) -> None:
        """A server that keeps the connection alive but sends nothing: give up on it, fail over."""
        since = self._waiting_since
        if since is not None and time.monotonic() - since > self._ld.stream_idle_timeout_s:
            self._waiting_since = None
            log.warning(
                "no data from the server for %.0f s: switching endpoints", self._ld.stream_idle_timeout_s
            )
            self._cancel_calls()

    def _cancel_calls(self) -> None:
        with self._call_lock:
            for call in self._calls:
                call.cancel()

    def open_call(self, endpoint: str, request: pb.ReadRequest) -> Any:
        """Start a Read call, tracked so that stop() and the idle check can cancel it."""
        call = self._ld._conn(endpoint).read(request)
        with self._call_lock:
            self._calls.add(call)
        if self._stop.is_set():
            call.cancel()
        return call

    def close_call(self, call: Any) -> None:
        with self._call_lock:
            self._calls.discard(call)

    def stop(self) -> None:
        self._stop.set()
        self._cancel_calls()
        self._thread.join(timeout=30)

    def _put(self, item: _Item | _Done | _Failed) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, epoch: int, offset: int) -> None:
        try:
            ld = self._ld
            stream_epoch = self._stream_epoch if ld.streams == 1 else partial(stream_epoch_striped, self)
            while ld.epochs is None or epoch < ld.epochs:
                if not stream_epoch(epoch, offset):
                    return
                epoch, offset = epoch + 1, ld._epoch_start_offset()
            self._put(_Done())
        except BaseException as exc:  # handed to the consumer, never swallowed here
            self._put(_Failed(exc))

    def request(self, epoch: int, offset: int, first_step: int, step_stride: int) -> pb.ReadRequest:
        ld = self._ld
        request = pb.ReadRequest(
            seed=ld.seed,
            epoch=epoch,
            shuffle=pb.Shuffle(mode=ld.shuffle.mode, window=ld.shuffle.window),
            start_offset=offset,
            rank=ld.rank,
            world_size=ld.world_size,
            batch_size=ld.batch_size,
            first_step=first_step,
            step_stride=step_stride,
            drop_last=ld.drop_last,
            columns=ld.columns or [],
            max_message_bytes=ld.max_message_bytes,
            transforms=ld.transforms,
            on_error=ld.on_error if ld.transforms else "",
        )
        ld.target.fill(request)
        return request

    def _stream_epoch(self, epoch: int, offset: int) -> bool:
        """Stream one epoch from `offset`; False when stopped."""
        ld = self._ld
        layout = StepLayout(ld.target.num_rows, offset, ld.world_size, ld.batch_size, ld.drop_last)
        stride = ld._stride[1]
        next_step = 0
        failures = 0
        last_error: BaseException | None = None
        while True:
            endpoint = ld.endpoints[self._endpoint]
            request = self.request(epoch, offset, next_step, stride)
            ended = False
            call = None
            try:
                call = self.open_call(endpoint, request)
                for header, payload in self._watched(call):
                    progressed, ended = self._deliver(epoch, layout, next_step, header, payload)
                    if progressed is None:
                        return False
                    if progressed:
                        next_step += progressed * stride
                        failures = 0  # progress resets the retry budget
                    if ended:
                        break
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return False
                if exc.code() not in _RETRYABLE:
                    raise from_grpc_error(exc, target=endpoint) from exc
                last_error = from_grpc_error(exc, target=endpoint)
            finally:
                if call is not None:
                    self.close_call(call)
            if ended:
                return True
            if self._stop.is_set():
                return False
            # Broken stream or unavailable server: resume elsewhere at the first missing step.
            failures += 1
            metrics.RETRIES.inc()
            if failures > ld.max_retries:
                raise UnavailableError(
                    f"gave up on {ld.pinned} epoch {epoch} at step {next_step} after {ld.max_retries} retries "
                    f"over {', '.join(ld.endpoints)} (last error: {last_error or 'stream ended early'})"
                )
            if len(ld.endpoints) > 1:
                metrics.FAILOVERS.inc()
            self._endpoint = (self._endpoint + 1) % len(ld.endpoints)
            backoff = min(DEFAULT_BACKOFF_MAX_S, DEFAULT_BACKOFF_BASE_S * 2 ** (failures - 1))
            if self._stop.wait(random.uniform(0, backoff)):  # full jitter
                return False

    def _deliver(
        self, epoch: int, layout: StepLayout, next_step: int, header: pb.ReadHeader, payload: pa.Buffer
    ) -> tuple[int | None, bool]:
        """Queue the steps of one message; (steps queued or None when stopped, end of epoch)."""
        for item in self.decode(epoch, layout, next_step, self._ld._stride[1], header, payload):
            if not self._put(item):
                return None, False
        return len(header.steps), header.end_of_epoch

    def decode(
        self,
        epoch: int,
        layout: StepLayout,
        first_step: int,
        step_stride: int,
        header: pb.ReadHeader,
        payload: pa.Buffer,
    ) -> Iterator[_Item]:
        """The items of one message whose steps must be first_step, first_step + step_stride, ...

        A generator: each step is made just before it is queued, so the prefetch thread never
        holds the GIL for a whole message of small steps while the training loop waits for it."""
        ld = self._ld
        stride = ld._stride[1]  # this loader's step stride (data-loader workers), not the stream's
        if header.epoch != epoch:
            raise DataLossError(f"server sent epoch {header.epoch}, expected {epoch}")
        metrics.BYTES.inc(payload.size)
        batch = read_ipc(payload)
        covered = sum(st.rows for st in header.steps)
        if covered != batch.num_rows:
            raise DataLossError(f"message has {batch.num_rows} rows, its steps cover {covered}")
        # Per message, not per step: provenance as numpy, columns converted once and sliced per step.
        names = batch.schema.names
        prov = {c: batch.column(c).to_numpy() for c in PROVENANCE if c in names}
        if not ld.provenance:
            batch = batch.drop_columns([c for c in PROVENANCE if c in names])
        split = splitter(batch, ld.output)
        row = 0
        for i, st in enumerate(header.steps):
            if st.step != first_step + i * step_stride:
                raise DataLossError(
                    f"server sent step {st.step}, expected {first_step + i * step_stride} (epoch {epoch})"
                )
            n = st.rows
            end = row + n
            info = BatchInfo(
                epoch=epoch,
                step=st.step,
                position_start=st.position_start,
                position_end=st.position_end,
                global_start=st.global_start,
                global_end=st.global_end,
                shards=prov["_shard"][row:end],
                rows=prov["_row"][row:end],
                sources=prov["_source"][row:end] if "_source" in prov else None,
                skipped=tuple(
                    SkippedSample(
                        s.position, s.shard, s.row, s.source if "_source" in prov else None, s.reason
                    )
                    for s in st.skipped
                ),
            )
            out = split(row, n)
            row = end
            if ld.pin_memory:
                out = {k: v.pin_memory() if hasattr(v, "pin_memory") else v for k, v in out.items()}
            last = st.step + stride >= layout.num_steps  # this loader's last step of the epoch
            if last and not (header.end_of_epoch and i == len(header.steps) - 1):
                raise DataLossError(f"step {st.step} ends epoch {epoch} but the server's stream goes on")
            if last:
                nxt = (epoch + 1, ld._epoch_start_offset())
            else:  # this loader's next step (the next global step unless workers split the stream)
                nxt = (epoch, layout.global_range(st.step + stride)[0])
            yield _Item(epoch, *nxt, header.dropped if last else 0, out, info)
        if header.end_of_epoch and not header.steps:
            yield _Item(epoch, epoch + 1, ld._epoch_start_offset(), header.dropped)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
