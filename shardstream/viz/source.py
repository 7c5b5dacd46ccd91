"""The one data source of both visualizers: one rank's batch at one step, exactly as the trainer gets it.

A step is read through shardstream servers with the client's public `StepReader`
(shardstream.client: a Loader's options and read spec, one stream session with its retries and
failover, the Loader's decoder) — starting at the step's global offset `step * world_size * batch_size` (or, for a job's step, where the job's
cursor walks to: `place()`), which is where a Loader whose state says that offset starts
(`loader_state()` returns that state, `StepReader.state`). Only that one step is asked for
(`num_steps = 1`): looking at step 12,345 reads step 12,345, not the epoch before it. Nothing is
decoded differently for display; the panes draw the arrays the trainer would get.

`DataSource.open(server=..., root=...)` dials a fleet, or starts a server of its own over a registry
root (`shardstream serve` in a subprocess, as `LocalServer` runs it) and stops it on close. A fleet
with TLS or `--auth` is dialled with the Loader's `tls` and `token` options (`security`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from shardstream.client import BatchInfo, ChannelSecurity, StepReader, Target, TlsOption, as_numpy
from shardstream.errors import InvalidArgumentError
from shardstream.order.explain import Cursor, place_step
from shardstream.order.read_order import StepLayout
from shardstream.registry import Registry
from shardstream.v1 import shardstream_pb2 as pb

from .query import StepQuery

__all__ = ["DEFAULT_TIMEOUT_S", "DataSource", "Placed", "StepBatch"]

DEFAULT_TIMEOUT_S = 30.0
READ_DEADLINE_S = 300.0  # one step of large samples (64 videos) may take a while on a busy server
CACHED_STEPS = 8  # a page's media requests reuse the step its page read


@dataclass(frozen=True)
class Placed:
    """Where a query's step is: its epoch, the global offset it starts at, the epoch's last step."""

    epoch: int
    start: int
    last: int  # the number of the epoch's last step (in the job's numbering for a job's step)


@dataclass(frozen=True)
class StepBatch:
    """One rank's batch at one step, as received (Arrow, with the provenance columns kept)."""

    query: StepQuery
    target: Target
    steps_in_epoch: int
    batch: pa.RecordBatch
    info: BatchInfo  # step renumbered from the request's offset to the epoch's step index

    @cached_property
    def arrays(self) -> dict[str, np.ndarray]:
        """What `Loader(output="numpy")` hands over: the data columns as numpy arrays."""
        return as_numpy(self.batch)

    @property
    def num_rows(self) -> int:
        return self.batch.num_rows

    def source_label(self, row: int) -> str:
        """name@version the row came from (a mixture's source)."""
        sources = self.target.sources
        k = 0 if self.info.sources is None else int(self.info.sources[row])
        return f"{sources[k].name}@{sources[k].version}"

    def position(self, row: int) -> int | None:
        """The row's global position in the epoch, where rows are samples (no reshaping transform)."""
        info = self.info
        if self.num_rows != info.position_end - info.position_start or info.skipped:
            return None
        return info.position_start + row


