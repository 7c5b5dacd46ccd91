"""One Read stream over a server's Arrow Flight data plane, shaped as the grpcio call the session uses.

The session (session.py) iterates a call for (ReadHeader, rows) pairs, cancels it (stop, the idle
watchdog, failover) and asks it for its initial metadata (the server's stream id); a failed call
raises a `grpc.RpcError`. `FlightCall` is that over a Flight DoGet: the ticket is the serialized
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
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from shardstream.errors import FlightStatus
from shardstream.framing import STREAM_ID_METADATA
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["FlightCall", "HeaderCapture"]


class _Headers(flight.ClientMiddleware):  # type: ignore[misc]
    def __init__(self, into: dict[str, Any]) -> None:
        self._into = into

    def received_headers(self, headers: dict[str, list[Any]]) -> None:
        self._into.update(headers)


class HeaderCapture(flight.ClientMiddlewareFactory):  # type: ignore[misc]
    """Hands the response headers of a DoGet to the FlightCall that made it in this thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def start_call(self, info: flight.CallInfo) -> _Headers | None:
        into = getattr(self._local, "into", None)
        return _Headers(into) if into is not None else None

    def capture(self, into: dict[str, Any] | None) -> None:
        self._local.into = into


class FlightCall:
    """A cancellable iterator of (ReadHeader, RecordBatch) over one DoGet."""

    def __init__(
        self,
        client: flight.FlightClient,
        headers: HeaderCapture,
        request: pb.ReadRequest,
        options: flight.FlightCallOptions,
        on_unreachable: Callable[[], None] | None = None,
    ) -> None:
        self._on_unreachable = on_unreachable  # the data port refused the call: ask for it again
        self._lock = threading.Lock()
        self._opened = threading.Event()
        self._reader: flight.FlightStreamReader | None = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._done = False
        self._headers: dict[str, Any] = {}
        ticket = flight.Ticket(request.SerializeToString())

        def open_stream() -> None:
            headers.capture(self._headers)
            try:
                reader = client.do_get(ticket, options)
            except BaseException as exc:  # noqa: BLE001 — handed to the iterating thread
                self._error = exc
                reader = None
            finally:
                headers.capture(None)
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
            raise FlightStatus.of(exc) from exc
        meta = chunk.app_metadata
        if meta is None:
            raise FlightStatus(grpc.StatusCode.DATA_LOSS, "a Flight message without its ReadHeader")
        return pb.ReadHeader.FromString(meta.to_pybytes()), chunk.data

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
        values = self._headers.get(STREAM_ID_METADATA) or []
        if not values:
            return []
        value = values[0]
        return [(STREAM_ID_METADATA, value.decode() if isinstance(value, bytes) else str(value))]
