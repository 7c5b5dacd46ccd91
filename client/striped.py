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

Make before break, as a single stream does (prefetch.py): the next epoch's K streams are opened while
the rank still has `ahead` of its steps and one message's span (the most of the rank's steps one
stream's message has reached over: its steps x K) or less left to hand over, so their servers plan
them and build their first messages while the rank reads the end of this epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from shardstream.order.scheduled_steps import Layout

from .decode import Item, decode_message, empty_epoch
from .spec import ReadSpec
from .transport.session import CallRegistry, StreamSession

__all__ = ["StripedEpochs"]


class StripedEpochs:
    """A rank's epochs over `spec.streams` sessions each; the next epoch's opened ahead."""

    def __init__(self, spec: ReadSpec, calls: CallRegistry, put: Callable[[Item], bool], ahead_steps: int) -> None:
        self._spec, self._calls, self._put = spec, calls, put
        self._ahead = ahead_steps * spec.split.workers  # in the rank's steps
        self._span = 0  # the most of the rank's steps one message of one stream has reached over
        self._next: tuple[int, Layout, list[StreamSession]] | None = None  # (epoch, layout, sessions) opened ahead

    def stream(self, epoch: int, offset: int) -> bool:
        """Stream epoch `epoch` from `offset`, handing items to `put` in step order; False when
        stopped (by `calls.stop()` or `put` returning False)."""
        spec = self._spec
        ahead, self._next = self._next, None
        assert ahead is None or ahead[0] == epoch, (ahead[0], epoch)  # the Producer reads epochs in order
        layout = ahead[1] if ahead is not None else spec.layout(offset, epoch)
        if layout.num_steps == 0:  # nothing left in this epoch: no stream to open
            return self._put(empty_epoch(spec, epoch, layout.dropped))
        sessions = ahead[2] if ahead is not None else self._sessions(epoch, offset)
        stride = spec.split.workers  # this reader's step stride (data-loader workers)
        k = spec.streams
        ready: list[Iterator[Item]] = [iter(()) for _ in range(k)]  # received steps not handed over yet
        try:
            step = 0
            while step < layout.num_steps:
                j = (step // stride) % k
                item = next(ready[j], None)
                while item is None:
                    filled = self._fill(sessions[j], epoch, layout)
                    if filled is None:
                        return False
                    ready[j] = filled
                    item = next(ready[j], None)
                assert item.info is not None and item.info.step == step, (item.info, step)
                if self._next is None and layout.num_steps - step <= self._ahead + self._span:
                    self._open_next(epoch + 1)  # before this step is queued: the rank still has it to read
                if not self._put(item):
                    return False
                step += stride
            return True
        finally:
            _close(sessions)

    def close(self) -> None:
        """Close the next epoch's streams if they were opened ahead."""
        if self._next is not None:
            _close(self._next[2])
            self._next = None

    def _sessions(self, epoch: int, offset: int) -> list[StreamSession]:
        spec = self._spec
        stride = spec.split.workers
        k = spec.streams
        n = len(spec.endpoints)
        return [
            StreamSession(
                self._calls,
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

    def _open_next(self, epoch: int) -> None:
        """Open the K streams of `epoch` (the next one) ahead, when the read goes on to one with steps."""
        spec = self._spec
        if spec.epochs is not None and epoch >= spec.epochs:
            return
        offset = spec.epoch_start(epoch)
        layout = spec.layout(offset, epoch)
        sessions = self._sessions(epoch, offset) if layout.num_steps else []
        for s in sessions:
            s.open()
        self._next = (epoch, layout, sessions)

    def _fill(self, s: StreamSession, epoch: int, layout: Layout) -> Iterator[Item] | None:
        """The items of session s's next message with steps; None when stopped."""
        while True:
            first = s.next_step
            message = s.next_message()
            if message is None:
                return None
            header, rows = message
            if header.steps:
                self._span = max(self._span, len(header.steps) * s.step_stride)
                return decode_message(self._spec, epoch, layout, first, s.step_stride, header, rows)
            # A message without steps (only an empty end of epoch): this stream owes more, so the
            # server ended it early; treat it like a broken stream.
            if not s.retry(None):
                return None


def _close(sessions: list[StreamSession]) -> None:
    for s in sessions:
        s.close()
