"""shardstream servers as real processes on loopback, free ports, their /metrics, readiness waits."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtest.chaos_net import data_port_behind, free_port
from shardstream.server.local_fleet import LocalServer

__all__ = [
    "Metrics",
    "Servers",
    "data_port_behind",
    "rpc_count",
    "scrape",
    "unused_port",
    "unused_port_outside",
    "unused_port_range",
    "wait_for",
]


unused_port = free_port  # a loopback port nothing listens on right now (the OS picks it)


def unused_port_range(n: int) -> int:
    """The first of `n` consecutive loopback ports nothing listens on right now."""
    for _ in range(200):
        first = unused_port()
        if first + n > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for p in range(first, first + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports found")


def unused_port_outside(first: int, n: int) -> int:
    """A free port that is not one of first..first+n-1."""
    while (port := unused_port()) in range(first, first + n):
        pass
    return port


class Servers:
    """`shardstream serve` processes (LocalServer: own process group, free port, ready file) started
    on demand over `root`; leaving the `with` block stops every one of them, killed or not."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[LocalServer] = []

    def start(self, root: Path | None = None, **kwargs: Any) -> LocalServer:
        server = LocalServer(root or self.root, **kwargs)
        self.started.append(server)  # before start(): a server that fails to start is stopped too
        return server.start()

    def stop_all(self) -> None:
        for server in self.started:
            server.stop()

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


class Metrics(dict[str, float]):
    """{'name{labels}': value}; a bare name is the sum over its label sets, 0 for a labelled metric
    with no series yet (shardstream_rows_sent_total{dataset=...} before the first stream)."""

    def __missing__(self, key: str) -> float:
        if "{" in key:
            raise KeyError(key)
        return 0.0


def scrape(server: LocalServer) -> Metrics:
    """The server's /metrics as {'name{labels}': value}, plus {'name': the sum over its label sets}
    for labelled series (shardstream_rows_sent_total sums its `dataset` series): see Metrics."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    out: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
            if "{" in key:
                name = key.partition("{")[0]
                sums[name] = sums.get(name, 0.0) + float(value)
    return Metrics({**sums, **out})


def rpc_count(metrics: dict[str, float], method: str, code: str | None = None) -> float:
    """From `scrape`: grpc_server_started_total of a ShardStream method, or with `code` (as grpc-go
    spells it: "NotFound", "DataLoss") grpc_server_handled_total; "Read" is the data plane's Flight
    DoGet."""
    if method == "Read":
        labels = (
            'grpc_method="DoGet",grpc_service="arrow.flight.protocol.FlightService",grpc_type="server_stream"'
        )
    else:
        labels = f'grpc_method="{method}",grpc_service="shardstream.v1.ShardStream",grpc_type="unary"'
    if code is None:
        return metrics[f"grpc_server_started_total{{{labels}}}"]
    return metrics[f'grpc_server_handled_total{{grpc_code="{code}",{labels}}}']


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll a readiness condition (never a fixed sleep); fail naming it after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
