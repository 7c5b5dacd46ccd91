"""A private redis-server (the Debian binary) on a free loopback port, in its own process group.

The one copy, used by the chaos suite (loadtest/chaos*.py: Redis killed, restarted, wiped) and by
the tests (tests/support/redis_server.py re-exports it; tests/conftest.py makes the fixture). It
lives in loadtest/ for the reason loadtest/seaweed.py does: loadtest never imports tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis

__all__ = ["RedisServer"]


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """start() waits until it answers PING; kill() is SIGKILL to its process group. A restart keeps
    the port (and, with `persistent`, the append-only file in `workdir`; an RDB snapshot taken with
    SAVE is loaded too). `appendfsync` applies with `persistent`; `args` are more redis-server
    options (e.g. ["--rename-command", "CONFIG", ""], as managed Redis services disable CONFIG)."""

    def __init__(
        self,
        workdir: Path,
        *,
        persistent: bool = False,
        appendfsync: str = "always",
        args: Sequence[str] = (),
    ) -> None:
        self.workdir = workdir
        self.persistent = persistent
        self.appendfsync = appendfsync
        self.args = list(args)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        if not self.port:
            self.port = _unused_port()
        persistence = (
            ["--appendonly", "yes", "--appendfsync", self.appendfsync]
            if self.persistent
            else ["--appendonly", "no"]
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
                str(self.workdir),
                *persistence,
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.02)
        client.close()
        return self

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None
