"""Shared fixtures: datasets made here, real server processes on free ports."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.manifest import Manifest
from shardstream.server.fleet import LocalServer
from shardstream.server.ingest import IngestOptions, ingest

from .seaweed import s3_env, s3_root, s3_server  # noqa: F401 — S3 fixtures (a real SeaweedFS)

# A prime row count, shards of unequal size and small row groups, so steps straddle everything.
N_ROWS = 1009


def make_table(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32)), 3),
            "label": pa.array((ids % 7).astype(np.int32)),
            "text": pa.array([f"sample-{i}" for i in ids]),
        }
    )


def write_dataset(
    root: Path, name: str, n: int, *, row_group_rows: int = 50, shard_rows: int = 230, start: int = 0
) -> Manifest:
    src = root.parent / f"src-{name}-{n}-{start}.parquet"
    pq.write_table(make_table(n, start), src)
    return ingest(
        src, name, root, IngestOptions(row_group_rows=row_group_rows, shard_rows=shard_rows, progress=False)
    )


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("data")
    root = base / "root"
    write_dataset(root, "toy", N_ROWS)
    write_dataset(root, "toy", N_ROWS, start=10_000)  # toy@2: other content, other fingerprint
    write_dataset(root, "tiny", 1, row_group_rows=1, shard_rows=1)
    return root


@pytest.fixture(scope="session")
def fleet(data_root: Path) -> Iterator[list[LocalServer]]:
    """Two servers over the same root for the whole session."""
    servers = [LocalServer(data_root, metrics=True) for _ in range(2)]
    try:
        for s in servers:
            s.start()
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="session")
def endpoints(fleet: list[LocalServer]) -> list[str]:
    return [s.target for s in fleet]


@pytest.fixture
def server_factory(data_root: Path) -> Iterator[Callable[..., LocalServer]]:
    """Servers a test may kill; all stopped at teardown."""
    started: list[LocalServer] = []

    def start(root: Path | None = None, **kwargs: object) -> LocalServer:
        s = LocalServer(root or data_root, **kwargs)  # type: ignore[arg-type]
        started.append(s)
        return s.start()

    yield start
    for s in started:
        s.stop()


def read_json(path: Path) -> object:
    return json.loads(path.read_text())


class RedisServer:
    """A private redis-server on a free port, in its own process group."""

    def __init__(self, workdir: Path, *, persistent: bool = False) -> None:
        self.workdir = workdir
        self.persistent = persistent
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        import redis

        if not self.port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
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


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server; .ci/run does this)")
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.kill()


def same_output_in_processes(code: str, hash_seeds: tuple[int, ...] = (0, 7, 12345)) -> str:
    """Run `code` in fresh interpreters with different PYTHONHASHSEEDs; assert one output, return it."""
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(h), "PATH": ""},
        ).stdout
        for h in hash_seeds
    }
    assert len(outs) == 1, outs
    return outs.pop()