class DataSource:
    """Steps of any (dataset, seed, shuffle, world size, batch size, rank, epoch) from a fleet."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        registry: Registry | None = None,
        metrics_urls: Sequence[str] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        owned: Any = None,
        security: ChannelSecurity | None = None,
        tls: TlsOption = None,
    ) -> None:
        self.security = security or ChannelSecurity()
        self._reader = StepReader(list(endpoints), security=self.security, timeout_s=timeout_s, read_deadline_s=READ_DEADLINE_S)
        self.endpoints = self._reader.endpoints
        self.tls = tls  # the Loader's tls= as given (file paths), for the scripts the pages show
        self.registry = registry  # manifests: history, diffs, shard names, shuffle stats (optional)
        self.metrics_urls = list(metrics_urls)  # the servers' /metrics (the fleet page)
        self.timeout_s = timeout_s
        self._owned = owned  # an embedded LocalServer, stopped on close
        self._cache: OrderedDict[StepQuery, StepBatch] = OrderedDict()
        self._lock = threading.Lock()
        self._inflight: dict[StepQuery, threading.Lock] = {}

    @classmethod
    def open(
        cls,
        *,
        server: str | None,
        root: str | None,
        registry: Registry | None = None,
        metrics: Sequence[str] = (),
        tls: TlsOption = None,
        token: str | None = None,
    ) -> DataSource:
        """Dial `server` ('host:port[,host:port]', with `tls` and `token` as a Loader takes them), or
        start a server over `root` and dial it."""
        if server:
            security = ChannelSecurity.from_options(tls, token)
            return cls(server.split(","), registry=registry, metrics_urls=metrics, security=security, tls=tls)
        if not root:
            raise InvalidArgumentError("give --server HOST:PORT (a running fleet) or --root (a registry to serve)")
        from shardstream.server.local_fleet import LocalServer

        local = LocalServer(root, metrics=True).start()
        return cls(
            [local.target],
            registry=registry,
            metrics_urls=[f"http://127.0.0.1:{local.metrics_port}/metrics", *metrics],
            owned=local,
        )

    def __enter__(self) -> DataSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._reader.close()
        if self._owned is not None:
            self._owned.stop()
            self._owned = None
        if self.registry is not None:
            self.registry.close()

    # --- what there is ---------------------------------------------------------------------------
    def list_datasets(self) -> list[pb.DatasetInfo]:
        """Each dataset's latest version, as the fleet lists it."""
        return self._reader.list_datasets()

    def dataset_info(self, ref: str) -> pb.DatasetInfo:
        return self._reader.dataset_info(ref)

    def target(self, query: StepQuery) -> Target:
        """The pinned dataset version or mixture the query reads (resolved once)."""
        return self._reader.target(query.dataset, columns=list(query.column_list) or None, seed=query.seed)

    def place(self, query: StepQuery) -> Placed:
        """Where the query's step is: its epoch, the offset it starts at and the epoch's last step
        (a job's step from its cursor, as `explain --job` walks it: shardstream/order/explain.py)."""
        num_rows = self.target(query).num_rows
        anchor = query.job_cursor
        if anchor is None:
            layout = StepLayout(num_rows, 0, query.world_size, query.batch_size, query.drop_last)
            if query.step >= layout.num_steps:
                raise InvalidArgumentError(
                    f"step {query.step} is past the end of the epoch: {self.target(query).label} has "
                    f"{layout.num_steps} steps of {query.world_size} x {query.batch_size} samples (0..{layout.num_steps - 1})"
                )
            return Placed(query.epoch, query.offset, layout.num_steps - 1)
        steps, epoch, offset = anchor
        cursor = Cursor(epoch, offset, steps, query.world_size, query.batch_size, query.drop_last)
        at = place_step(num_rows, cursor, query.step)
        start = at.layout.global_range(at.index)[0]
        return Placed(at.epoch, start, query.step + at.layout.num_steps - 1 - at.index)

    def steps_in_epoch(self, query: StepQuery) -> int:
        """The epoch's steps (a job's step: the job's number of the epoch's last step + 1)."""
        return self.place(query).last + 1

    def loader_state(self, query: StepQuery) -> dict[str, Any]:
        """The `Loader.state_dict()` after which the query's step is the next one (any rank)."""
        placed = self.place(query)
        return self._reader.state(
            self.target(query), epoch=placed.epoch, offset=placed.start, steps=query.step, **_options(query)
        )

    # --- one step --------------------------------------------------------------------------------
    def read_step(self, query: StepQuery) -> StepBatch:
        """The query's rank's batch at its step (cached: a page's images reuse its step)."""
        with self._lock:
            hit = self._cache.get(query)
            if hit is not None:
                self._cache.move_to_end(query)
                return hit
            flight = self._inflight.setdefault(query, threading.Lock())
        with flight:  # one read per step however many media requests ask for it at once
            with self._lock:
                hit = self._cache.get(query)
            if hit is None:
                hit = self._read(query)
                with self._lock:
                    self._cache[query] = hit
                    while len(self._cache) > CACHED_STEPS:
                        self._cache.popitem(last=False)
            with self._lock:
                self._inflight.pop(query, None)
        return hit

    def read_original(self, query: StepQuery, column: str) -> StepBatch:
        """The same step's stored values of `column`, before any transform (e.g. the encoded image)."""
        return self.read_step(query.moved(transforms="", columns=column, on_error="fail"))

    def _read(self, query: StepQuery) -> StepBatch:
        target = self.target(query)
        placed = self.place(query)
        batch, info = self._reader.read(
            target,
            epoch=placed.epoch,
            offset=placed.start,  # the Loader's cursor at this step: the offset where it starts
            what=f"{target.label} epoch {placed.epoch} step {query.step}",
            **_options(query),
        )
        return StepBatch(query, target, placed.last + 1, batch, replace(info, step=query.step))


def _options(query: StepQuery) -> dict[str, Any]:
    """The Loader options of the query's read (its rank's)."""
    return {
        "rank": query.rank,
        "world_size": query.world_size,
        "batch_size": query.batch_size,
        "seed": query.seed,
        "shuffle": query.shuffle_spec,
        "drop_last": query.drop_last,
        "columns": list(query.column_list) or None,
        "transforms": _with_documents(query.transform_list),
        "on_error": query.on_error,
        "balance": query.balance_option,
    }


def _with_documents(transforms: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The transforms, text.pack asked for every document of its rows (BatchInfo.documents): the
    same arrays, with the provenance the panes show."""
    return [{**t, "documents": True} if t.get("op") == "text.pack" else dict(t) for t in transforms]
