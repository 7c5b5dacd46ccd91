"""Errors of shardstream, and the one place they map to and from gRPC status codes.

    ShardstreamError
    ├── InvalidArgumentError (also ValueError)   INVALID_ARGUMENT   a malformed request or bad input
    ├── NotFoundError (also LookupError)         NOT_FOUND          unknown dataset, version or tag
    │   └── NoCommittedStepError                                    a job has no step all its ranks committed
    ├── FailedPreconditionError                  FAILED_PRECONDITION  state made on another fingerprint
    │   ├── CursorStoreBehindError                                  the cursor store lost commits
    │   └── StaleRunError                                           a newer run of the job holds this rank
    ├── ResourceExhaustedError                   RESOURCE_EXHAUSTED  server overloaded
    ├── DataLossError                            DATA_LOSS          a shard failed a check
    │   └── CorruptCursorError                                      a stored cursor record is unreadable
    ├── UnavailableError                         UNAVAILABLE        no server / storage reachable
    │   └── UnclaimedError                                          the cursor store holds no run of the job
    ├── UnauthenticatedError                     UNAUTHENTICATED
    ├── PermissionDeniedError                    PERMISSION_DENIED
    └── InternalError                            INTERNAL / anything unmapped

A subclass has its base's code. The five drawn under a base are the job cursors' (client/cursors/:
records, runs and fencing, resume): raised where the cursor store is read or written — a trainer, the
`shardstream cursor` commands — never sent by a server, so `from_grpc_error` maps each code to a base.

gRPC itself never produces INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE or
DATA_LOSS, so when a client sees one the server sent it on purpose. `RETRYABLE_CODES` are the codes
on which a client resumes a stream elsewhere instead of failing. An overloaded server says how long
to leave it alone in the trailing metadata `grpc-retry-pushback-ms` (gRPC's own key for a server's
retry hint): `ResourceExhaustedError.retry_after_s` on the way out, `retry_pushback_s` on the way in.

On the Arrow Flight data plane (Read streams: server/serving/data_plane.py) the same status travels as a Flight
error: `to_flight_error` picks the nearest Flight error class (Flight has none for INVALID_ARGUMENT,
NOT_FOUND, DATA_LOSS or RESOURCE_EXHAUSTED: a plain Flight client sees UNKNOWN with the code named
at the start of the message) and puts the exact code, the message and the retry hint in the
error's `extra_info` as JSON; `from_flight_error(exc)` reads them back on the client as the
shardstream error a read call raises (its exact code, retry hint and stream id kept:
`ShardstreamError.status`, `.retry_after_s`, `.stream_id`); `FlightStatus.of(exc)` is the same status
shaped as a `grpc.RpcError` (for a plain Flight client's checks).

A message that quotes what a caller sent quotes `excerpt(text)` — its repr, cut to EXCERPT_CHARS —
so an error never echoes a request back (a server's answer to untrusted input stays small and says
which value was wrong, not the whole of it).
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as flight

__all__ = [
    "CorruptCursorError",
    "CursorStoreBehindError",
    "DataLossError",
    "EXCERPT_CHARS",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NoCommittedStepError",
    "NotFoundError",
    "PermissionDeniedError",
    "RETRYABLE_CODES",
    "RETRY_ONCE_CODES",
    "RETRY_PUSHBACK_KEY",
    "FlightStatus",
    "ResourceExhaustedError",
    "ShardstreamError",
    "StaleRunError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnclaimedError",
    "clears_by_waiting",
    "excerpt",
    "from_flight_error",
    "from_grpc_error",
    "retry_pushback_s",
    "status_error",
    "to_flight_error",
]


# Of a caller's value quoted in an error message: a whole dataset name (at most 128 characters),
# not a whole request (a reference may have 512, transform parameters 64 KiB).
EXCERPT_CHARS = 128


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    """`text` quoted as an error message may quote it: its repr, whole when short, else cut to `limit`
    characters and followed by its length."""
    shown = repr(text)
    if len(shown) <= limit + 2:  # the quotes
        return shown
    size = f" ({len(text)} characters)" if isinstance(text, str) else ""
    return f"{shown[:limit]}...{shown[-1] if isinstance(text, str) else ''}{size}"


class ShardstreamError(Exception):
    """Base of every error shardstream raises on purpose.

    An error that ended a call (`status_error`, `from_grpc_error`, `from_flight_error`) keeps the exact
    status code it came with in `status` (UNKNOWN is an InternalError, DEADLINE_EXCEEDED an
    UnavailableError, yet a client retries on both: RETRYABLE_CODES), the server's retry hint in
    `retry_after_s` and the server's id of the stream it ended in `stream_id`."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retry_after_s: float | None = None
    stream_id: str = ""
    _status: grpc.StatusCode | None = None

    @property
    def status(self) -> grpc.StatusCode:
        """The status code this error came with (its class's own when it was raised here)."""
        return self._status or self.grpc_code


