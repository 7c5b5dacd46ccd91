"""shardstream servers as real processes on loopback, free ports, their /metrics, readiness waits."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardstream.server.fleet import LocalServer

__all__ = ["Servers", "scrape", "unused_port", "wait_for"]


def unused_port() -> int:
    """A loopback port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def scrape(server: LocalServer) -> dict[str, float]:
    """The server's /metrics as {'name{labels}': value}."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    out = {}
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll a readiness condition (never a fixed sleep); fail naming it after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
