"""The fixtures, and nothing else: what they start or make comes from tests/support/.

Real processes on free loopback ports, each in its own process group, stopped at teardown.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardstream.client.cursors.stores import MemoryStore
from shardstream.server.local_fleet import LocalServer

from .support.data import N_ROWS, write_dataset
from .support.redis_server import RedisServer
from .support.seaweed import S3Server, private_root, start_seaweed
from .support.servers import Servers


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
    with Servers(data_root) as servers:
        yield [servers.start(metrics=True) for _ in range(2)]


@pytest.fixture(scope="session")
def endpoints(fleet: list[LocalServer]) -> list[str]:
    return [s.target for s in fleet]


@pytest.fixture
def server_factory(data_root: Path) -> Iterator[Callable[..., LocalServer]]:
    """Servers a test may kill; all stopped at teardown."""
    with Servers(data_root) as servers:
        yield servers.start


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server; .ci/run does this)")
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.kill()


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A cursor store of each kind: this process's memory, an SQLite file, a private Redis."""
    if request.param == "memory":
        MemoryStore.clear()
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/cursors.db"
    return str(request.getfixturevalue("redis_server").url)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS for the session, on free loopback ports."""
    server = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The S3 variables set for this test (and the server processes it starts)."""
    env = s3_server.env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def s3_root(s3_env: dict[str, str]) -> str:
    """A private, empty registry root on the S3 server."""
    return private_root()
