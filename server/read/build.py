"""Read plan + steps -> Read messages (blocking; the data plane runs each build in a worker thread).

A message covers one or more whole steps of one rank, or one part of a step larger than the
server's cap on bytes per message (`plan.message_cap_bytes`, `serve --max-message-mib`). Building
writes its header (per step: the rank's positions, the global range, the rows), selects the
samples through the plan's order, takes their rows with provenance (`_shard`, `_row`; `_source` in
a mixture), runs the request's transforms (which set each step's rows and the samples they
skipped); the data plane sends the rows as one Flight record batch, without a copy, and the header
as its app_metadata (server/serving/data_plane.py). The last message of an epoch says so and counts the
samples `drop_last` left out.

`MessageSteps` (message_steps.py) decides what each build covers, and `OrderAhead` (order_ahead.py)
selects its samples several messages ahead; a built message over the cap
(an estimate that was short, or text.pack, which packs a whole step) is cut at step boundaries
and, within a step, into parts of its rows. Parts go only to a client that reassembles them
(`split_steps`); to any other, a step over the cap is INVALID_ARGUMENT. Only a single row larger
than the cap travels alone in a message over it.

In the stored order (shuffle "none", no transform) a build makes several messages at once
(`MessageBuilder._group_run`): while the chunks are consecutive rows of one row group, each message
is a slice of that row group with its provenance, made once for it (reader.GroupRun), and the build
goes on into the next row groups the cache holds. One build a row group or two instead of one a
message: ~95 -> ~45 us of CPU a 2 MiB message in process, the same bytes (tests/test_group_runs.py).
A chunk whose rows run past its row group's end stops there (`_in_group`; row groups of
CUT_MIN_BYTES and more), so the stream's later messages start at row-group starts and are slices
of one row group up to the grown target, never copied out of two.

A stream whose client asked for `ReadRequest.provenance_in_header` and reads in the stored order
(`ReadPlan.bare`) gets no `_shard`/`_row` columns: each message's header names its rows' provenance
(`ReadHeader.provenance`: one run for a message cut from a row group, `GroupRun(bare=True)` making no
provenance columns at all; the runs of a general build's columns, `_bared`). 12 bytes a row less on
the wire — 19% of a 64-byte row — and no provenance made a build (tests/test_group_runs.py).

Memory (server/serving/admission.py): `Message.holds` is what a built message keeps alive — its Arrow buffers,
counted whole even where the message is a slice of them (a zero-copy slice of a row group keeps the
row group alive after the cache lets it go) — and lets go when it is sent: messages cut from one row
group count it once, on the last of them. A message that is the whole of its build and a slice of
buffers over COMPACT_FACTOR times its size is copied out of them instead, so it never keeps a large
row group alive for a few rows. `build_estimate` (message_steps.py) is what a stream reserves
before a build.

`MessageBuilder.stream(plan)` is a whole stream, in order, one message at a time and without gRPC
or an event loop; `builds(plan)` the same as the builds that make them; `messages(plan)` as a list.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
from prometheus_client import Counter, Histogram

from shardstream.errors import InvalidArgumentError
from shardstream.extension_types import plain_schema
from shardstream.ipc import ipc_size, plain_batch
from shardstream.numpy_view import numpy_view
from shardstream.order.read_order import RowLocator
from shardstream.provenance import runs_of
from shardstream.v1 import shardstream_pb2 as pb

from .balanced_layout import BalancedLayout, Positions, hull, positions_array, rank_positions
from .gather import ListSpans
from .message_steps import BUILD_PEAK_FACTOR, Chunk, Message, MessageSteps
from .order_ahead import OrderAhead
from .plan import ReadPlan
from .reader import GroupRun
from .selection import take_provenance, take_selection

__all__ = ["COMPACT_FACTOR", "CUT_MIN_BYTES", "Message", "MessageBuilder"]

MAX_RUN_MESSAGES = 64  # messages cut from one row group by one build (`MessageBuilder._group_run`)
_FRAMING_BYTES = 48  # Flight's framing around a message's header and IPC data, at most
COMPACT_FACTOR = 4  # a message slicing buffers over this many times its size is copied out of them
# A stored-order chunk that runs past its row group's end is cut there (`_in_group`) when the row
# group holds this much: a message costs ~0.35 ms of fixed server CPU, and copying rows out of two
# row groups ~0.27 ms a MiB more than slicing one (loadtest/README.md, "Messages cut at row-group
# ends"), so slices of row groups of 1 MiB and more cost less than messages of several copied.
CUT_MIN_BYTES = 1 << 20

BATCH_BUILD_SECONDS = Histogram(
    "shardstream_batch_build_seconds",
    "Time to build one Read message (read, take, encode)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
STEP_PARTS = Counter(
    "shardstream_step_parts_sent_total",
    "Read messages that carry a part of a step larger than the message cap",
)


def _message(
    header: pb.ReadHeader,
    batch: pa.RecordBatch,
    steps: int,
    rows: int,
    *,
    parts: bool = False,
    nbytes: int | None = None,
    compact: bool = False,
    bare: bool = False,
) -> Message:
    """`compact`: the batch is all its build made (nothing else keeps its buffers alive), so one
    slicing much larger buffers is copied out of them. `bare`: its provenance columns go into the
    header (`ReadPlan.bare`; `nbytes`, counted with them, stays a bound)."""
    if bare:
        header, batch = _bared(header, batch)
    batch = plain_batch(batch)  # no extension type leaves the server (extension_types.py)
    size = _size(header, batch) if nbytes is None else nbytes
    holds = batch.get_total_buffer_size()
    if compact and holds > COMPACT_FACTOR * size:
        batch = pa.concat_batches([batch])  # a copy of the rows only
        holds = batch.get_total_buffer_size()
    return Message(header, batch, steps, rows, parts, size, max(size, holds))


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

    def stream(
        self, plan: ReadPlan, on_chunk: Callable[[MessageSteps], None] | None = None
    ) -> Iterator[Message]:
        """Every message of the stream `plan` describes, in order, each built when asked for.

        `on_chunk(steps)` is called before each build, once `steps` has moved past it (read-ahead)."""
        for built in self.builds(plan, on_chunk):
            yield from built

    def builds(
        self, plan: ReadPlan, on_chunk: Callable[[MessageSteps], None] | None = None
    ) -> Iterator[list[Message]]:
        """`stream`'s messages, as the builds that make them: one message each, or the messages of
        consecutive chunks cut from one row group (`_group_run`) at once. Their `holds` add up to
        what the build keeps alive, each let go when its message is (the data plane's reservations)."""
        if plan.nothing_left:
            header, empty = self.end_of_epoch_batch(plan)
            yield [_message(header, empty, 0, 0, bare=plan.bare)]
            return
        steps = MessageSteps(plan)
        order = OrderAhead(plan)
        # rows as stored: cut from row groups (not with balance: a rank's samples are not a run)
        runs = plan.pipeline is None and order.stored and not isinstance(plan.layout, BalancedLayout)
        part = 0  # of the step being sent in parts
        chunk: Chunk | None = None  # the next chunk, when a run took it already
        while chunk is not None or steps.remaining:
            if chunk is None:
                chunk = steps.next()
                if on_chunk is not None:
                    on_chunk(steps)
            if runs and chunk.samples is None:
                built, chunk = self._group_run(plan, chunk, steps, order, on_chunk)
                if built:
                    yield built
                    continue
                assert chunk is not None
            t0 = time.perf_counter()
            header, batch = self.build_batch(plan, chunk, order)
            rows = batch.num_rows
            encoded = self._encode(plan, chunk, header, batch, part)
            del header, batch  # held by `encoded` only as long as it needs them
            nbytes = 0
            for message in encoded:
                nbytes += message.nbytes
                if message.parts:
                    STEP_PARTS.inc()
                    part = 0 if message.steps else part + 1
                BATCH_BUILD_SECONDS.observe(time.perf_counter() - t0)
                yield [message]
                t0 = time.perf_counter()
            steps.record(chunk, rows, nbytes)
            chunk = None

    def _group_run(
        self,
        plan: ReadPlan,
        chunk: Chunk,
        steps: MessageSteps,
        order: OrderAhead,
        on_chunk: Callable[[MessageSteps], None] | None,
    ) -> tuple[list[Message], Chunk | None]:
        """The messages of `chunk` and of the chunks after it while each is consecutive rows of one
        row group (an unshuffled stream's, mostly), cut from the row groups leased once each
        (reader.GroupRun), and the next chunk not built (None: the stream has no more). No messages
        when `chunk` is not such a run: it is built the general way.

        A build goes on into the next row group only if the cache holds it (it never waits for a
        read or for room while it holds a lease: `group_run(held=True)`), while what it holds stays
        within what a stream reserves for a build after one that held its first row group
        (`build_estimate`), and for at most MAX_RUN_MESSAGES messages. A row group's buffers are
        held by the last message cut from it (`Message.holds`; the others hold none)."""
        reader = plan.readers[0]
        locator = reader.locator
        chunk, found = _in_group(plan, chunk, order.run(chunk), steps, locator)
        place = locator.run(*found) if found is not None else None
        if found is None or place is None:
            return [], chunk
        shard, group, start, row = place
        bare = plan.bare
        run = reader.group_run(shard, group, row - start, plan.columns, bare=bare)
        if run is None:
            return [], chunk
        runs = [run]
        out: list[Message] = []
        ends: list[int] = []  # where each run's messages end in `out`
        following: Chunk | None = chunk
        try:
            if plain_schema(run.schema) is not run.schema:  # extension types: _message's way
                return [], chunk
            schema = run.schema
            limit = BUILD_PEAK_FACTOR * max(plan.max_message_bytes, run.nbytes)
            held = run.nbytes
            # the row group's dataset rows, where they are its rows in storage (no masked rows)
            base = -1 if locator.masked else found[0] - start
            cap = plan.message_cap_bytes
            while True:
                t0 = time.perf_counter()
                n = found[1]
                header, _ = self._header(plan, chunk)
                batch = run.batch(start, n)
                if bare:
                    header.provenance.CopyFrom(run.provenance(start, n))
                size = _size(header, batch, run.ipc_size(batch, start))
                if size > cap:  # parts of a step, or steps grouped under the cap: _encode's way
                    break
                out.append(Message(header, batch, len(header.steps), n, False, size, 0))
                steps.record(chunk, n, size, n)
                BATCH_BUILD_SECONDS.observe(time.perf_counter() - t0)
                if len(out) >= MAX_RUN_MESSAGES or not steps.remaining:
                    following = None  # the next chunk is not taken yet
                    break
                chunk = following = steps.next()
                if on_chunk is not None:
                    on_chunk(steps)
                if chunk.samples is not None:
                    break
                chunk, found = _in_group(plan, chunk, order.run(chunk), steps, locator)
                following = chunk
                if found is None:
                    break
                if base >= 0 and base <= found[0] and found[0] + found[1] <= base + run.rows:
                    start = found[0] - base
                    continue
                place = locator.run(*found)
                if place is None:
                    break
                if place[:2] == (shard, group):
                    start = place[2]
                    continue
                if held + run.nbytes > limit:  # (the next row group is as large as this one, mostly)
                    break
                shard, group, start, row = place
                nxt = reader.group_run(shard, group, row - start, plan.columns, held=True, bare=bare)
                if nxt is None:
                    break
                if nxt.schema != schema or held + nxt.nbytes > limit:
                    nxt.release()
                    break
                ends.append(len(out))
                runs.append(nxt)
                run, held = nxt, held + nxt.nbytes
                base = -1 if locator.masked else found[0] - start
        finally:
            for r in runs:
                r.release()
        ends.append(len(out))
        return self._held(out, runs, ends), following

    @staticmethod
    def _held(out: list[Message], runs: list[GroupRun], ends: list[int]) -> list[Message]:
        """`out` with each run's buffers held by the last message cut from it, or, where a run's
        messages are a few rows of a much larger row group, copied out of it (`_message`)."""
        begin = 0
        for run, end in zip(runs, ends, strict=True):
            if end == begin:
                continue
            mine = out[begin:end]
            sent = sum(m.nbytes for m in mine)
            if run.nbytes > COMPACT_FACTOR * sent:
                out[begin:end] = [_message(m.header, m.batch, m.steps, m.rows, nbytes=m.nbytes, compact=True) for m in mine]
            else:
                m = mine[-1]
                out[end - 1] = Message(m.header, m.batch, m.steps, m.rows, False, m.nbytes, max(sent, run.nbytes))
            begin = end
        return out

    def messages(self, plan: ReadPlan) -> list[Message]:
        """Every message of the stream `plan` describes, in order (tests, tools)."""
        return list(self.stream(plan))

    def build_batch(
        self, plan: ReadPlan, chunk: Chunk, order: OrderAhead | None = None
    ) -> tuple[pb.ReadHeader, pa.RecordBatch]:
        """The header and rows of `chunk` of `plan` (one StepInfo per step, whole or part); the
        samples through `order` (the stream's) or the plan's selector."""
        header, ranges = self._header(plan, chunk)
        # the positions themselves only where a transform or the plan's selector needs them
        positions = positions_array(ranges) if order is None or plan.pipeline else None
        if order is not None:
            src, rows = order.select(chunk)
        else:
            assert positions is not None
            src, rows = plan.selector.select(plan.epoch, positions)
        spans = _spans(plan, chunk, header)

        def take() -> pa.RecordBatch:
            return take_selection(plan.readers, src, rows, plan.columns, mixture=plan.mixture, spans=spans)

        if not plan.pipeline:
            return header, take()
        assert positions is not None
        if plan.pipeline.features is not None and spans is None and len(rows):
            # a shared head serves the rows from the feature cache: their stored bytes are taken
            # only if it does not (Pipeline.apply's `take`)
            batch = take_provenance(plan.readers, src, rows, mixture=plan.mixture)
            return header, self._transform(plan, header, batch, positions, take)
        return header, self._transform(plan, header, take(), positions)

    @staticmethod
    def _header(plan: ReadPlan, chunk: Chunk) -> tuple[pb.ReadHeader, list[tuple[int, int]]]:
        """The header of `chunk` of `plan` (one StepInfo per step, whole or part; the end of the
        epoch on its last) and the rank's positions it covers, step by step."""
        header = pb.ReadHeader(epoch=plan.epoch)
        ranges: list[Positions] = []
        layout = plan.layout
        for step in chunk.steps:
            gs, ge = layout.global_range(step)
            positions = rank_positions(layout, step, plan.rank)
            ps, pe = hull(positions, gs)
            a, b = chunk.samples if chunk.samples is not None else (0, len(positions))
            info = header.steps.add(
                step=step, position_start=ps, position_end=pe, global_start=gs, global_end=ge, rows=b - a
            )
            if isinstance(layout, BalancedLayout):  # its share of the step, for loss weights and metrics
                info.balanced = True
                info.cost, info.step_cost = layout.cost(step, plan.rank)
                window = layout.window(step, plan.rank)
                if window is not None:
                    info.tokens, info.step_tokens = window.labels, window.step_labels
            ranges.append(positions[a:b])
        steps = chunk.steps
        if (
            steps
            and chunk.last
            and plan.end_step == plan.layout.num_steps
            and steps[-1] + plan.stride >= plan.end_step
        ):
            header.end_of_epoch = True
            header.dropped = plan.layout.dropped
        return header, ranges

    def end_of_epoch_batch(self, plan: ReadPlan) -> tuple[pb.ReadHeader, pa.RecordBatch]:
        """The one message of a stream with no step left (its header and no rows): the epoch is over."""
        header = pb.ReadHeader(epoch=plan.epoch, end_of_epoch=True, dropped=plan.layout.dropped)
        none = np.empty(0, np.int64)
        empty = take_selection(plan.readers, none, none, plan.columns, mixture=plan.mixture)
        if plan.pipeline:
            empty = self._transform(plan, header, empty, none)
        return header, empty

    # --- at most message_cap_bytes a message ----------------------------------------------------
    def _encode(
        self,
        plan: ReadPlan,
        chunk: Chunk,
        header: pb.ReadHeader,
        batch: pa.RecordBatch,
        part: int,
    ) -> Iterator[Message]:
        """The messages of one built chunk, each encoded when asked for (the rows are let go before
        the last one is handed out: a stream waiting to send it holds the message only)."""
        cap = plan.message_cap_bytes
        size = _size(header, batch) if chunk.samples is None else cap + 1
        if size <= cap:  # the common case: sized once
            message = _message(
                header, batch, len(header.steps), batch.num_rows, nbytes=size, compact=True, bare=plan.bare
            )
            del batch
            yield message
            return
        # Whole steps, grouped while they fit; a step that does not is cut into parts of its rows.
        infos = list(header.steps)
        starts = np.concatenate([[0], np.cumsum([st.rows for st in infos])]).astype(np.int64).tolist()

        def group(i: int, j: int) -> tuple[pb.ReadHeader, pa.RecordBatch]:
            """Steps [i, j) of the chunk as one message's header and rows."""
            return _header(header, infos[i:j], j == len(infos)), batch.slice(starts[i], starts[j] - starts[i])

        i = 0
        while i < len(infos):
            j = i + 1  # steps [i, j) of the chunk go together
            while j < len(infos) and _size(*group(i, j + 1)) <= cap:
                j += 1
            out, rows = group(i, j)
            if chunk.samples is None and (j - i > 1 or _size(out, rows) <= cap):
                yield _message(out, rows, j - i, rows.num_rows, bare=plan.bare)
            else:
                yield from self._parts(plan, chunk, out, rows, part)
            i = j

    def _parts(
        self,
        plan: ReadPlan,
        chunk: Chunk,
        header: pb.ReadHeader,
        rows: pa.RecordBatch,
        part: int,
    ) -> Iterator[Message]:
        """One step's rows (all of them, or one chunk of its samples: `header` has its one StepInfo)
        as parts under the cap, numbered from `part`."""
        cap = plan.message_cap_bytes
        (info,) = header.steps
        if not plan.split_steps:
            raise InvalidArgumentError(
                f"step {info.step} is {_size(header, rows)} bytes, over this server's cap of {cap} bytes "
                "per message (--max-message-mib): a client that sets split_steps receives it in parts; "
                "or ask for a smaller batch_size"
            )
        pieces = _row_pieces(rows, 0, rows.num_rows, cap - header.ByteSize() - _FRAMING_BYTES)
        for k, (a, b) in enumerate(pieces):
            last = k == len(pieces) - 1
            out = pb.ReadHeader()
            out.CopyFrom(header)
            if not last:
                out.end_of_epoch = False
                out.dropped = 0
            st = out.steps[0]
            st.rows = b - a
            st.part = part + k
            st.more_parts = not (last and chunk.last)
            if k:  # the part's skipped samples travel with its first piece
                del st.skipped[:]
            yield _message(out, rows.slice(a, b - a), int(not st.more_parts), b - a, parts=True, bare=plan.bare)

    def _transform(
        self,
        plan: ReadPlan,
        header: pb.ReadHeader,
        batch: pa.RecordBatch,
        positions: np.ndarray,
        take: Callable[[], pa.RecordBatch] | None = None,
    ) -> pa.RecordBatch:
        """Run the request's transforms over a message's rows; set each step's rows and skips.
        (`take`: `batch` holds the rows' provenance only, `take()` all their columns.)"""
        assert plan.pipeline is not None
        step_ids = [st.step for st in header.steps]
        steps = np.repeat(np.array(step_ids, np.int64), [st.rows for st in header.steps])
        layout = plan.layout
        packed = isinstance(layout, BalancedLayout) and layout.packed
        windows = {s: layout.window(s, plan.rank) for s in step_ids} if packed else None
        out, per_step = plan.pipeline.apply(
            batch,
            seed=plan.seed,
            epoch=plan.epoch,
            positions=positions,
            steps=steps,
            step_ids=step_ids,
            pool=self._transform_pool,
            threads=self.transform_threads,
            windows=windows,
            take=take,
        )
        for st, res in zip(header.steps, per_step, strict=True):
            st.rows = res.rows
            st.skipped.extend(res.skipped)
        return out


def _in_group(
    plan: ReadPlan, chunk: Chunk, found: tuple[int, int] | None, steps: MessageSteps, locator: RowLocator
) -> tuple[Chunk, tuple[int, int] | None]:
    """`chunk` and its run of rows (`found`: first, count), cut to the steps within the row group
    where the run starts when it runs on past it and the row group holds CUT_MIN_BYTES or more: the
    rest of the chunk goes back to `steps`, to start the next chunk at the next row group. So a
    stream in the stored order sends each message as a slice of one row group however its steps
    and target fall (the first message, one step, would otherwise leave every later message of
    several steps straddling two row groups, to be copied out of them). A chunk whose first step
    straddles is cut to that step (built the general way)."""
    if found is None or len(chunk.steps) == 1:
        return chunk, found
    first, n = found
    bounds = locator.group_bounds(first)
    if bounds is None or first + n <= bounds[1] or (bounds[1] - bounds[0]) * steps.sample_bytes < CUT_MIN_BYTES:
        return chunk, found
    layout, rank, end = plan.layout, plan.rank, bounds[1]
    k = max(1, bisect.bisect_right(chunk.steps, end, key=lambda s: layout.rank_range(s, rank)[1]))
    chunk = steps.cut(chunk, k)
    return chunk, (first, layout.rank_range(chunk.steps[-1], rank)[1] - first)


def _spans(plan: ReadPlan, chunk: Chunk, header: pb.ReadHeader) -> ListSpans | None:
    """The values of each document a balanced packed chunk takes (TokenWindow.starts/stops), or None:
    whole rows."""
    layout = plan.layout
    if not isinstance(layout, BalancedLayout) or layout.slices is None:
        return None
    assert chunk.samples is None  # text.pack packs whole steps
    windows = [layout.window(st.step, plan.rank) for st in header.steps]
    starts = [w.starts for w in windows if w is not None and w.starts is not None]
    stops = [w.stops for w in windows if w is not None and w.stops is not None]
    if len(starts) != len(windows):
        return None
    empty = np.empty(0, np.int64)
    return ListSpans(
        layout.slices, np.concatenate(starts) if starts else empty, np.concatenate(stops) if stops else empty
    )




def _bared(header: pb.ReadHeader, batch: pa.RecordBatch) -> tuple[pb.ReadHeader, pa.RecordBatch]:
    """`header` with the provenance of `batch`'s rows, and `batch` without its `_shard` and `_row`."""
    names = batch.schema.names
    shard_at, row_at = names.index("_shard"), names.index("_row")
    shards, rows = numpy_view(batch.column(shard_at)), numpy_view(batch.column(row_at))
    header.provenance.CopyFrom(runs_of(shards, rows))
    return header, batch.select([i for i in range(len(names)) if i not in (shard_at, row_at)])


def _size(header: pb.ReadHeader, batch: pa.RecordBatch, batch_bytes: int | None = None) -> int:
    """Bytes of the message `header` + `batch` would make, or a little more (counted, not written);
    `batch_bytes`: `ipc_size(batch)` where the caller knows it."""
    return header.ByteSize() + _FRAMING_BYTES + (ipc_size(batch) if batch_bytes is None else batch_bytes)


def _header(whole: pb.ReadHeader, infos: list[pb.StepInfo], last: bool) -> pb.ReadHeader:
    """The header of a message carrying `infos` of `whole`; end of epoch only on the last one."""
    out = pb.ReadHeader(epoch=whole.epoch, steps=infos)
    if last and whole.end_of_epoch:
        out.end_of_epoch = True
        out.dropped = whole.dropped
    return out


def _row_pieces(batch: pa.RecordBatch, start: int, end: int, budget: int) -> list[tuple[int, int]]:
    """Rows [start, end) of `batch` cut into consecutive pieces whose IPC stream fits `budget`
    (a single row larger than it is a piece of its own)."""
    n = end - start
    size = ipc_size(batch.slice(start, n))
    if n <= 1 or size <= budget:
        return [(start, end)]
    k = min(n, size // max(1, budget) + 1)
    bounds = np.linspace(start, end, k + 1).astype(np.int64).tolist()
    out: list[tuple[int, int]] = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b > a:
            out += _row_pieces(batch, a, b, budget)
    return out
