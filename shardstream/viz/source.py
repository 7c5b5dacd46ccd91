"""The one data source of both visualizers: one rank's batch at one step, exactly as the trainer gets it.

A step is read through shardstream servers with the client's own pieces — the pinned `Target`
(client/target.py), the `ReadSpec` a Loader builds (client/spec.py), one `StreamSession` with its
retries and failover (client/session.py) and the message decoder (client/decode.py) — starting at
the step's global offset `step * world_size * batch_size` (or, for a job's step, where the job's
cursor walks to: `place()`), which is where a Loader whose state says that offset starts
(`loader_state()` returns that state). Only that one step is asked for
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

from shardstream.client.batch import PROVENANCE, BatchInfo
from shardstream.client.channel import Connection, normalize_endpoints
from shardstream.client.convert import to_numpy
from shardstream.client.credentials import ChannelSecurity, TlsOption
from shardstream.client.decode import decode_message
from shardstream.client.loader_state import LoaderState
from shardstream.client.session import CallRegistry, StreamSession
from shardstream.client.spec import ReadSpec, RetryPolicy
from shardstream.client.target import Target, normalize_dataset, resolve_target
from shardstream.errors import InvalidArgumentError, UnavailableError
from shardstream.order.explain import Cursor, place_step
from shardstream.order.read_order import StepLayout
from shardstream.registry import Registry
from shardstream.transform_spec import to_wire
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
        data = self.batch.drop_columns([c for c in PROVENANCE if c in self.batch.schema.names])
        return to_numpy(data)

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
        self.endpoints = normalize_endpoints(list(endpoints))
        self.security = security or ChannelSecurity()
        self.tls = tls  # the Loader's tls= as given (file paths), for the scripts the pages show
        self.registry = registry  # manifests: history, diffs, shard names, shuffle stats (optional)
        self.metrics_urls = list(metrics_urls)  # the servers' /metrics (the fleet page)
        self.timeout_s = timeout_s
        self._owned = owned  # an embedded LocalServer, stopped on close
        self._conns = {e: Connection(e, self.security) for e in self.endpoints}
        self._targets: dict[tuple[Any, ...], Target] = {}
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
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        if self._owned is not None:
            self._owned.stop()
            self._owned = None
        if self.registry is not None:
            self.registry.close()

    # --- what there is ---------------------------------------------------------------------------
    def _first(self, call: Any) -> Any:
        last: Exception | None = None
        for endpoint in self.endpoints:
            try:
                return call(self._conns[endpoint])
            except UnavailableError as exc:
                last = exc
        raise UnavailableError(f"no shardstream server reachable at {', '.join(self.endpoints)} ({last})")

    def list_datasets(self) -> list[pb.DatasetInfo]:
        """Each dataset's latest version, as the fleet lists it."""
        resp = self._first(lambda c: c.list_datasets(self.timeout_s))
        return sorted(resp.datasets, key=lambda d: d.name)

    def dataset_info(self, ref: str) -> pb.DatasetInfo:
        return self._first(lambda c: c.get_dataset(ref, self.timeout_s))

    def target(self, query: StepQuery) -> Target:
        """The pinned dataset version or mixture the query reads (resolved once)."""
        key = (query.dataset, query.column_list, query.seed)
        with self._lock:
            found = self._targets.get(key)
        if found is None:
            found = resolve_target(
                self.dataset_info,
                normalize_dataset(query.dataset),
                columns=list(query.column_list) or None,
                seed=query.seed,
            )
            with self._lock:
                self._targets[key] = found
        return found

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
        target = self.target(query)
        placed = self.place(query)
        return LoaderState(
            dataset=target.label,
            fingerprint=target.fingerprint,
            seed=query.seed,
            shuffle=str(query.shuffle_spec),
            epoch=placed.epoch,
            offset=placed.start,
            world_size=query.world_size,
            batch_size=query.batch_size,
            steps=query.step,
        ).to_dict()

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

    def _spec(self, query: StepQuery, target: Target) -> ReadSpec:
        return ReadSpec(
            target=target,
            endpoints=tuple(self.endpoints),
            rank=query.rank,
            world_size=query.world_size,
            batch_size=query.batch_size,
            seed=query.seed,
            shuffle=query.shuffle_spec,
            drop_last=query.drop_last,
            columns=query.column_list,
            max_message_bytes=0,
            transforms=tuple(to_wire(_with_documents(query.transform_list), query.on_error)),
            on_error=query.on_error,
            output="arrow",
            provenance=True,
            pin_memory=False,
            prefetch=1,
            streams=1,
            epochs=query.epoch + 1,
            retry=RetryPolicy(budget_s=self.timeout_s),
        )

    def _read(self, query: StepQuery) -> StepBatch:
        target = self.target(query)
        placed = self.place(query)
        total = placed.last + 1
        epoch, offset = placed.epoch, placed.start
        spec = self._spec(query.moved(epoch=epoch), target)
        # The Loader's cursor at this step: the offset where it starts, read from there.
        layout = StepLayout(target.num_rows, offset, query.world_size, query.batch_size, query.drop_last)

        def request_at(first: int) -> pb.ReadRequest:
            request = spec.request(epoch, offset, first, 1)
            request.num_steps = 1
            return request

        calls = CallRegistry(lambda endpoint, req: self._conns[endpoint].read(req, READ_DEADLINE_S))
        session = StreamSession(
            calls,
            request_at,
            endpoints=spec.endpoints,
            endpoint=query.rank % len(spec.endpoints),
            first_step=0,
            step_stride=1,
            retry=spec.retry,
            what=f"{target.label} epoch {epoch} step {query.step}",
        )
        try:
            message = session.next_message()
        finally:
            session.close()
            calls.stop()
        if message is None:
            raise UnavailableError(f"the stream of {query.describe()} ended without its step")
        header, rows = message
        items = [i for i in decode_message(spec, epoch, layout, 0, 1, header, rows) if i.info]
        if len(items) != 1:
            raise UnavailableError(f"expected one step for {query.describe()}, got {len(items)}")
        item = items[0]
        assert item.info is not None
        info = replace(item.info, step=query.step)
        return StepBatch(query, target, total, item.batch, info)


def _with_documents(transforms: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The transforms, text.pack asked for every document of its rows (BatchInfo.documents): the
    same arrays, with the provenance the panes show."""
    return [{**t, "documents": True} if t.get("op") == "text.pack" else dict(t) for t in transforms]
