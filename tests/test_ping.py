"""`shardstream ping HOST:PORT` and the Loader's error at a port that is not a control port, against
real servers: a plaintext one (its control, data and metrics ports), one with TLS and --auth, and a
port nothing listens on. Each answer is one line; only a usable control port exits 0."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from shardstream import __version__
from shardstream.client import Loader
from shardstream.errors import InvalidArgumentError
from shardstream.server.local_fleet import LocalServer
from shardstream.server.policy.auth import token_sha256

from .support.certs import Issued, Pki, write_atomic
from .support.data import write_dataset
from .support.processes import run_cli
from .support.servers import Servers, unused_port, unused_port_range

TOKEN = "ping-test-0123456789abcdef"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ping") / "root"
    write_dataset(root, "toy", 300)
    write_dataset(root, "web", 200)
    return root


@pytest.fixture(scope="module")
def servers(root: Path) -> Iterator[Servers]:
    with Servers(root) as s:
        yield s


@pytest.fixture(scope="module")
def plain(servers: Servers, root: Path) -> LocalServer:
    """A server on serve's default layout: the data port is the control port + 1."""
    port = unused_port_range(2)
    server = LocalServer(root, metrics=True)
    server.port, server.data_port = port, port + 1
    servers.started.append(server)
    return server.start()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Issued]:
    p = Pki(tmp_path_factory.mktemp("pki"))
    ca = p.ca("ca")
    return {"ca": ca, "server": p.server(ca)}


@pytest.fixture(scope="module")
def secure(servers: Servers, pki: dict[str, Issued], tmp_path_factory: pytest.TempPathFactory) -> LocalServer:
    import grpc

    auth = tmp_path_factory.mktemp("auth") / "auth.yaml"
    doc = {"principals": [{"name": "toy-only", "token_sha256": token_sha256(TOKEN), "datasets": ["toy"]}]}
    write_atomic(auth, yaml.safe_dump(doc).encode())
    args = ("--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key), "--auth", str(auth))
    return servers.start(extra_args=args, credentials=grpc.ssl_channel_credentials(pki["ca"].pem))


def ping(*args: str, cwd: Path) -> tuple[int, list[str]]:
    proc = run_cli("ping", *args, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout.splitlines() + proc.stderr.splitlines()


def test_ping_says_what_answers_at_each_port_of_a_server(plain: LocalServer, tmp_path: Path) -> None:
    control, data, metrics = (f"127.0.0.1:{p}" for p in (plain.port, plain.data_port, plain.metrics_port))
    code, lines = ping(control, cwd=tmp_path)
    assert code == 0 and len(lines) == 1, lines
    assert lines[0].startswith(f"{control}: shardstream control port (server {__version__})")
    assert "2 datasets visible to this caller: toy@1, web@1" in lines[0] and f"data port {plain.data_port}" in lines[0]

    code, lines = ping(data, cwd=tmp_path)
    assert code == 1 and lines == [
        f"{data}: shardstream data port (Arrow Flight streams), not a control port: give clients {control}, its control port"
    ]
    code, lines = ping(metrics, cwd=tmp_path)
    assert code == 1 and len(lines) == 1 and "shardstream metrics port (Prometheus /metrics, server " in lines[0]

    nothing = f"127.0.0.1:{unused_port()}"
    code, lines = ping(nothing, cwd=tmp_path)
    assert code == 1 and lines == [f"{nothing}: nothing listens there (connection refused)"]

    # several at once, as JSON: exit 0 only when every one is a usable control port
    proc = run_cli("ping", control, data, "--json", cwd=tmp_path)
    got = json.loads(proc.stdout)
    assert proc.returncode == 1 and [r["kind"] for r in got] == ["control", "data"] and got[1]["control"] == control


def test_ping_says_tls_and_auth_are_required_and_reads_with_them(
    secure: LocalServer, pki: dict[str, Issued], tmp_path: Path
) -> None:
    target = f"127.0.0.1:{secure.port}"
    code, lines = ping(target, cwd=tmp_path)
    assert code == 1 and len(lines) == 1
    assert re.fullmatch(rf"{target}: TLS required \(certificate for .*localhost.*, issued by shardstream test ca\): ping it with --tls-ca .*", lines[0])
    code, lines = ping(target, "--tls-ca", str(pki["ca"].cert), cwd=tmp_path)
    assert code == 1 and lines == [
        f"{target}: shardstream control port; auth required: it requires a token (serve --auth): ping it with "
        "--token-file FILE (or $SHARDSTREAM_TOKEN)"
    ]
    token = tmp_path / "token.txt"
    token.write_text("wrong-token-0123456789")
    code, lines = ping(target, "--tls-ca", str(pki["ca"].cert), "--token-file", str(token), cwd=tmp_path)
    assert code == 1 and lines == [f"{target}: shardstream control port; auth required: it refuses this caller's token"]
    token.write_text(TOKEN)
    code, lines = ping(target, "--tls-ca", str(pki["ca"].cert), "--token-file", str(token), cwd=tmp_path)
    assert code == 0 and len(lines) == 1 and "1 dataset visible to this caller: toy@1;" in lines[0]
    # a bad address is one line too
    code, lines = ping("no-port-here", cwd=tmp_path)
    assert code == 1 and len(lines) == 1 and "is not 'host:port'" in lines[0]


def test_a_loader_at_the_data_or_metrics_port_says_which_port_to_use(plain: LocalServer) -> None:
    control = f"127.0.0.1:{plain.port}"
    with pytest.raises(InvalidArgumentError) as exc:
        with Loader([f"127.0.0.1:{plain.data_port}"], "toy", batch_size=4, timeout_s=30) as loader:
            next(iter(loader))
    assert f"give clients {control}, its control port" in str(exc.value)
    with pytest.raises(InvalidArgumentError) as exc:
        with Loader([f"127.0.0.1:{plain.metrics_port}"], "toy", batch_size=4, timeout_s=30) as loader:
            next(iter(loader))
    assert "shardstream metrics port" in str(exc.value) and "not a control port" in str(exc.value)
