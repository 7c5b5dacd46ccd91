"""The metrics port: Prometheus `/metrics`, and `/healthz` and `/readyz` for HTTP probes.

    GET /metrics   the exposition (any other path too, as prometheus-client serves it)
    GET /healthz   200 "ok" once the server has started serving, until it exits (also while it
                   drains: a liveness probe must not kill a draining server); 503 before
    GET /readyz    200 "ready" while it serves and is not draining; 503 "starting" / "draining"

They exist for probes that cannot speak gRPC's health protocol, such as the kubelet's against a TLS
port (the chart's `probes.mode: http`); `grpc.health.v1` on the gRPC port answers the same
questions. A single process answers for itself. A supervisor (`--workers N > 1`) answers for its
workers: started once all of them served for the first time, ready while at least one serves and
it is not draining (while a dead worker is replaced, the others take the port's connections).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import CollectorRegistry

__all__ = ["Health", "start_status_server"]


class Health:
    """What /healthz and /readyz say; the server sets it as it starts, serves and drains."""

    def __init__(self, serving: Callable[[], bool] | None = None) -> None:
        self.started = False
        self.draining = False
        self._serving = serving or (lambda: True)  # a supervisor: is any worker serving now?

    def live(self) -> bool:
        return self.started

    def ready(self) -> bool:
        return self.started and not self.draining and self._serving()

    def why_not_ready(self) -> str:
        if not self.started:
            return "starting"
        return "draining" if self.draining else "no worker serving"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # probes every few seconds would flood the log


def _app(registry: CollectorRegistry, health: Health) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/healthz", "/readyz"):
            ok = health.live() if path == "/healthz" else health.ready()
            body = (
                (b"ok\n" if path == "/healthz" else b"ready\n")
                if ok
                else (health.why_not_ready() + "\n").encode()
            )
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [body]
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    return app


def start_status_server(port: int, host: str, registry: CollectorRegistry, health: Health) -> WSGIServer:
    """Serve the metrics port in a daemon thread; the server (`server_port`: the port, when 0 was asked)."""
    name = host.strip("[]") or "0.0.0.0"  # "[::]" as grpc takes it
    family, _, _, _, sockaddr = socket.getaddrinfo(
        name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(sockaddr[0], port, _app(registry, health), Server, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="shardstream-metrics", daemon=True).start()
    return httpd
