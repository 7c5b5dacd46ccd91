"""One epoch of a Loader read over several streams at once (`Loader(streams=K)`), in step order.

Stream j of K takes this loader's steps j, j + K, j + 2K, ... (a Read with `first_step` and
`step_stride`), starting on endpoint (rank + j) mod len(endpoints), so the messages of one rank are
built by up to K server processes at the same time. The prefetch thread still hands over the steps
one by one in the loader's order: for each step it takes the next step of the stream that owns it,
reading that stream's next message only when it has none left. Every stream runs ahead by
its messages in flight (gRPC's flow-control window), so the servers work in parallel while the
order, bytes and cursors are exactly those of a single stream.

A stream that breaks or whose server is unavailable is reopened — on its next endpoint — at the
first of its steps not yet received, with jittered exponential backoff, within the retry budget
(per stream; progress resets it), as a single stream is.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from shardstream.errors import UnavailableError, from_grpc_error
from shardstream.plan import StepLayout

from . import metrics

if TYPE_CHECKING:
    from .prefetch import _Item, _Producer

__all__ = ["stream_epoch_striped"]


class _Stream:
    """Stream j of K: its call, the next step it owes, received steps not yet handed over."""

    def __init__(self, j: int, endpoint: int, first_step: int) -> None:
        self.j = j
        self.endpoint = endpoint
        self.next_step = first_step  # the first of its steps not yet received
        self.call: Any = None
        self.it: Any = None
        self.ready: Iterator[_Item] = iter(())  # the received steps not handed over yet
        self.failures = 0
        self.last_error: BaseException | None = None


def stream_epoch_striped(producer: _Producer, epoch: int, offset: int) -> bool:
    """Stream one epoch from `offset` over `loader.streams` streams; False when stopped."""
    from .prefetch import _Item

    ld = producer._ld
    layout = StepLayout(ld.target.num_rows, offset, ld.world_size, ld.batch_size, ld.drop_last)
    stride = ld._stride[1]
    k = ld.streams
    if layout.num_steps == 0:  # nothing left in this epoch: no stream to open
        return producer._put(_Item(epoch, epoch + 1, ld._epoch_start_offset(), layout.dropped))
    n = len(ld.endpoints)
    streams = [_Stream(j, (ld.rank + j) % n, j * stride) for j in range(k)]
    try:
        step = 0
        while step < layout.num_steps:
            s = streams[(step // stride) % k]
            item = next(s.ready, None)
            while item is None:
                if not _fill(producer, s, epoch, offset, layout, k * stride):
                    return False
                item = next(s.ready, None)
            assert item.info is not None and item.info.step == step, (item.info, step)
            if not producer._put(item):
                return False
            step += stride
        return True
    finally:
        for s in streams:
            _close(producer, s)


def _close(producer: _Producer, s: _Stream) -> None:
    if s.call is not None:
        s.call.cancel()
        producer.close_call(s.call)
    s.call = s.it = None


def _fill(
    producer: _Producer, s: _Stream, epoch: int, offset: int, layout: StepLayout, step_stride: int
) -> bool:
    """Read stream s's next message into s.ready (reopening the stream as needed); False when stopped."""
    from .prefetch import _RETRYABLE, DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_MAX_S

    ld = producer._ld
    while not producer._stop.is_set():
        endpoint = ld.endpoints[s.endpoint]
        try:
            if s.call is None:
                s.call = producer.open_call(
                    endpoint, producer.request(epoch, offset, s.next_step, step_stride)
                )
                s.it = iter(s.call)
            producer._waiting_since = time.monotonic()
            try:
                header, payload = next(s.it)
            finally:
                producer._waiting_since = None
            if header.steps:
                s.ready = producer.decode(epoch, layout, s.next_step, step_stride, header, payload)
                s.next_step += len(header.steps) * step_stride
                s.failures = 0  # progress resets the retry budget
                return True
            # A message without steps (only an empty end of epoch): this stream owes more, so the
            # server ended it early; treat it like a broken stream.
            s.last_error = None
        except StopIteration:
            s.last_error = None  # the stream ended before the steps it owes
        except grpc.RpcError as exc:
            if producer._stop.is_set():
                return False
            if exc.code() not in _RETRYABLE:
                raise from_grpc_error(exc, target=endpoint) from exc
            s.last_error = from_grpc_error(exc, target=endpoint)
        _close(producer, s)
        s.failures += 1
        metrics.RETRIES.inc()
        if s.failures > ld.max_retries:
            raise UnavailableError(
                f"gave up on {ld.pinned} epoch {epoch} at step {s.next_step} (stream {s.j} of {ld.streams}) "
                f"after {ld.max_retries} retries over {', '.join(ld.endpoints)} "
                f"(last error: {s.last_error or 'stream ended early'})"
            )
        if len(ld.endpoints) > 1:
            metrics.FAILOVERS.inc()
        s.endpoint = (s.endpoint + 1) % len(ld.endpoints)
        backoff = min(DEFAULT_BACKOFF_MAX_S, DEFAULT_BACKOFF_BASE_S * 2 ** (s.failures - 1))
        if producer._stop.wait(random.uniform(0, backoff)):  # full jitter
            return False
    return False
