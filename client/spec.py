"""What one iteration of a Loader reads and how it retries: small immutable values, fixed when it starts.

The prefetch thread, its stream sessions and the message decoder get a `ReadSpec` — never the Loader —
so they can be read and tested alone, and nothing the training loop does to the Loader while it
iterates reaches the thread.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from shardstream.order.balance import BalanceSpec
from shardstream.order.cursor_math import NO_SPLIT, RankStream, WorkerSplit, epoch_start
from shardstream.order.read_order import ShuffleSpec
from shardstream.order.read_query import BatchPhase, SkipRange, Transform, encode
from shardstream.order.schedule import Schedule
from shardstream.order.scheduled_steps import Layout, make_layout, split_start
from shardstream.v1 import shardstream_pb2 as pb

from . import metrics
from .target import Target

__all__ = [
    "DEFAULT_BACKOFF_BASE_S",
    "DEFAULT_BACKOFF_MAX_S",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_RETRY_BUDGET_S",
    "DEFAULT_STREAM_IDLE_TIMEOUT_S",
    "ReadSpec",
    "RetryPolicy",
]

DEFAULT_MAX_RETRIES = 6
# A broken stream is retried for at least this long (and at least max_retries times) before the
# training loop sees UnavailableError: long enough for the only server to be restarted.
DEFAULT_RETRY_BUDGET_S = 10.0
DEFAULT_BACKOFF_BASE_S = 0.05
DEFAULT_BACKOFF_MAX_S = 2.0
# A stream that delivers nothing this long while the training loop waits is abandoned for another
# endpoint (a hung server that still answers keepalive pings).
DEFAULT_STREAM_IDLE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """How a broken stream is resumed: how long and how often without progress, backoff, idleness allowed.

    A stream gives up once it has failed more than `max_retries` times in a row AND the first of those
    failures is at least `budget_s` old (the Loader's `timeout_s`): a few quick failures do not end
    training while a server restarts, and a dead fleet is reported after about `budget_s`."""

    max_retries: int = DEFAULT_MAX_RETRIES  # failures in a row; any progress resets the count
    budget_s: float = DEFAULT_RETRY_BUDGET_S  # ... and for at least this long
    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S
    idle_timeout_s: float = DEFAULT_STREAM_IDLE_TIMEOUT_S

    def backoff_s(self, failures: int) -> float:
        """The wait before attempt `failures` + 1: exponential, capped, with full jitter."""
        return random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2 ** (failures - 1)))


@dataclass(frozen=True)
class ReadSpec:
    """One rank's read: the pinned target, the plan parameters, the output and the retry policy."""

    target: Target
    endpoints: tuple[str, ...]
    rank: int
    world_size: int
    batch_size: int
    seed: int
    shuffle: ShuffleSpec
    drop_last: bool
    columns: tuple[str, ...]  # empty: every column
    max_message_bytes: int
    transforms: tuple[pb.Transform, ...]
    on_error: str
    output: str  # "numpy", "torch" or "arrow"
    provenance: bool  # keep the _shard/_row/_source columns in the batches
    pin_memory: bool
    prefetch: int  # batches decoded ahead of the training loop
    streams: int  # streams per rank, striped by step (client/striped.py)
    epochs: int | None  # None: endless
    schedule: Schedule | None = None  # batch-size phases and skip ranges (None: one batch size, no skips)
    split: WorkerSplit = NO_SPLIT  # data-loader workers sharing this rank's stream
    # With a split: the reader's cursor when it starts (its next step), from which its first step of
    # each later epoch follows (cursor_math.RankStream.worker_epoch_starts, walked once, kept here)
    origin: tuple[int, int] = (0, 0)
    _starts: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    _walk: list[Iterator[tuple[int, int]]] = field(default_factory=list, compare=False, repr=False)
    retry: RetryPolicy = RetryPolicy()
    job: str = ""  # the Loader's job ("" without one): its metrics' job_name label
    balance: BalanceSpec = BalanceSpec()  # balanced steps (shardstream/order/balance.py)
    pad_rows: bool = False

    @cached_property  # looked up once: every message counts its bytes through it
    def metrics(self) -> metrics.RankMetrics:
        return metrics.for_rank(self.job, self.rank)

    @property
    def label(self) -> str:
        return self.target.label

    def layout(self, offset: int, epoch: int = 0) -> Layout:
        """The steps of epoch `epoch` from `offset` (this reader's cursor)."""
        return make_layout(
            self.target.num_rows,
            offset,
            self.world_size,
            self.batch_size,
            self.drop_last,
            epoch=epoch,
            schedule=self.schedule,
        )

    def epoch_start(self, epoch: int = 0) -> int:
        """Where this reader's first step of epoch `epoch` starts when it starts the epoch afresh.

        A data-loader worker (split) takes every k-th step of the rank's stream across epochs: its
        first step of a later epoch depends on the epochs since its origin (walked once, in order)."""
        if self.split.workers > 1 and epoch > self.origin[0]:
            if not self._walk:
                stream = RankStream(
                    self.target.num_rows, self.world_size, self.batch_size, self.drop_last, self.schedule
                )
                self._walk.append(stream.worker_epoch_starts(self.origin, self.split.workers))
            while epoch not in self._starts:
                e, start = next(self._walk[0])
                self._starts[e] = start
            return self._starts[epoch]
        if self.schedule is None:
            return epoch_start(self.target.num_rows, self.world_size * self.batch_size, self.split)
        return split_start(self.layout(0, epoch), self.split.worker)

    def request(self, epoch: int, offset: int, first_step: int, step_stride: int) -> pb.ReadRequest:
        """The Read of steps first_step, first_step + step_stride, ... of the epoch from `offset`."""
        batch_size, batch_schedule, skips = self.batch_size, (), ()
        if self.schedule is not None:
            if len(self.schedule.batch) > 1:
                batch_size = 0
                batch_schedule = tuple(BatchPhase(start, size) for start, size in self.schedule.batch)
            skips = tuple(SkipRange(start, end) for start, end in self.schedule.skips)
        query = self.target.query(
            seed=self.seed,
            epoch=epoch,
            shuffle_mode=self.shuffle.mode,
            shuffle_window=self.shuffle.window,
            start_offset=offset,
            rank=self.rank,
            world_size=self.world_size,
            batch_size=batch_size,
            batch_schedule=batch_schedule,
            skips=skips,
            first_step=first_step,
            step_stride=step_stride,
            drop_last=self.drop_last,
            columns=tuple(self.columns),
            max_message_bytes=self.max_message_bytes,
            transforms=tuple(Transform(t.op, t.params_json) for t in self.transforms),
            on_error=self.on_error if self.transforms else "",
            split_steps=True,  # a step over the server's message cap comes in parts (session.py)
            movable=True,  # a stream ended UNAVAILABLE asks GetDataset again (transport/flight_call.py)
            # a single stream opens its successor when its worker asks it to move (prefetch.py)
            handover=self.streams == 1,
            # the provenance of a stored-order stream's rows as runs in each header, not two columns
            # (a batch that keeps the columns, provenance=True, takes them as they come)
            provenance_in_header=not self.provenance,
            balance=self.balance.mode,
            pad_rows=self.pad_rows,
            balance_column=self.balance.column or "",
        )
        return encode(query)
