"""Read plan + steps -> framed Read messages (blocking; the servicer runs each build in a worker thread).

A message covers one or more steps of one rank. `MessageBuilder.build` writes its header (per step:
the rank's positions, the global range, the rows), selects the samples through the plan's order,
takes their rows with provenance (`_shard`, `_row`; `_source` in a mixture), runs the request's
transforms (which set each step's rows and the samples they skipped) and writes the Arrow IPC
stream straight into the message (framing.py). The last message of an epoch says so and counts
the samples `drop_last` left out.

`MessageSteps` decides which steps each message of a stream covers: one step first, for a quick
first batch, then as many as the last message says fit `max_message_bytes` (at most
MAX_STEPS_PER_MESSAGE). `MessageBuilder.messages(plan)` is a whole stream, in order, the same bytes
the servicer sends but one message at a time and without gRPC or an event loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
from prometheus_client import Histogram

from shardstream.framing import encode_batch, encode_read_response, ipc_bytes
from shardstream.v1 import shardstream_pb2 as pb

from .read_plan import ReadPlan
from .selection import take_selection

__all__ = ["MAX_STEPS_PER_MESSAGE", "MessageBuilder", "MessageSteps"]

MAX_STEPS_PER_MESSAGE = 4096

BATCH_BUILD_SECONDS = Histogram(
    "shardstream_batch_build_seconds",
    "Time to build one Read message (read, take, encode)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


class MessageSteps:
    """The steps of each message of one stream, every `plan.stride`-th step from `plan.first_step`."""

    def __init__(self, plan: ReadPlan) -> None:
        self._plan = plan
        self.step = plan.first_step  # the first step no message covers yet
        self.per_message = 1  # one step first, for a quick first batch

    @property
    def remaining(self) -> bool:
        return self.step < self._plan.end_step

    def next(self) -> range:
        """The steps of the next message (call only while `remaining`)."""
        p = self._plan
        chunk = range(self.step, min(p.end_step, self.step + self.per_message * p.stride), p.stride)
        self.step = chunk[-1] + p.stride
        return chunk

    def ahead(self, messages: int) -> range:
        """The steps of the next `messages` messages if they are the size of the last (read-ahead's guess)."""
        p = self._plan
        return range(self.step, min(p.end_step, self.step + self.per_message * messages * p.stride), p.stride)

    def record(self, steps: int, rows: int, nbytes: int) -> None:
        """Size the next messages toward `max_message_bytes` from one built message of `steps` steps."""
        if rows:
            self.per_message = max(
                1, min(MAX_STEPS_PER_MESSAGE, self._plan.max_message_bytes * steps // nbytes)
            )


class MessageBuilder:
    """Builds the messages of any number of streams at once (it holds no per-stream state)."""

    def __init__(self, *, transform_threads: int = 1) -> None:
        # Per-sample transform work (Pillow, FFmpeg, the tokenizer release the GIL) runs here, apart
        # from the threads that build messages, so a message's samples decode on every core.
        self.transform_threads = max(1, transform_threads)
        self._transform_pool = (
            ThreadPoolExecutor(self.transform_threads, thread_name_prefix="transform")
            if self.transform_threads > 1
            else None
        )

    def build(self, plan: ReadPlan, steps: range) -> tuple[bytes, int]:
        """(the message covering `steps` of `plan`, the rows in it)."""
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

    def end_of_epoch(self, plan: ReadPlan) -> bytes:
        """The one message of a stream with no step left: no rows, the epoch is over."""
        header = pb.ReadHeader(epoch=plan.epoch, end_of_epoch=True, dropped=plan.layout.dropped)
        none = np.empty(0, np.int64)
        empty = take_selection(plan.readers, none, none, plan.columns, mixture=plan.mixture)
        if plan.pipeline:
            empty = self._transform(plan, header, empty, none)
        return encode_read_response(header, ipc_bytes(empty))

    def messages(self, plan: ReadPlan) -> Iterator[bytes]:
        """Every message of the stream `plan` describes, in order."""
        if plan.nothing_left:
            yield self.end_of_epoch(plan)
            return
        steps = MessageSteps(plan)
        while steps.remaining:
            chunk = steps.next()
            data, rows = self.build(plan, chunk)
            steps.record(len(chunk), rows, len(data))
            yield data

    def _transform(
        self, plan: ReadPlan, header: pb.ReadHeader, batch: pa.RecordBatch, positions: np.ndarray
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
