"""`Loader`: one rank's stream of batches from a shardstream fleet, resumable to the sample.

    with Loader(["10.0.0.5:7070"], "web@3", batch_size=32, rank=r, world_size=W, seed=0) as loader:
        for batch in loader:            # dict of numpy arrays (output="numpy"), tensors or Arrow
            train_step(batch)
            if step % 1000 == 0:
                save(model, loader.state_dict())

A background thread keeps a bounded queue of decoded batches full; the cursor advances only when a
batch is handed to the caller, so prefetched batches are never lost on restart. When a stream
breaks or a server is unavailable, the thread reconnects — to the next endpoint — at the first step
it has not received, with jittered exponential backoff, within a retry budget that progress resets.
"""

from __future__ import annotations

import queue
import random
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pyarrow as pa

from shardstream.errors import (
    DataLossError,
    InvalidArgumentError,
    ShardstreamError,
    UnavailableError,
    from_grpc_error,
)
from shardstream.framing import read_ipc
from shardstream.manifest import DatasetRef
from shardstream.plan import StepLayout, parse_shuffle
from shardstream.v1 import shardstream_pb2 as pb

from .channel import Connection, normalize_endpoints
from .convert import to_numpy, to_torch
from .state import LoaderState

__all__ = ["BatchInfo", "Loader"]

DEFAULT_PREFETCH_BATCHES = 8
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_RETRIES = 6
DEFAULT_BACKOFF_BASE_S = 0.05
DEFAULT_BACKOFF_MAX_S = 2.0
OUTPUTS = ("numpy", "torch", "arrow")
PROVENANCE = ("_shard", "_row")
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
    """Where a batch came from: epoch, global positions, and each row's shard and row."""

    epoch: int
    step: int  # global step index in the epoch, counted from the stream's start offset
    position_start: int  # this rank's global positions [position_start, position_end)
    position_end: int
    global_start: int  # the global step's positions over all ranks
    global_end: int
    shards: np.ndarray  # int32 index into the manifest's shard list, per row
    rows: np.ndarray  # int64 row within the shard, per row


@dataclass
class _Item:
    epoch: int
    global_end: int
    last_of_epoch: bool
    dropped: int = 0
    batch: Any = None
    info: BatchInfo | None = None


