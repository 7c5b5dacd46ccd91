"""RPC metrics as the grpc-ecosystem exporters name them, so existing gRPC dashboards work as they are.

    grpc_server_started_total{grpc_type, grpc_service, grpc_method}             RPCs started
    grpc_server_handled_total{grpc_type, grpc_service, grpc_method, grpc_code}  RPCs finished, by status
    grpc_server_handling_seconds{grpc_type, grpc_service, grpc_method}          start to status (histogram)

The names, labels and values are those of go-grpc-prometheus (grpc-ecosystem): `grpc_type` is
unary, client_stream, server_stream or bidi_stream; `grpc_code` is the status as grpc-go spells it
("OK", "NotFound", "ResourceExhausted", "DataLoss", "Canceled", ...). One `RpcMetrics` interceptor
on the server counts every RPC of every service it serves (ShardStream, grpc.health.v1, reflection),
whatever ends it: a handler's `context.abort` (its code), a return (OK, or the code the handler set),
an exception (Unknown, as gRPC answers it) or the client leaving (Canceled). A Read stream's
handling time is the whole stream, hence buckets up to an hour.

One recorder, `MethodMetrics` (one method's series: `start()` an RPC, `done(t0, code)` at its end),
serves both planes: the interceptor above for the gRPC port, the Flight data plane's call middleware
for its DoGet (data_plane.py).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio
from prometheus_client import Counter, Histogram

__all__ = ["KNOWN_CODES", "MethodMetrics", "RpcMetrics", "code_name", "preinitialize"]

STARTED = Counter(
    "grpc_server_started_total", "RPCs started on the server", ["grpc_type", "grpc_service", "grpc_method"]
)
HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, regardless of success or failure",
    ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
)
HANDLING_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Time from an RPC's start to its status on the server (a Read: the whole stream)",
    ["grpc_type", "grpc_service", "grpc_method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)

# grpc-go's spelling of the codes that are not CamelCase of the Python name
_GO_NAMES = {grpc.StatusCode.OK: "OK", grpc.StatusCode.CANCELLED: "Canceled"}


def code_name(code: grpc.StatusCode) -> str:
    """A status code as grpc-go (and so the grpc-ecosystem exporters) spells it: DATA_LOSS -> DataLoss."""
    return _GO_NAMES.get(code) or "".join(w.capitalize() for w in code.name.split("_"))


# The statuses shardstream's handlers end calls with: their series are exported at 0 from the start.
KNOWN_CODES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.CANCELLED,
)


def preinitialize(
    service: str, methods: dict[str, str], codes: tuple[grpc.StatusCode, ...] = KNOWN_CODES
) -> None:
    """Export 0 for the series known to exist: `methods` maps each method to its grpc_type."""
    for method, kind in methods.items():
        STARTED.labels(kind, service, method)
        HANDLING_SECONDS.labels(kind, service, method)
        for code in (grpc.StatusCode.OK, *codes):
            HANDLED.labels(kind, service, method, code_name(code))


def _kind(handler: grpc.RpcMethodHandler) -> str:
    if handler.request_streaming:
        return "bidi_stream" if handler.response_streaming else "client_stream"
    return "server_stream" if handler.response_streaming else "unary"


class MethodMetrics:
    """The metric children of one method (grpc_type, grpc_service, grpc_method): an RPC's start, and
    the recording of its end with its status."""

    def __init__(self, kind: str, service: str, method: str) -> None:
        self.started = STARTED.labels(kind, service, method)
        self.seconds = HANDLING_SECONDS.labels(kind, service, method)
        self._labels = (kind, service, method)
        self._handled: dict[str, Any] = {}

    def start(self) -> float:
        """Count an RPC started: its start time, for `done`."""
        self.started.inc()
        return time.perf_counter()

    def done(self, t0: float, code: str) -> None:
        """The RPC started at `t0` ended with `code` (grpc-go's spelling: `code_name`)."""
        self.seconds.observe(time.perf_counter() - t0)
        child = self._handled.get(code)
        if child is None:
            child = self._handled[code] = HANDLED.labels(*self._labels, code)
        child.inc()


def _end_code(context: aio.ServicerContext, exc: BaseException | None) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return "Canceled"
    if exc is not None and not isinstance(exc, aio.AbortError):
        return "Unknown"  # what gRPC answers for an exception the handler let escape
    code = context.code()  # set by set_code(); None when the handler just returned
    return code_name(code) if isinstance(code, grpc.StatusCode) else "OK"


class _Counted:
    """The context a handler sees: `abort()` records the RPC's end before the status leaves (so a
    client that saw it and scrapes at once finds it counted); everything else is the real context's."""

    def __init__(self, context: aio.ServicerContext, call: MethodMetrics, t0: float) -> None:
        self._context = context
        self._call = call
        self._t0 = t0
        self.recorded = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def record(self, code: str) -> None:
        if not self.recorded:
            self.recorded = True
            self._call.done(self._t0, code)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> Any:
        self.record(code_name(code))
        return await self._context.abort(code, details, trailing_metadata)


def _wrap(behavior: Callable[..., Any], call: MethodMetrics) -> Callable[..., Any]:
    """The handler's behaviour, counted. Async generators (streaming responses) stay generators."""
    if inspect.isasyncgenfunction(behavior):

        async def generator(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
            counted = _Counted(context, call, call.start())
            error: BaseException | None = None
            try:
                async for item in behavior(request, counted):
                    yield item
            except BaseException as exc:
                error = exc
                raise
            finally:
                counted.record(_end_code(context, error))

        return generator

    async def coroutine(request: Any, context: aio.ServicerContext) -> Any:
        counted = _Counted(context, call, call.start())
        error: BaseException | None = None
        try:
            result = behavior(request, counted)
            return await result if inspect.isawaitable(result) else result
        except BaseException as exc:
            error = exc
            raise
        finally:
            counted.record(_end_code(context, error))

    return coroutine


_FACTORIES = {
    "unary": grpc.unary_unary_rpc_method_handler,
    "server_stream": grpc.unary_stream_rpc_method_handler,
    "client_stream": grpc.stream_unary_rpc_method_handler,
    "bidi_stream": grpc.stream_stream_rpc_method_handler,
}


class RpcMetrics(aio.ServerInterceptor):
    """Counts every RPC the server handles (see the module docstring); handlers wrapped once per method."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler  # unknown method: gRPC answers UNIMPLEMENTED itself
        full = handler_call_details.method  # "/package.Service/Method"
        cached = self._wrapped.get(full)
        if cached is not None and cached[0] is handler:
            return cached[1]
        kind = _kind(handler)
        service, _, method = full.lstrip("/").rpartition("/")
        behavior = (
            handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
        )
        wrapped = _FACTORIES[kind](
            _wrap(behavior, MethodMetrics(kind, service, method)),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        self._wrapped[full] = (handler, wrapped)
        return wrapped
