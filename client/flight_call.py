"""One Read stream over a server's Arrow Flight data plane, shaped as the grpcio call the session uses.

The session (session.py) iterates a call for (ReadHeader, rows) pairs, cancels it (stop, the idle
watchdog, failover) and asks it for its initial metadata (the server's stream id: here from the
first message's header, or from the error that ended the stream); a failed call raises a
`grpc.RpcError`. `FlightCall` is that over a Flight DoGet: the ticket is the serialized
ReadRequest, each record batch is one message's rows and its app_metadata the message's header,
and a Flight error becomes `errors.FlightStatus` (the exact status code and retry hint a shardstream
server put in its extra_info).

Flight's DoGet returns only once the server sent its first message, and cannot be cancelled before
it returns; so it runs in a thread of its own and the session waits on it cancellably: a call
cancelled while it waits is given up (its thread cancels the stream as soon as DoGet returns).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from shardstream.errors import FlightStatus
from shardstream.ipc import STREAM_ID_METADATA, plain_batch
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["FlightCall"]


class FlightCall:
    """A cancellable iterator of (ReadHeader, RecordBatch) over one DoGet."""

    def __init__(
        self,
        client: flight.FlightClient,
        request: pb.ReadRequest | bytes,
        options: flight.FlightCallOptions,
        on_unreachable: Callable[[], None] | None = None,
    ) -> None:
        self._on_unreachable = on_unreachable  # the data port refused the call: ask for it again
        # The reader uses its client's C++ channel: the client must outlive it (a Connection that
        # moves to another server, or closes, lets go of its client; this call keeps it).
        self._client = client
        self._lock = threading.Lock()
        self._opened = threading.Event()
        self._reader: flight.FlightStreamReader | None = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._done = False
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

        threading.Thread(target=open_stream, name="flight-doget", daemon=True).start()

    def __iter__(self) -> FlightCall:
        return self

    def __next__(self) -> tuple[pb.ReadHeader, pa.RecordBatch]:
        self._opened.wait()
        if self._cancelled:
            self._done = True
            raise FlightStatus(grpc.StatusCode.CANCELLED, "the stream was cancelled")
        if self._error is not None:
            self._done = True
            status = FlightStatus.of(self._error)
            self._stream_id = status.stream_id or self._stream_id
            if status.code() == grpc.StatusCode.UNAVAILABLE and self._on_unreachable is not None:
                self._on_unreachable()
            raise status from self._error
        assert self._reader is not None
        try:
            chunk = self._reader.read_chunk()
        except StopIteration:
            self._done = True
            raise
        except pa.ArrowException as exc:  # FlightError, or a stream that broke while decoding
            self._done = True
            if self._cancelled:
                raise FlightStatus(grpc.StatusCode.CANCELLED, "the stream was cancelled") from exc
            status = FlightStatus.of(exc)
            self._stream_id = status.stream_id or self._stream_id
            raise status from exc
        meta = chunk.app_metadata
        if meta is None:
            raise FlightStatus(grpc.StatusCode.DATA_LOSS, "a Flight message without its ReadHeader")
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

    def done(self) -> bool:
        return self._done or self._opened.is_set()  # headers are in once DoGet returned

    def initial_metadata(self) -> list[tuple[str, str]]:
        """The server's stream id as gRPC initial metadata would carry it (the session logs it)."""
        return [(STREAM_ID_METADATA, self._stream_id)] if self._stream_id else []