class _Done:
    pass


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Loader:
    """Iterable of one rank's batches. See the module docstring."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        dataset: str,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool | str = True,
        columns: Sequence[str] | None = None,
        epochs: int | None = 1,
        drop_last: bool = False,
        output: str = "numpy",
        provenance: bool = False,
        prefetch: int = DEFAULT_PREFETCH_BATCHES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_message_bytes: int = 0,
    ) -> None:
        # Everything is validated before any network call.
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("world_size", world_size, 1),
            ("seed", seed, 0),
            ("prefetch", prefetch, 1),
            ("max_retries", max_retries, 0),
            ("max_message_bytes", max_message_bytes, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"{name} must be an integer >= {low}, got {value!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise InvalidArgumentError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
            raise InvalidArgumentError(f"epochs must be None (endless) or an integer >= 1, got {epochs!r}")
        if output not in OUTPUTS:
            raise InvalidArgumentError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if output == "torch":
            try:
                import torch  # noqa: F401
            except ImportError as exc:
                raise InvalidArgumentError(
                    "output='torch' needs torch installed (pip install torch)"
                ) from exc
        if columns is not None:
            if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
                raise InvalidArgumentError(f"columns must be a list of column names, got {columns!r}")
            if len(set(columns)) != len(columns):
                raise InvalidArgumentError(f"columns listed twice: {list(columns)}")
        if not timeout_s > 0:
            raise InvalidArgumentError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.endpoints = normalize_endpoints(endpoints)
        self.dataset = str(DatasetRef.parse(dataset))
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = parse_shuffle(shuffle)
        self.columns = list(columns) if columns is not None else None
        self.epochs = epochs
        self.drop_last = drop_last
        self.output = output
        self.provenance = provenance
        self.prefetch = prefetch
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_message_bytes = max_message_bytes

        self._conns: dict[str, Connection] = {}
        self._info: pb.DatasetInfo | None = None
        self._epoch = 0
        self._offset = 0
        self._steps = 0
        self._active = False
        self._closed = False
        self.last_batch: BatchInfo | None = None
        self.dropped: dict[int, int] = {}  # epoch -> samples dropped by drop_last

    # --- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def __del__(self) -> None:
        if getattr(self, "_conns", None):
            warnings.warn(
                f"unclosed {self!r}: call close() or use it as a context manager",
                ResourceWarning,
                stacklevel=1,
            )
            self.close()

    def __repr__(self) -> str:
        return f"Loader({self.dataset!r}, rank={self.rank}/{self.world_size}, batch_size={self.batch_size})"

    def _conn(self, target: str) -> Connection:
        if self._closed:
            raise RuntimeError("this Loader is closed")
        conn = self._conns.get(target)
        if conn is None:
            conn = self._conns[target] = Connection(target)
        return conn

    # --- dataset -------------------------------------------------------------------------------
    @property
    def info(self) -> pb.DatasetInfo:
        """The dataset version this loader reads, resolved once and then pinned."""
        if self._info is None:
            last: ShardstreamError | None = None
            for i in range(len(self.endpoints)):
                target = self.endpoints[(self.rank + i) % len(self.endpoints)]
                try:
                    info = self._conn(target).get_dataset(self.dataset, self.timeout_s)
                    break
                except UnavailableError as exc:
                    last = exc
            else:
                raise UnavailableError(
                    f"no shardstream server reachable at {', '.join(self.endpoints)} within {self.timeout_s:g} s "
                    f"(last error: {last})"
                )
            if self.columns is not None:
                names = [f.name for f in info.fields]
                unknown = [c for c in self.columns if c not in names]
                if unknown:
                    raise InvalidArgumentError(
                        f"unknown column(s) {', '.join(map(repr, unknown))} in {info.name}@{info.version}; "
                        f"columns are: {', '.join(names)}"
                    )
            self._info = info
        return self._info

    @property
    def pinned(self) -> str:
        return f"{self.info.name}@{self.info.version}"

    def steps_per_epoch(self, offset: int = 0) -> int:
        """Steps this loader takes in an epoch started at `offset`."""
        return StepLayout(
            self.info.num_rows, offset, self.world_size, self.batch_size, self.drop_last
        ).num_steps

    # --- state ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def offset(self) -> int:
        return self._offset

    def state_dict(self) -> dict[str, Any]:
        info = self.info
        return LoaderState(
            dataset=f"{info.name}@{info.version}",
            fingerprint=info.fingerprint,
            seed=self.seed,
            shuffle=self.shuffle,
            epoch=self._epoch,
            offset=self._offset,
            world_size=self.world_size,
            batch_size=self.batch_size,
            steps=self._steps,
        ).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self._active:
            raise RuntimeError("load_state_dict() while iterating: load the state before the loop starts")
        st = LoaderState.from_dict(state)
        info = self.info
        st.check_compatible(
            dataset=f"{info.name}@{info.version}",
            fingerprint=info.fingerprint,
            seed=self.seed,
            shuffle=self.shuffle,
            num_rows=info.num_rows,
        )
        self._epoch, self._offset, self._steps = st.epoch, st.offset, st.steps

    # --- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._active:
            raise RuntimeError("this Loader is already being iterated")
        info = self.info
        if self.epochs is None and self.steps_per_epoch() == 0:
            raise InvalidArgumentError(
                f"{self.pinned} has {info.num_rows} rows: an epoch of world_size*batch_size="
                f"{self.world_size * self.batch_size} has no steps{' with drop_last' if self.drop_last else ''}, "
                "so an endless stream would never yield"
            )
        return self._iterate()

    def _iterate(self) -> Iterator[Any]:
        self._active = True
        producer = _Producer(self, self._epoch, self._offset)
        try:
            while True:
                item = producer.get()
                if isinstance(item, _Done):
                    return
                if item.last_of_epoch:
                    self.dropped[item.epoch] = item.dropped
                    self._epoch, self._offset = item.epoch + 1, 0
                else:
                    self._epoch, self._offset = item.epoch, item.global_end
                if item.info is None:
                    continue  # an epoch with no steps
                self._steps += 1
                self.last_batch = item.info
                yield item.batch
        finally:
            producer.stop()
            self._active = False


class _Producer:
    """The background thread: streams, failover, decode; hands results over a bounded queue."""

    def __init__(self, loader: Loader, epoch: int, offset: int) -> None:
        self._ld = loader
        self._queue: queue.Queue[_Item | _Done | _Failed] = queue.Queue(maxsize=loader.prefetch)
        self._stop = threading.Event()
        self._call: Any = None
        self._call_lock = threading.Lock()
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
                continue
            if isinstance(item, _Failed):
                raise item.exc
            return item

    def stop(self) -> None:
        self._stop.set()
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()
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
            while ld.epochs is None or epoch < ld.epochs:
                if not self._stream_epoch(epoch, offset):
                    return
                epoch, offset = epoch + 1, 0
            self._put(_Done())
        except BaseException as exc:  # handed to the consumer, never swallowed here
            self._put(_Failed(exc))

    def _stream_epoch(self, epoch: int, offset: int) -> bool:
        """Stream one epoch from `offset`; False when stopped."""
        ld = self._ld
        info = ld.info
        layout = StepLayout(info.num_rows, offset, ld.world_size, ld.batch_size, ld.drop_last)
        next_step = 0
        failures = 0
        last_error: BaseException | None = None
        while True:
            target = ld.endpoints[self._endpoint]
            request = pb.ReadRequest(
                dataset=f"{info.name}@{info.version}",
                fingerprint=info.fingerprint,
                seed=ld.seed,
                epoch=epoch,
                shuffle=pb.Shuffle(mode=ld.shuffle),
                start_offset=offset,
                rank=ld.rank,
                world_size=ld.world_size,
                batch_size=ld.batch_size,
                first_step=next_step,
                drop_last=ld.drop_last,
                columns=ld.columns or [],
                max_message_bytes=ld.max_message_bytes,
            )
            ended = False
            try:
                call = ld._conn(target).read(request)
                with self._call_lock:
                    self._call = call
                if self._stop.is_set():
                    call.cancel()
                for header, payload in call:
                    progressed, ended = self._deliver(epoch, layout, next_step, header, payload)
                    if progressed is None:
                        return False
                    if progressed:
                        next_step += progressed
                        failures = 0  # progress resets the retry budget
                    if ended:
                        break
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return False
                if exc.code() not in _RETRYABLE:
                    raise from_grpc_error(exc, target=target) from exc
                last_error = from_grpc_error(exc, target=target)
            finally:
                with self._call_lock:
                    self._call = None
            if ended:
                return True
            if self._stop.is_set():
                return False
            # Broken stream or unavailable server: resume elsewhere at the first missing step.
            failures += 1
            if failures > ld.max_retries:
                raise UnavailableError(
                    f"gave up on {ld.pinned} epoch {epoch} at step {next_step} after {ld.max_retries} retries "
                    f"over {', '.join(ld.endpoints)} (last error: {last_error or 'stream ended early'})"
                )
            self._endpoint = (self._endpoint + 1) % len(ld.endpoints)
            backoff = min(DEFAULT_BACKOFF_MAX_S, DEFAULT_BACKOFF_BASE_S * 2 ** (failures - 1))
            if self._stop.wait(random.uniform(0, backoff)):  # full jitter
                return False

    def _deliver(
        self, epoch: int, layout: StepLayout, next_step: int, header: pb.ReadHeader, payload: pa.Buffer
    ) -> tuple[int | None, bool]:
        """Queue the steps of one message; (steps queued or None when stopped, end of epoch)."""
        ld = self._ld
        if header.epoch != epoch:
            raise DataLossError(f"server sent epoch {header.epoch}, expected {epoch}")
        batch = read_ipc(payload)
        row = 0
        for i, st in enumerate(header.steps):
            if st.step != next_step + i:
                raise DataLossError(f"server sent step {st.step}, expected {next_step + i} (epoch {epoch})")
            n = st.position_end - st.position_start
            part = batch.slice(row, n)
            row += n
            info = BatchInfo(
                epoch=epoch,
                step=st.step,
                position_start=st.position_start,
                position_end=st.position_end,
                global_start=st.global_start,
                global_end=st.global_end,
                shards=part.column("_shard").to_numpy(),
                rows=part.column("_row").to_numpy(),
            )
            if not ld.provenance:
                part = part.drop_columns(list(PROVENANCE))
            last = header.end_of_epoch and i == len(header.steps) - 1
            item = _Item(
                epoch, st.global_end, last, header.dropped if last else 0, _convert(part, ld.output), info
            )
            if not self._put(item):
                return None, False
        if row != batch.num_rows:
            raise DataLossError(f"message has {batch.num_rows} rows, its steps cover {row}")
        if header.end_of_epoch and not header.steps:
            if not self._put(_Item(epoch, layout.num_rows, True, header.dropped)):
                return None, False
        return len(header.steps), header.end_of_epoch


def _convert(batch: pa.RecordBatch, output: str) -> Any:
    if output == "arrow":
        return batch
    if output == "torch":
        return to_torch(batch)
    return to_numpy(batch)
