"""The client's read transport: the `ReadCall` protocol the session reads through, and `FlightCall`,
the one implementation — one Read stream over a server's Arrow Flight data plane.

A `ReadCall` is an iterator of (ReadHeader, RecordBatch) messages that can be cancelled (stop, the idle
watchdog, failover) and names the server's id of its stream (`stream_id`: from the first message's
header, or from the error that ended the stream; "" until the server said). A failed call raises the
project's own error (shardstream/errors.py: `ShardstreamError`, with the exact status code, retry hint
and stream id it ended with), which the session (session.py) retries or hands on; `ReadOpener` opens
one on an endpoint. `FlightCall` is that over a Flight DoGet: the ticket is the serialized ReadRequest,
each record batch is one message's rows and its app_metadata the message's header, and a Flight error
becomes `errors.from_flight_error` (the status a shardstream server put in its extra_info).

Flight's DoGet returns only once the server sent its first message, and cannot be cancelled before
it returns; so it runs in a thread of its own and the session waits on it cancellably: a call
cancelled while it waits is given up (its thread cancels the stream as soon as DoGet returns).
Those threads are daemons, and one still inside DoGet when the interpreter finalizes is ended as it
asks for the GIL back, which can abort the process from Flight's C++ frames; so the interpreter's exit
hook (prefetch.py) waits for them too (`opening`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from shardstream.errors import ShardstreamError, from_flight_error, status_error
from shardstream.ipc import plain_batch
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["FlightCall", "Message", "ReadCall", "ReadOpener", "opening"]

Message = tuple[pb.ReadHeader, pa.RecordBatch]  # one step (or part of one) and its header


class ReadCall(Protocol):
    """One Read stream in progress: its messages, in order; raises a `ShardstreamError` when it fails."""

    def __iter__(self) -> Iterator[Message]: ...

    def cancel(self) -> object:
        """End the stream (from any thread): the iterating thread stops waiting."""
        ...

    @property
    def stream_id(self) -> str:
        """The server's id of this stream ("" until the server said; never blocks)."""
        ...

    def moved(self) -> None:
        """The server asked this stream to move (ReadHeader.move_at): the next stream opened on its
        endpoint asks where to read again."""
        ...


ReadOpener = Callable[[str, pb.ReadRequest], ReadCall]  # (endpoint, request) -> its stream

_OPENER = "flight-doget"  # the name of a thread opening a stream


def opening() -> list[threading.Thread]:
    """The threads still opening a stream (inside Flight's DoGet, or just returned from it)."""
    return [t for t in threading.enumerate() if t.name == _OPENER]


class FlightCall:
    """A `ReadCall` over one DoGet."""

    def __init__(
        self,
        client: flight.FlightClient,
        request: pb.ReadRequest | bytes,
        options: flight.FlightCallOptions,
        on_unreachable: Callable[[], None] | None = None,
        target: str = "",
    ) -> None:
        self._target = target  # the server's control address, as errors name it
        self._on_unreachable = on_unreachable  # UNAVAILABLE: ask for the data port again (_unavailable)
        # The reader uses its client's C++ channel: the client must outlive it (a Connection that
        # moves to another server, or closes, lets go of its client; this call keeps it).
        self._client = client
        self._lock = threading.Lock()
        self._opened = threading.Event()
        self._reader: flight.FlightStreamReader | None = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._stream_id = ""  # the server's, from the first message's header
        # the serialized ReadRequest (as given: a grant's proof signed these very bytes)
        ticket = flight.Ticket(request if isinstance(request, bytes) else request.SerializeToString())

        def open_stream() -> None:
            try:
                reader = client.do_get(ticket, options)
            except BaseException as exc:  # noqa: BLE001 — handed to the iterating thread
                self._error = exc
                reader = None
            with self._lock:
                self._reader = reader
                late = self._cancelled
            if late and reader is not None:
                reader.cancel()
            self._opened.set()

        threading.Thread(target=open_stream, name=_OPENER, daemon=True).start()

    def __iter__(self) -> FlightCall:
        return self

    @property
    def stream_id(self) -> str:
        return self._stream_id

    def _failed(self, exc: BaseException) -> ShardstreamError:
        error = from_flight_error(exc, target=self._target)
        self._stream_id = error.stream_id or self._stream_id
        error.stream_id = self._stream_id
        return error

    def _unavailable(self, error: ShardstreamError) -> ShardstreamError:
        """`error`; when it is UNAVAILABLE (no server at the data port, a restart, a drain, a stream its
        worker handed to a less busy one: server/serving/placement.py), the data port is asked for
        again before the next stream."""
        if error.status == grpc.StatusCode.UNAVAILABLE and self._on_unreachable is not None:
            self._on_unreachable()
        return error

    def moved(self) -> None:
        if self._on_unreachable is not None:
            self._on_unreachable()  # GetDataset again: it names the least busy worker's data port

    def _status(self, code: grpc.StatusCode, details: str) -> ShardstreamError:
        return status_error(code, details, target=self._target, stream_id=self._stream_id)

    def __next__(self) -> Message:
        if not self._opened.is_set():  # (is_set: ~0.1 us; wait takes the Event's lock, every message)
            self._opened.wait()
        if self._cancelled:
            raise self._status(grpc.StatusCode.CANCELLED, "the stream was cancelled")
        if self._error is not None:
            raise self._unavailable(self._failed(self._error)) from self._error
        assert self._reader is not None
        try:
            chunk = self._reader.read_chunk()  # StopIteration at the stream's end
        except pa.ArrowException as exc:  # FlightError, or a stream that broke while decoding
            if self._cancelled:
                raise self._status(grpc.StatusCode.CANCELLED, "the stream was cancelled") from exc
            raise self._unavailable(self._failed(exc)) from exc
        meta = chunk.app_metadata
        if meta is None:
            raise self._status(grpc.StatusCode.DATA_LOSS, "a Flight message without its ReadHeader")
        header = pb.ReadHeader.FromString(meta.to_pybytes())
        if header.stream_id:
            self._stream_id = header.stream_id
        return header, plain_batch(chunk.data)  # no Python-defined extension type past here

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            reader = self._reader
        self._opened.set()  # a wait for DoGet ends now; its thread cancels the stream once it returns
        if reader is not None:
            reader.cancel()
