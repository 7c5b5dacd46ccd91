"""One epoch of a Loader read over several streams at once (`Loader(streams=K)`), in step order.

Stream j of K takes this loader's steps j, j + K, j + 2K, ... (a Read with `first_step` and
`step_stride`), starting on endpoint (rank + j) mod len(endpoints), so the messages of one rank are
built by up to K server processes at the same time. The prefetch thread still hands over the steps
one by one in the loader's order: for each step it takes the next step of the stream that owns it,
reading that stream's next message only when it has none left. Every stream runs ahead by
its messages in flight (gRPC's flow-control window), so the servers work in parallel while the
order, bytes and cursors are exactly those of a single stream.

Each stream is a `StreamSession` (transport/session.py): one that breaks or whose server is
unavailable is reopened — on its next endpoint — at the first of its steps not yet received, with
jittered exponential backoff, within the retry budget (per stream; progress resets it), as a single
stream is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from shardstream.order.scheduled_steps import Layout

from .decode import Item, decode_message, empty_epoch
from .spec import ReadSpec
from .transport.session import CallRegistry, StreamSession

__all__ = ["stream_epoch_striped"]


def stream_epoch_striped(
    spec: ReadSpec, calls: CallRegistry, put: Callable[[Item], bool], epoch: int, offset: int
) -> bool:
    """Stream one epoch from `offset` over `spec.streams` sessions, handing items to `put` in step
    order; False when stopped (by `calls.stop()` or `put` returning False)."""
    layout = spec.layout(offset, epoch)
    if layout.num_steps == 0:  # nothing left in this epoch: no stream to open
        return put(empty_epoch(spec, epoch, layout.dropped))
    stride = spec.split.workers  # this reader's step stride (data-loader workers)
    k = spec.streams
    n = len(spec.endpoints)
    sessions = [
        StreamSession(
            calls,
            lambda step: spec.request(epoch, offset, step, k * stride),
            endpoints=spec.endpoints,
            endpoint=(spec.rank + j) % n,
            first_step=j * stride,
            step_stride=k * stride,
            retry=spec.retry,
            what=f"{spec.label} epoch {epoch} (stream {j} of {k})",
            rank_metrics=spec.metrics,
        )
        for j in range(k)
    ]
    ready: list[Iterator[Item]] = [iter(()) for _ in range(k)]  # received steps not handed over yet
    try:
        step = 0
        while step < layout.num_steps:
            j = (step // stride) % k
            item = next(ready[j], None)
            while item is None:
                filled = _fill(spec, sessions[j], epoch, layout)
                if filled is None:
                    return False
                ready[j] = filled
                item = next(ready[j], None)
            assert item.info is not None and item.info.step == step, (item.info, step)
            if not put(item):
                return False
            step += stride
        return True
    finally:
        for s in sessions:
            s.close()


def _fill(spec: ReadSpec, s: StreamSession, epoch: int, layout: Layout) -> Iterator[Item] | None:
    """The items of session s's next message with steps; None when stopped."""
    while True:
        first = s.next_step
        message = s.next_message()
        if message is None:
            return None
        header, rows = message
        if header.steps:
            return decode_message(spec, epoch, layout, first, s.step_stride, header, rows)
        # A message without steps (only an empty end of epoch): this stream owes more, so the
        # server ended it early; treat it like a broken stream.
        if not s.retry(None):
            return None