class InvalidArgumentError(ShardstreamError, ValueError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(ShardstreamError, LookupError):
    grpc_code = grpc.StatusCode.NOT_FOUND


class FailedPreconditionError(ShardstreamError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(ShardstreamError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s  # sent as RETRY_PUSHBACK_KEY

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        if self.retry_after_s is None:
            return ()
        return ((RETRY_PUSHBACK_KEY, str(max(0, round(self.retry_after_s * 1000)))),)


class DataLossError(ShardstreamError):
    grpc_code = grpc.StatusCode.DATA_LOSS


class UnavailableError(ShardstreamError):
    grpc_code = grpc.StatusCode.UNAVAILABLE


class UnauthenticatedError(ShardstreamError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(ShardstreamError):
    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class InternalError(ShardstreamError):
    grpc_code = grpc.StatusCode.INTERNAL


# --- job cursors (client/cursors/) ---------------------------------------------------------------
class NoCommittedStepError(NotFoundError):
    """The job has no step committed by all of its ranks (or not the one asked for)."""


class CursorStoreBehindError(FailedPreconditionError):
    """The store's latest committed step is older than the checkpoint being restored: it lost commits."""


class StaleRunError(FailedPreconditionError):
    """A newer run of the job holds this rank: this process may not commit its cursors any more."""


class CorruptCursorError(DataLossError):
    """A stored cursor is garbage, truncated, of another format or of another job."""


class UnclaimedError(UnavailableError):
    """The store holds no run of the job at all (it was wiped, or restarted without persistence): the
    writer claims its rank again and retries, since no newer run can have taken it."""


_BY_CODE: dict[grpc.StatusCode, type[ShardstreamError]] = {
    cls.grpc_code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        FailedPreconditionError,
        ResourceExhaustedError,
        DataLossError,
        UnavailableError,
        UnauthenticatedError,
        PermissionDeniedError,
        InternalError,
    )
}
# Codes gRPC produces itself on transport trouble: all mean "try another server".
_BY_CODE[grpc.StatusCode.DEADLINE_EXCEEDED] = UnavailableError


# A stream that ends with one of these is resumed — on the next endpoint — at its first missing step.
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,  # no server there, or it is stopping
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # an overloaded server: another may have room
        grpc.StatusCode.CANCELLED,  # a draining server cancels its streams
        grpc.StatusCode.UNKNOWN,  # a connection cut mid-stream
    }
)
# A stream that ends with one of these is tried once more on another endpoint before the error reaches
# the training loop: that server's copy may be the bad one (a corrupt disk-cache file, a bug of one
# build during a rollout), and a second failure is then the data's or the request's, not the server's.
RETRY_ONCE_CODES = frozenset({grpc.StatusCode.DATA_LOSS, grpc.StatusCode.INTERNAL})
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"


def clears_by_waiting(error: ShardstreamError) -> bool:
    """Whether a call that failed with `error` may succeed if made again (elsewhere, later): a
    RETRYABLE_CODES status, but not a RESOURCE_EXHAUSTED without a retry hint — an overloaded server
    says when to come back, a quota or a full store does not, and waiting does not clear them."""
    if error.status is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return getattr(error, "retry_after_s", None) is not None
    return error.status in RETRYABLE_CODES


def retry_pushback_s(exc: grpc.RpcError) -> float | None:
    """The server's retry hint on a failed RPC, in seconds (None when it gave none)."""
    try:
        metadata = exc.trailing_metadata() or ()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 — an RpcError without metadata (a local failure)
        return None
    for key, value in metadata:
        if key == RETRY_PUSHBACK_KEY:
            try:
                ms = int(value)
            except (TypeError, ValueError):
                return None
            return ms / 1000 if ms >= 0 else None
    return None


def status_error(
    code: grpc.StatusCode,
    details: str,
    *,
    target: str = "",
    retry_after_s: float | None = None,
    stream_id: str = "",
) -> ShardstreamError:
    """The shardstream error for a call that ended with status `code` (the one mapping of codes to
    classes; the code, retry hint and stream id are kept on the error: ShardstreamError)."""
    cls = _BY_CODE.get(code, InternalError)
    where = f" (server {target})" if target else ""
    err = cls(f"{details}{where}" if cls is not UnavailableError else f"{code.name}: {details}{where}")
    err._status = code
    err.retry_after_s = retry_after_s
    err.stream_id = stream_id
    return err


def from_grpc_error(exc: grpc.RpcError, *, target: str = "") -> ShardstreamError:
    """The shardstream error for a failed RPC (raise it `from exc`)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    stream_id = getattr(exc, "stream_id", "")
    return status_error(
        code,
        details,
        target=target,
        retry_after_s=retry_pushback_s(exc),
        stream_id=stream_id if isinstance(stream_id, str) else "",
    )


# --- the Flight data plane ------------------------------------------------------------------------
_FLIGHT_CLASS: dict[grpc.StatusCode, type[flight.FlightError]] = {
    grpc.StatusCode.UNAVAILABLE: flight.FlightUnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: flight.FlightUnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: flight.FlightUnauthorizedError,
    grpc.StatusCode.CANCELLED: flight.FlightCancelledError,
    grpc.StatusCode.DEADLINE_EXCEEDED: flight.FlightTimedOutError,
    grpc.StatusCode.INTERNAL: flight.FlightInternalError,
}  # any other code: FlightServerError (UNKNOWN on the wire), the exact code in extra_info
_FLIGHT_CODE = {cls: code for code, cls in _FLIGHT_CLASS.items()}


def to_flight_error(
    code: grpc.StatusCode, message: str, retry_after_s: float | None = None, stream_id: str = ""
) -> flight.FlightError:
    """The Flight error a Flight handler raises for a status `code` with a client-facing `message`
    (and the server's id of the stream it ends, which its log lines name)."""
    info: dict[str, Any] = {"code": code.name, "message": message}
    if stream_id:
        info["stream_id"] = stream_id
    if retry_after_s is not None:
        info["retry_pushback_ms"] = round(retry_after_s * 1000)
    cls = _FLIGHT_CLASS.get(code, flight.FlightServerError)
    return cls(f"{code.name}: {message}", extra_info=json.dumps(info).encode())


class FlightStatus(grpc.RpcError):
    """A failed Flight call as a gRPC status: code(), details() and trailing_metadata() (the retry
    hint), read from the error's extra_info when a shardstream server sent it, else from its class."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        metadata: tuple[tuple[str, str], ...] = (),
        stream_id: str = "",
    ) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self._metadata = code, details, metadata
        self.stream_id = stream_id  # the server's id of the stream the error ended, when it said

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    @classmethod
    def of(cls, exc: BaseException) -> FlightStatus:
        """`exc` (a FlightError, or another Arrow error a Flight reader raised) as a status."""
        info: dict[str, Any] = {}
        raw = getattr(exc, "extra_info", None)
        if raw:
            try:
                info = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                info = {}
        code = getattr(grpc.StatusCode, str(info.get("code")), None) if info else None
        if not isinstance(code, grpc.StatusCode):
            code = next(
                (c for k, c in _FLIGHT_CODE.items() if isinstance(exc, k)),
                grpc.StatusCode.UNKNOWN if isinstance(exc, flight.FlightError) else grpc.StatusCode.INTERNAL,
            )
        details = info.get("message")
        if not isinstance(details, str):  # Flight's own text: the status, then its debug context
            details = str(exc).split(". gRPC client debug context", 1)[0]
            if isinstance(exc, pa.ArrowException) and not isinstance(exc, flight.FlightError):
                details = f"the data plane's stream broke: {details}"
        ms = info.get("retry_pushback_ms")
        metadata = ((RETRY_PUSHBACK_KEY, str(ms)),) if isinstance(ms, int) else ()
        stream_id = info.get("stream_id")
        return cls(code, details, metadata, stream_id if isinstance(stream_id, str) else "")


def from_flight_error(exc: BaseException, *, target: str = "") -> ShardstreamError:
    """The shardstream error for a failed Flight call (a FlightError, or another Arrow error a Flight
    reader raised): the exact code, retry hint and stream id a shardstream server sent (raise it `from exc`)."""
    return from_grpc_error(FlightStatus.of(exc), target=target)
