"""Run shardstream servers as local subprocesses (the demo, benchmarks and tests use this).

Each server runs in its own process group on a port it picks itself (`--port 0`); `start()` returns
once the server has written its ready file and answers a health check as SERVING, and `stop()`
sends SIGTERM, waits for the drain, and kills the whole group if it lingers. `workers` is passed as
`--workers` (1 by default here, a single process; None = the server's default, one per CPU; "auto":
grown and shrunk on the trainers' stall); the
group holds the supervisor and all its workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["LocalServer", "wait_healthy"]

DEFAULT_START_TIMEOUT_S = 60.0


def wait_healthy(
    target: str, timeout_s: float = DEFAULT_START_TIMEOUT_S, credentials: grpc.ChannelCredentials | None = None
) -> None:
    """Block until `target` answers grpc.health.v1 Check with SERVING (over TLS with `credentials`)."""
    deadline = time.monotonic() + timeout_s
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{target} not healthy after {timeout_s:g} s")
            try:
                resp = stub.Check(
                    health_pb2.HealthCheckRequest(), timeout=min(remaining, 2.0), wait_for_ready=True
                )
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)


class LocalServer:
    """`shardstream serve` in a subprocess."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        metrics: bool = False,
        extra_args: tuple[str, ...] = (),
        log_path: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        workers: int | str | None = 1,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.root = str(root)
        self.credentials = credentials  # for the health checks of a server started with --tls-cert
        self.metrics = metrics
        self.extra_args = extra_args
        self.log_path = log_path
        self.env = env
        self.workers = workers
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.data_port = 0  # of its data plane (worker i of a supervisor: data_port + i)
        self.metrics_port: int | None = None
        self.pid = 0  # the server's main process (the supervisor when workers > 1)
        self.worker_pids: list[int] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> LocalServer:
        """Start (or restart, on the same port) and wait until it serves."""
        if self._tmp is not None:
            self._tmp.cleanup()
        self._tmp = tempfile.TemporaryDirectory(prefix="shardstream-server-")
        ready = Path(self._tmp.name) / "ready.json"
        cmd = [
            sys.executable,
            "-m",
            "shardstream",
            "serve",
            "--root",
            self.root,
            "--port",
            str(self.port),  # 0 the first time: the server picks a free port
            "--data-port",
            str(self.data_port),  # likewise (a restart keeps both)
            "--ready-file",
            str(ready),
            "--grace",
            "5",
            *self.extra_args,
        ]
        if self.metrics:
            cmd += ["--metrics-port", "0"]
        if self.workers is not None:
            cmd += ["--workers", str(self.workers)]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=log, start_new_session=True, env={**os.environ, **(self.env or {})}
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with code {self.proc.returncode} before serving (cmd: {' '.join(cmd)})"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"server did not become ready in {timeout_s:g} s")
            time.sleep(0.02)
        info = self.info()
        self.port, self.metrics_port = info["port"], info["metrics_port"]
        self.data_port = info.get("data_port") or 0
        wait_healthy(self.target, max(1.0, deadline - time.monotonic()), self.credentials)
        return self

    def info(self) -> dict[str, Any]:
        """The server's ready file now: port, metrics_port, pid, workers (pids; rewritten on a restart)."""
        assert self._tmp is not None, "not started"
        info: dict[str, Any] = json.loads((Path(self._tmp.name) / "ready.json").read_text())
        self.pid, self.worker_pids = info["pid"], info.get("workers", [info["pid"]])
        return info

    def terminate(self) -> None:
        """SIGTERM: start the graceful drain (returns at once)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash, not a drain)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Drain and stop; the exit code (None if it had to be killed)."""
        code = None
        if self.proc is not None:
            self.terminate()
            try:
                code = self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
            self.kill()  # reap anything left in the group
            self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return code
