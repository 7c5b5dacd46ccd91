"""The prefetch thread of a Loader: epochs of one rank's steps, decoded and handed over a bounded queue.

One `Producer` per iteration of a Loader, given a `ReadSpec` and where to resume. It streams the
rank's steps epoch by epoch — over one stream session, or K striped ones (striped.py) — and queues
decoded items; any exception, wrapped, goes the same way and is raised in the consumer's thread.
The consumer's `get()` also watches for a stream that has gone silent (session.CallRegistry).

A single stream is followed without a gap (make before break): the next epoch's stream is opened
while the rank has AHEAD_STEPS of its steps and a message's worth or more left to read, and when the
stream's worker hands it to a less busy one (ReadHeader.move_at: server/serving/placement.py) its
successor is opened from the step the header names — on the least busy worker GetDataset names —
and takes over there. Either way the new stream's server plans it and builds its first message while
the rank still reads the old one, instead of the rank's queue draining while it does (a new stream's
first message may take longer than the queue lasts: a row group to read, slow transforms). K striped
streams open the next epoch's K ahead the same way (striped.py); they are not moved.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref

from shardstream.threads import join_all, name_native

from .decode import Item, decode_message
from .spec import ReadSpec
from .striped import StripedEpochs
from .transport.flight_call import ReadOpener, opening
from .transport.session import CallRegistry, StreamSession

__all__ = ["Done", "Producer"]

_POLL_S = 0.1
AHEAD_STEPS = 4  # a successor stream is opened this many of the rank's steps before it takes over
_EXIT_JOIN_S = 5.0  # how long the interpreter's exit waits, in all, for the prefetch threads still streaming


class Done:
    """The end of the stream (every epoch read)."""


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Producer:
    """The background thread: streams, failover, decode; hands results over a bounded queue."""

    def __init__(self, spec: ReadSpec, open_call: ReadOpener, epoch: int, offset: int) -> None:
        self._spec = spec
        # A bounded queue made of two C queues (queue.SimpleQueue): the items, and one token per
        # free place (spec.prefetch of them) that the thread takes before it queues an item and the
        # consumer gives back as it takes one. queue.Queue(maxsize) bounds the same way, but each
        # put and get runs its Condition in Python: ~10 us a batch between the two threads.
        self._items: queue.SimpleQueue[Item | Done | _Failed] = queue.SimpleQueue()
        self._room: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(spec.prefetch):
            self._room.put(None)
        self._calls = CallRegistry(open_call)
        self._endpoint = spec.rank % len(spec.endpoints)  # the single stream's; kept across epochs
        self._next: StreamSession | None = None  # the next epoch's stream, opened ahead
        self._message_steps = 0  # the most of the rank's steps (x stride) one message has held
        self._striped = StripedEpochs(spec, self._calls, self._put, AHEAD_STEPS) if spec.streams > 1 else None
        self._thread = threading.Thread(
            target=self._run, args=(epoch, offset), name=f"shardstream-prefetch-r{spec.rank}", daemon=True
        )
        self._thread.start()
        _LIVE.add(self)

    @property
    def endpoint(self) -> str:
        """The endpoint the rank's (first) stream reads from now."""
        return self._spec.endpoints[self._endpoint % len(self._spec.endpoints)]

    def get(self) -> Item | Done:
        """The next item (blocking); re-raises the thread's exception."""
        while True:
            try:
                item = self._items.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._items.empty():
                    raise RuntimeError("the shardstream prefetch thread died without a result") from None
                self._calls.check_idle(self._spec.retry.idle_timeout_s)
                continue
            self._room.put(None)
            if isinstance(item, _Failed):
                raise item.exc
            return item

    def stop(self, timeout_s: float = 30.0) -> None:
        self.cancel()
        self._thread.join(timeout=timeout_s)

    def cancel(self) -> None:
        """Cancel the streams and stop the thread at its next step, without waiting for it."""
        _LIVE.discard(self)
        self._calls.stop()

    def _put(self, item: Item | Done | _Failed) -> bool:
        """Queue an item, waiting for room; False once stopped."""
        while not self._calls.stopped.is_set():
            try:
                self._room.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            self._items.put(item)
            return True
        return False

    def _run(self, epoch: int, offset: int) -> None:
        spec = self._spec
        name_native(f"prefetch-r{spec.rank}")  # in top -H (its Python name is longer than Linux keeps)
        try:
            stream_epoch = self._stream_epoch if self._striped is None else self._striped.stream
            while spec.epochs is None or epoch < spec.epochs:
                if not stream_epoch(epoch, offset):
                    return
                epoch, offset = epoch + 1, spec.epoch_start(epoch + 1)
            self._put(Done())
        except BaseException as exc:  # handed to the consumer, never swallowed here
            self._put(_Failed(exc))
        finally:
            if self._next is not None:
                self._next.close()
            if self._striped is not None:
                self._striped.close()

    def _session(self, epoch: int, offset: int, first_step: int, endpoint: int) -> StreamSession:
        """A stream of the epoch's steps (from `offset`) from `first_step` on, on `endpoint`."""
        spec = self._spec
        stride = spec.split.workers
        return StreamSession(
            self._calls,
            lambda step: spec.request(epoch, offset, step, stride),
            endpoints=spec.endpoints,
            endpoint=endpoint,
            first_step=first_step,
            step_stride=stride,
            retry=spec.retry,
            what=f"{spec.label} epoch {epoch}",
            rank_metrics=spec.metrics,
        )

    def _stream_epoch(self, epoch: int, offset: int) -> bool:
        """Stream one epoch from `offset` over one session (or, after a move, its successors);
        False when stopped."""
        spec = self._spec
        layout = spec.layout(offset, epoch)
        stride = spec.split.workers
        ahead = AHEAD_STEPS * stride
        session = self._next or self._session(epoch, offset, 0, self._endpoint)  # opened ahead: this epoch's
        self._next = None
        successor: StreamSession | None = None  # the one a move asked for, from a later step
        try:
            while True:
                first = session.next_step
                message = session.next_message()
                if message is None:
                    return False
                header, rows = message
                if header.move_at and successor is None:
                    session.moved()  # the next stream asks GetDataset: the least busy worker's port
                    if header.move_at < layout.num_steps:
                        successor = self._session(epoch, offset, header.move_at, session.endpoint)
                        successor.open()
                    elif self._next is not None:  # too near the epoch's end: the next epoch's stream moves
                        self._next.close()
                        self._next = None  # opened again below, or when its epoch starts
                # The next epoch's stream, opened as this message arrives (before its items are
                # queued, while the rank still has them and what the queue holds to read) once what
                # is left after it is AHEAD_STEPS and a message's worth (the most steps a message
                # has held: the next stream's first is as large) or less. So the rank has at least
                # that much left to read while the next stream's server builds its first message;
                # checked after the message's items are queued instead, an epoch whose last message
                # is short opened it a few steps before its end.
                self._message_steps = max(self._message_steps, len(header.steps) * stride)
                if self._next is None and layout.num_steps - session.next_step <= ahead + self._message_steps:
                    self._open_next(epoch + 1, session.endpoint)
                # a message that runs past where the successor starts (several steps in one) hands
                # over only the steps before it
                until = successor.first_step if successor is not None else layout.num_steps
                crossed = session.next_step > until
                for item in decode_message(spec, epoch, layout, first, stride, header, rows):
                    if crossed and (item.info is None or item.info.step >= until):
                        break
                    if not self._put(item):
                        return False
                if successor is not None and session.next_step >= successor.first_step:
                    session.close()  # the old stream ended there (or ends now)
                    session, successor = successor, None
                    continue
                if header.end_of_epoch:
                    return True
        finally:
            self._endpoint = session.endpoint
            session.close()
            if successor is not None:
                successor.close()

    def _open_next(self, epoch: int, endpoint: int) -> None:
        """Open the stream of `epoch` (the next one) ahead, when the read goes on to it."""
        spec = self._spec
        if spec.epochs is not None and epoch >= spec.epochs:
            return
        self._next = self._session(epoch, spec.epoch_start(epoch), 0, endpoint)
        self._next.open()


# Producers whose thread may still stream: a Loader iterated in a DataLoader worker is never closed,
# and its iteration ends only when the worker's interpreter exits.
_LIVE: weakref.WeakSet[Producer] = weakref.WeakSet()


@atexit.register
def _stop_live_producers() -> None:
    """At the interpreter's exit, before it finalizes: cancel and join every prefetch thread still
    streaming. A daemon thread still inside Arrow's C++ (a Flight read) when the interpreter finalizes
    is ended by CPython with pthread_exit as it asks for the GIL back, and that unwinding through C++
    frames can abort the process ("terminate called without an active exception": a DataLoader
    worker killed by SIGABRT at shutdown). The threads still inside a DoGet (transport/flight_call.py)
    are waited for in the same deadline, for the same reason."""
    producers = list(_LIVE)
    for producer in producers:  # every stream cancelled first: the threads end side by side
        producer.cancel()
    # then their threads, and any DoGet of a stream just cancelled still in Flight's C++
    join_all([*(p._thread for p in producers), *opening()], _EXIT_JOIN_S)
