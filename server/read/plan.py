"""Request -> read plan: everything a stream needs to build its messages, decided before a row is read.

`ReadPlanner.plan(request)` decodes a `ReadRequest` (shardstream/order/read_query.py: a field over its
limit is INVALID_ARGUMENT naming it) and plans from the decoded `ReadQuery` alone (`plan_query`): it
validates the query against the registry and turns it into a `ReadPlan`: the dataset readers (one
per mixture source), the sample order (DESIGN §4), the step layout of this slice, the columns, the
steps to send and the transform pipeline. A bad request fails here, as the ShardstreamError that
says what is wrong (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION), before a byte is read; a field
over this server's limits (request_limits.py) is INVALID_ARGUMENT naming the field and the limit.
The caller's principal (server/policy/auth.py) is checked on every dataset the request names — each
mixture source in turn — before the registry is asked about it: PERMISSION_DENIED says no more than
NOT_FOUND would.

Blocking (manifests are read from storage, a pipeline may load a tokenizer or import a codec): the
servicer calls it in a worker thread; tests and tools call it directly. The planner keeps what
streams share: one DatasetReader per dataset version (its opened and checked shards) and the epoch
orders of the last MAX_CACHED_ORDERS (dataset, seed, shuffle).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shardstream.errors import FailedPreconditionError, InvalidArgumentError
from shardstream.manifest import DatasetRef, Manifest
from shardstream.order.mixture import MixtureOrder
from shardstream.order.read_order import DatasetOrder, ShuffleSpec
from shardstream.order.read_query import ReadQuery, decode
from shardstream.order.scheduled_steps import Layout, make_layout
from shardstream.registry import Registry
from shardstream.v1 import shardstream_pb2 as pb

from ..policy.auth import OPEN, Principal
from ..transforms import Pipeline, build_pipeline
from ..transforms.base import fixed_bytes
from ..transforms.text import Pack
from .balanced_layout import BalancedLayout
from .feature_cache import share_head
from .reader import DatasetReader, RowGroupCache
from .request_limits import RequestLimits
from .request_schedules import mixture_weights, request_mixture, request_schedule
from .selection import check_mixture_columns, cost_values

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "MAX_CACHED_ORDERS", "ReadPlan", "ReadPlanner"]

DEFAULT_MAX_MESSAGE_BYTES = 2 << 20  # several small steps travel together up to ~2 MiB
MAX_CACHED_ORDERS = 64
_PROVENANCE_BYTES = 16  # _shard, _row, _source per row


@dataclass(frozen=True)
class ReadPlan:
    """One Read stream, planned: steps `range(first_step, end_step, stride)` of `layout` for `rank`."""

    readers: list[DatasetReader]  # one per source (one for a plain dataset)
    selector: DatasetOrder | MixtureOrder
    mixture: bool
    layout: Layout  # a StepLayout, a ScheduledLayout for a request with schedules; a BalancedLayout around either
    columns: list[str]
    rank: int
    epoch: int
    first_step: int
    end_step: int
    stride: int
    max_message_bytes: int  # the client's target, at most message_cap_bytes
    seed: int = 0
    pipeline: Pipeline | None = None
    # The server's hard cap on one message: a step larger than it is sent in parts (split_steps) or
    # refused. Parts of a step are built from parts of its samples when every transform is
    # per-sample (per_sample), else cut from the built step's rows.
    message_cap_bytes: int = 1 << 62
    split_steps: bool = False
    movable: bool = False  # its worker may end it for a less busy one to take (serving/placement.py)
    handover: bool = False  # ... by asking its client to (ReadHeader.move_at), which opens the next stream first
    provenance_in_header: bool = False  # the client asked for ReadHeader.provenance (`bare`: where it gets it)
    per_sample: bool = True
    sample_bytes: float = 0.0  # bytes a sample takes in a message, estimated before the first one
    message_target_asked: bool = False  # the client named max_message_bytes (else the server's default)

    @property
    def stored_runs(self) -> bool:
        """Whether the stream is in the stored order (no shuffle, transform, balance or mixture): its
        messages are runs of rows, cut from their row groups (build.py `_group_run`)."""
        return (
            self.pipeline is None
            and not self.mixture
            and isinstance(self.selector, DatasetOrder)
            and self.selector.spec.mode == "none"
            and not isinstance(self.layout, BalancedLayout)
        )

    @property
    def bare(self) -> bool:
        """Whether this stream's messages carry their provenance in the header, not as the `_shard` and
        `_row` columns: asked for, and the stream is in the stored order, whose messages are runs of
        rows."""
        return self.provenance_in_header and self.stored_runs

    @property
    def target_grows(self) -> bool:
        """Whether the server may raise this stream's message target over `max_message_bytes` while
        its buffer budget has room (message_steps.py `grown_target`): the client named no size. (A
        stream in the stored order grows too: its messages are cut at row-group ends, build.py
        `_in_group`, so a larger one is still a slice of one row group, never copied.)"""
        return not self.message_target_asked

    @property
    def nothing_left(self) -> bool:
        """No step to send: the stream is one message telling the client the epoch is over."""
        return self.first_step >= self.end_step and self.end_step == self.layout.num_steps


class ReadPlanner:
    """Resolves datasets and plans Read requests over one registry, for all the streams of a server."""

    def __init__(
        self, registry: Registry, cache: RowGroupCache, limits: RequestLimits | None = None
    ) -> None:
        self.registry = registry
        self.limits = limits or RequestLimits()
        self._cache = cache
        self._readers: dict[tuple[str, int], DatasetReader] = {}
        self._lock = threading.Lock()
        # Epoch orders are shared by every stream of the same (dataset, seed, shuffle).
        self._orders: OrderedDict[tuple[str, int, ShuffleSpec], DatasetOrder] = OrderedDict()

    def resolve(self, dataset: str, principal: Principal = OPEN, what: str = "") -> Manifest:
        """The manifest `dataset` (`name@version|tag`) names, if `principal` may read it; a version
        already read is not re-read (versions are immutable): a tag or the latest costs its
        version's lookup only (a resumed job's GetDataset: ~1-1.5 ms less on a dataset of some
        hundred shards, whose manifest was parsed and its fingerprint checked every time)."""
        ref = DatasetRef.parse(dataset)
        principal.check(ref, what)  # before the registry is asked: denied whether it exists or not
        version = ref.version if ref.version is not None else self.registry.version_of(ref)
        with self._lock:
            cached = self._readers.get((ref.name, version))
        if cached is not None:
            manifest = cached.manifest
        else:
            manifest = self.registry.resolve(DatasetRef(ref.name, version=version))
        if ref.version is None:  # a tag or the latest: the version it resolved to may be one not granted
            principal.check_version(manifest.name, manifest.version, what)
        return manifest

    def latest(self) -> list[Manifest]:
        """The latest manifest of every readable dataset of the registry (bad entries: `Registry.listing`)."""
        return self.registry.listing().manifests

    def reader(self, manifest: Manifest) -> DatasetReader:
        key = (manifest.name, manifest.version)
        with self._lock:
            r = self._readers.get(key)
            if r is None or r.manifest.fingerprint != manifest.fingerprint:
                paths = [self.registry.shard_path(manifest, s.uri) for s in manifest.shards]
                r = self._readers[key] = DatasetReader(manifest, paths, self._cache)
            return r

    def _order(self, reader: DatasetReader, seed: int, spec: ShuffleSpec) -> DatasetOrder:
        key = (reader.manifest.fingerprint, seed, spec)
        with self._lock:
            order = self._orders.get(key)
            if order is None:
                order = self._orders[key] = DatasetOrder(key[0], reader.locator.block_sizes, seed, spec)
                while len(self._orders) > MAX_CACHED_ORDERS:
                    self._orders.popitem(last=False)
            self._orders.move_to_end(key)
            return order

    def _pinned(self, dataset: str, fingerprint: str, principal: Principal, what: str = "") -> Manifest:
        manifest = self.resolve(dataset, principal, what)
        if fingerprint and fingerprint != manifest.fingerprint:
            raise FailedPreconditionError(
                f"{manifest.ref} has fingerprint {manifest.fingerprint[:12]}…, the request pins "
                f"{fingerprint[:12]}…: the dataset changed under this job"
            )
        return manifest

    def plan(self, req: pb.ReadRequest, principal: Principal = OPEN) -> ReadPlan:
        """The plan of a Read ticket: decoded once, then planned from the query alone."""
        return self.plan_query(decode(req), principal)

    def plan_query(self, q: ReadQuery, principal: Principal = OPEN) -> ReadPlan:
        self.limits.check(q)
        spec = ShuffleSpec.parse(q.shuffle_mode or "none", q.shuffle_window or None)
        selector: DatasetOrder | MixtureOrder
        if q.mixture:
            weights = mixture_weights(q)
            manifests = [
                self._pinned(s.dataset, s.fingerprint, principal, f"mixture source {i}: ")
                for i, s in enumerate(q.sources)
            ]
            readers = [self.reader(m) for m in manifests]
            mixture = request_mixture(q, manifests, weights)
            selector = MixtureOrder(mixture, [self._order(r, q.seed, spec) for r in readers])
            columns = check_mixture_columns(readers, list(q.columns))
        else:
            manifest = self._pinned(q.dataset, q.fingerprint, principal)
            readers = [self.reader(manifest)]
            selector = self._order(readers[0], q.seed, spec)
            columns = readers[0].check_columns(list(q.columns))
        pipeline = None
        if q.transforms or q.on_error:
            first = readers[0]
            schema = pa.schema([first.manifest.schema.field(c) for c in columns])

            def describe(source: int, shard: int, row: int) -> str:
                m = readers[source].manifest
                return f"{m.ref} shard {shard} ({m.shards[shard].uri}) row {row}"

            pipeline = build_pipeline(
                list(q.transforms),
                q.on_error,
                schema,
                describe,
                max_sample_bytes=self.limits.max_sample_bytes,
            )
            share_head(pipeline, self._cache, readers, columns)  # decode once per node (feature_cache.py)
        layout = make_layout(
            selector.num_rows,
            q.start_offset,
            q.world_size,
            q.batch_size,
            q.drop_last,
            epoch=q.epoch,
            schedule=request_schedule(q),
        )
        if q.balance is not None:
            layout = _balanced(q, layout, pipeline, readers, selector)
        if q.first_step > layout.num_steps:
            raise InvalidArgumentError(
                f"first_step {q.first_step} is past the epoch's {layout.num_steps} steps"
            )
        end = (
            layout.num_steps if q.num_steps == 0 else min(layout.num_steps, q.first_step + q.num_steps)
        )
        cap = self.limits.max_message_bytes
        return ReadPlan(
            readers=readers,
            selector=selector,
            mixture=q.mixture,
            layout=layout,
            columns=columns,
            rank=q.rank,
            epoch=q.epoch,
            first_step=q.first_step,
            end_step=end,
            stride=max(1, q.step_stride),
            max_message_bytes=min(q.max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES, cap),
            seed=q.seed,
            pipeline=pipeline,
            message_cap_bytes=cap,
            split_steps=q.split_steps,
            movable=q.movable,
            handover=q.handover,
            provenance_in_header=q.provenance_in_header,
            per_sample=pipeline is None or pipeline.per_sample,
            sample_bytes=_sample_bytes(readers, columns, pipeline),
            message_target_asked=q.max_message_bytes != 0,
        )


def _balanced(
    q: ReadQuery,
    layout: Layout,
    pipeline: Pipeline | None,
    readers: list[DatasetReader],
    selector: DatasetOrder | MixtureOrder,
) -> BalancedLayout:
    """The layout of a balanced request (balanced_layout.py), its request checked: packed text whose
    documents' token counts the dataset keeps (text.pack's "lengths" column), or samples with a cost
    column."""
    mode = q.balance
    assert mode is not None
    last = pipeline.transforms[-1] if pipeline else None
    if mode == "cost":
        column, what = q.balance_column, "balance cost column"
    else:
        if not isinstance(last, Pack):
            raise InvalidArgumentError(
                f'balance="{mode}" balances packed rows: the request\'s last transform must be text.pack'
            )
        if last.lengths is None:
            raise InvalidArgumentError(
                f'balance="{mode}" needs each document\'s token count without reading the others\' text: give '
                'text.pack "lengths": a column of the dataset holding them (for the tokenizer in use)'
            )
        column, what = last.lengths, "text.pack lengths"
    if q.on_error == "skip":
        raise InvalidArgumentError(f'balance="{mode}" needs on_error="fail": a skipped sample would move every rank\'s share')
    for r in readers:
        field = r.manifest.schema.field(column) if column in r.manifest.schema.names else None
        numeric = field is not None and (pa.types.is_integer(field.type) or (mode == "cost" and pa.types.is_floating(field.type)))
        if not numeric:
            kind = "numeric" if mode == "cost" else "integer"
            raise InvalidArgumentError(f"{what}: {r.manifest.ref} has no {kind} column {column!r}")

    def costs(start: int, end: int) -> np.ndarray:
        src, rows = selector.select(q.epoch, np.arange(start, end, dtype=np.int64))
        return cost_values(readers, src, rows, column, mixture=q.mixture, floats=mode == "cost", what=what)

    seq_len = last.seq_len if isinstance(last, Pack) and mode != "cost" else 0
    # text.pack alone over a dataset's list column: a rank's reader takes only the tokens its rows hold
    slices = None
    if isinstance(last, Pack) and mode != "cost" and pipeline is not None and len(pipeline.transforms) == 1:
        types = [
            r.manifest.schema.field(last.column).type
            for r in readers
            if last.column in r.manifest.schema.names
        ]
        if len(types) == len(readers) and all(
            pa.types.is_list(t) or pa.types.is_large_list(t) for t in types
        ):
            slices = last.column
    return BalancedLayout(layout, mode=mode, costs=costs, seq_len=seq_len, pad_rows=q.pad_rows, slices=slices)


def _sample_bytes(readers: list[DatasetReader], columns: list[str], pipeline: Pipeline | None) -> float:
    """Bytes one sample will take in a message, before any was built: exact for fixed-size columns
    (a decoded image), the datasets' stored bytes per row for the others (an underestimate when
    they compress well; the messages that follow are sized from what was built)."""
    schema = (
        pipeline.transforms[-1].output_schema
        if pipeline
        else pa.schema([readers[0].manifest.schema.field(c) for c in columns])
    )
    sizes = [fixed_bytes(f.type) for f in schema]
    fixed = sum(n for n in sizes if n is not None)
    stored = max(r.manifest.num_bytes / max(1, r.manifest.num_rows) for r in readers)
    return fixed + (stored if None in sizes else 0.0) + _PROVENANCE_BYTES
