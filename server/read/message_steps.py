"""Which steps each Read message of a stream covers, and what a stream reserves before building one.

`MessageSteps` decides what each build covers: one step first, for a quick first batch, then as
many steps as the last message says fit its target (at most MAX_STEPS_PER_MESSAGE): the client's
`max_message_bytes`, or the server's default (2 MiB), which the data plane raises up to 8 MiB while
its buffer budget has room for every stream's messages at that size (`grown_target`). A
step whose samples would not fit the cap is built in parts of its samples, each sized from the
bytes a sample took so far, when every transform is per-sample (build.py cuts a built message still
over the cap). `Message` is what a build makes (build.py), `build_estimate` what a stream reserves before one
(server/serving/admission.py).
Pure arithmetic over the plan: no data is read here.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

from shardstream.ipc import ipc_bytes
from shardstream.v1 import shardstream_pb2 as pb

from .balanced_layout import rank_positions
from .plan import ReadPlan

__all__ = [
    "BUILD_PEAK_FACTOR",
    "GROWN_MESSAGE_BYTES",
    "MAX_STEPS_PER_MESSAGE",
    "Chunk",
    "Message",
    "MessageSteps",
    "build_estimate",
    "grown_target",
]

MAX_STEPS_PER_MESSAGE = 4096
# A build takes the rows (gather.py: the pieces, their concatenation, the reordering take) before it
# lets go of its intermediates: about twice the message at its peak, measured on block shuffle.
BUILD_PEAK_FACTOR = 2
GROWN_MESSAGE_BYTES = 8 << 20  # the largest target `grown_target` gives
# What a stream holds at most, in messages of its target: the build's reservation (BUILD_PEAK_FACTOR)
# and the message Flight is writing, with one to spare
_HELD_MESSAGES = BUILD_PEAK_FACTOR + 2


def grown_target(target: int, cap: int, budget_bytes: int, streams: int) -> int:
    """A stream's message target raised from `target` (the server's default) towards
    GROWN_MESSAGE_BYTES, as far as the buffer budget holds every one of `streams` streams' messages
    at that size (a stream holds up to _HELD_MESSAGES of them); never over `cap`, never under
    `target`.

    A gathered message's build and send cost a fixed ~0.3-0.4 ms of Python and Arrow calls besides
    its copy (the cache lease, the gather's arrays, the header and sizes, Flight's hand-over, the
    client's decode): at 2 MiB, ~0.15-0.2 CPU-s a GB on each side. A server with room for larger
    messages sends fewer: 2 MiB steps, block shuffle, 1 KiB rows, a step a message at 1.35x the
    server CPU of a Flight server gathering the same rows, two (5 MiB) at 1.07x, three (8 MiB) at
    0.97x (loadtest/README.md, "Shuffled streams at Flight's gathering cost"). A server with many
    streams keeps the default, so the budget admits as many as before."""
    share = budget_bytes // (_HELD_MESSAGES * max(1, streams))
    return max(target, min(GROWN_MESSAGE_BYTES, cap, share))


class Chunk(NamedTuple):
    """What one build covers: whole `steps`, or samples [start, end) of the one step in `steps`."""

    steps: range
    samples: tuple[int, int] | None = None  # of the rank's samples of the step; None: all of each
    last: bool = True  # the chunk ends its step (always true of whole steps)



class Message(NamedTuple):
    """One built Read message: its header and its rows (the Flight data plane sends the rows as a
    record batch and the header as its app_metadata) and what it carries. (Chunk and Message are
    named tuples: a frozen dataclass costs ~1 us more to make, twice a message.)"""

    header: pb.ReadHeader
    batch: pa.RecordBatch
    steps: int  # steps it completes: its whole steps, or 1 for the last part of a step
    rows: int
    parts: bool = False  # it carries a part of a step
    nbytes: int = 0  # on the wire: header + IPC stream, counted (not written)
    holds: int = 0  # of memory let go with it: its Arrow buffers, whole; 0 where a later message of
    # its build holds them (MessageBuilder._group_run)

    def wire(self) -> tuple[bytes, bytes]:
        """(header, IPC stream) as bytes: what the message is on the wire, for comparing streams."""
        return self.header.SerializeToString(), ipc_bytes(self.batch).to_pybytes()



def build_estimate(plan: ReadPlan, last: Message | None, target: int | None = None) -> int:
    """Bytes a stream reserves before building its next message: BUILD_PEAK_FACTOR times the
    message it expects — the first, one step at the plan's estimated bytes per sample; later ones,
    what the last one held, or the message target (`target`, else the plan's) if more (the builder
    grows messages towards it) — never over BUILD_PEAK_FACTOR times the server's message cap."""
    if last is None:
        if plan.first_step >= min(plan.end_step, plan.layout.num_steps):
            expected = 0.0  # the end-of-epoch message only
        else:
            expected = len(rank_positions(plan.layout, plan.first_step, plan.rank)) * plan.sample_bytes
    else:
        expected = max(last.holds, plan.max_message_bytes if target is None else target)
    return int(BUILD_PEAK_FACTOR * max(1.0, min(expected, plan.message_cap_bytes)))


class MessageSteps:
    """The chunks of one stream, every `plan.stride`-th step from `plan.first_step`."""

    def __init__(self, plan: ReadPlan) -> None:
        self._plan = plan
        self.step = plan.first_step  # the first step no chunk covers yet
        self.sample = 0  # in a step built in parts: its first sample not built yet
        self.per_message = 1  # one step first, for a quick first batch
        self.sample_bytes = max(1.0, plan.sample_bytes)
        # bytes a message aims at: the plan's, or more where the data plane grows it (`grown_target`);
        # set before a build, it sizes the chunks after it
        self.target = plan.max_message_bytes

    @property
    def remaining(self) -> bool:
        return self.step < self._plan.end_step

    def _samples(self, step: int) -> int:
        return len(rank_positions(self._plan.layout, step, self._plan.rank))

    def next(self) -> Chunk:
        """The next chunk (call only while `remaining`)."""
        p = self._plan
        if p.split_steps and p.per_sample:
            n = self._samples(self.step)
            if self.sample or (n > 1 and n * self.sample_bytes > p.message_cap_bytes):
                k = max(1, int(p.message_cap_bytes // self.sample_bytes))
                start, end = self.sample, min(n, self.sample + k)
                chunk = Chunk(range(self.step, self.step + 1), (start, end), last=end == n)
                self.sample = 0 if chunk.last else end
                if chunk.last:
                    self.step += p.stride
                return chunk
        steps = range(self.step, min(p.end_step, self.step + self.per_message * p.stride), p.stride)
        self.step = steps[-1] + p.stride
        return Chunk(steps)

    def cut(self, chunk: Chunk, k: int) -> Chunk:
        """The first `k` whole steps of `chunk`, the last chunk `next` gave; its other steps are
        given back, to start the next chunk."""
        assert chunk.samples is None and 0 < k < len(chunk.steps) and self.step == chunk.steps[-1] + self._plan.stride
        self.step = chunk.steps[k]
        return Chunk(chunk.steps[:k])

    def ahead(self, messages: int) -> range:
        """The steps of the next `messages` messages if they are the size of the last (read-ahead's guess)."""
        p = self._plan
        return range(self.step, min(p.end_step, self.step + self.per_message * messages * p.stride), p.stride)

    def record(self, chunk: Chunk, rows: int, nbytes: int, samples: int | None = None) -> None:
        """Size the next chunks from one built chunk of `nbytes` in all and `rows` rows (of
        `samples` samples, if known: else counted)."""
        if not rows:
            return
        if samples is None and chunk.samples is not None:
            samples = chunk.samples[1] - chunk.samples[0]
        elif samples is None:
            samples = sum(self._samples(s) for s in chunk.steps)
        self.sample_bytes = max(1.0, nbytes / max(1, samples))
        if chunk.samples is None:
            self.per_message = max(
                1, min(MAX_STEPS_PER_MESSAGE, self.target * len(chunk.steps) // nbytes)
            )
