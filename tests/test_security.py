"""TLS, mTLS, bearer tokens and per-dataset access against real servers with real certificates.

Certificates are made here (tests/support/certs.py); every server is a `shardstream serve` process.
Rotation of the token file and of the certificate happen under running servers, and each test waits
on the condition it expects (a call that succeeds), never on a fixed time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from shardstream.client import Loader
from shardstream.client.credentials import ChannelSecurity
from shardstream.client.transport.channel import Connection
from shardstream.errors import (
    NotFoundError,
    PermissionDeniedError,
    ShardstreamError,
    UnauthenticatedError,
    UnavailableError,
)
from shardstream.server.policy.auth import token_sha256
from shardstream.v1 import shardstream_pb2 as pb

from .support.certs import Issued, Pki, write_atomic
from .support.data import write_dataset
from .support.processes import run_cli
from .support.servers import Servers, wait_for

TOKEN_A = "team-a-0123456789abcdef"  # toy and code*, not web
TOKEN_ALL = "all-fedcba9876543210"
WEB_ROWS = 6000


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("security") / "root"
    write_dataset(root, "toy", 500)
    write_dataset(root, "web", WEB_ROWS, row_group_rows=200, shard_rows=1500)
    write_dataset(root, "code-py", 300)
    return root


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Issued]:
    p = Pki(tmp_path_factory.mktemp("pki"))
    ca, other = p.ca("ca"), p.ca("other-ca")
    return {
        "ca": ca,
        "server": p.server(ca),
        "ci": p.client(ca, "ci", org="lab"),
        "stranger": p.client(ca, "stranger"),
        "other-ca": other,
        "forged-ci": p.client(other, "ci", org="lab", name="forged-ci"),
    }


def principals(token_a: str = TOKEN_A, *, mtls: bool = False) -> dict[str, object]:
    listed: list[dict[str, object]] = [
        {"name": "team-a", "token_sha256": token_sha256(token_a), "datasets": ["toy", "code*"]},
        {"name": "all", "token_sha256": token_sha256(TOKEN_ALL), "datasets": ["*"]},
    ]
    if mtls:  # authenticated by its certificate only: needs a server with --tls-client-ca
        listed.append({"name": "ci", "mtls_subject": "CN=ci, O=lab", "datasets": ["web@1"]})
    return {"principals": listed}


def write_auth(path: Path, doc: dict[str, object]) -> Path:
    write_atomic(path, yaml.safe_dump(doc).encode())
    return path


def tls_args(pki: dict[str, Issued], *, mtls: bool = False) -> tuple[str, ...]:
    args = ("--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key))
    return (*args, "--tls-client-ca", str(pki["ca"].cert)) if mtls else args


def creds(pki: dict[str, Issued], client: str | None = None, ca: str = "ca") -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(pki[ca].pem)
    return grpc.ssl_channel_credentials(pki[ca].pem, pki[client].key.read_bytes(), pki[client].pem)


@pytest.fixture(scope="module")
def servers(root: Path) -> Iterator[Servers]:
    with Servers(root) as s:
        yield s


@pytest.fixture(scope="module")
def tls_server(servers: Servers, pki: dict[str, Issued], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """TLS and --auth with tokens: the server most tests talk to."""
    d = tmp_path_factory.mktemp("tls-server")
    auth = write_auth(d / "auth.yaml", principals())
    log = d / "server.log"
    server = servers.start(
        extra_args=(*tls_args(pki), "--auth", str(auth)), credentials=creds(pki), log_path=log
    )
    server.auth_path, server.log_file = auth, log  # type: ignore[attr-defined]
    return server


def tls(pki: dict[str, Issued], client: str | None = None) -> dict[str, str]:
    out = {"ca": str(pki["ca"].cert)}
    if client:
        out |= {"cert": str(pki[client].cert), "key": str(pki[client].key)}
    return out


def conn(target: str, pki: dict[str, Issued], token: str = "", client: str | None = None) -> Connection:
    return Connection(target, ChannelSecurity.from_options(tls(pki, client), token))


def read_code(c: Connection, request: pb.ReadRequest) -> grpc.StatusCode:
    try:
        for _ in c.read(request, timeout_s=10):
            pass
    except ShardstreamError as exc:  # what a read call raises (client/transport/flight_call.py ReadCall)
        return exc.status
    return grpc.StatusCode.OK


def read_error(c: Connection, request: pb.ReadRequest) -> ShardstreamError:
    try:
        for _ in c.read(request, timeout_s=10):
            pass
    except ShardstreamError as exc:
        return exc
    raise AssertionError("the Read succeeded")


# --- transport --------------------------------------------------------------------------------------


def test_a_plaintext_client_fails_at_the_handshake_and_health_works_over_tls(tls_server, pki) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(tls_server.target) as ch:
        with pytest.raises(grpc.RpcError) as exc:
            ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE  # no HTTP/2 over a TLS port: the handshake failed
    with pytest.raises(UnavailableError), Loader([tls_server.target], "toy@1", batch_size=8, timeout_s=1, token=TOKEN_A) as ld:
        ld.target  # noqa: B018 — resolves the dataset: the first call
    with grpc.secure_channel(tls_server.target, creds(pki)) as ch:  # grpc.health.v1 on the same port, over TLS
        raw = ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5)
    assert raw == b"\x08\x01"  # SERVING


def test_mtls_refuses_a_certificate_from_another_ca_and_no_certificate(servers, pki, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    auth = write_auth(tmp_path / "auth.yaml", principals(mtls=True))
    server = servers.start(
        extra_args=(*tls_args(pki, mtls=True), "--auth", str(auth)), credentials=creds(pki, "ci")
    )
    for security in (tls(pki), tls(pki, "forged-ci")):  # no client certificate; one from another CA
        c = Connection(server.target, ChannelSecurity.from_options(security, ""))
        with pytest.raises(UnavailableError):
            c.list_datasets(timeout_s=5)
        c.close()
    # the certificate's subject is the principal: CN=ci may read web@1 only
    c = conn(server.target, pki, client="ci")
    assert [d.name for d in c.list_datasets(5).datasets] == ["web"]
    with pytest.raises(PermissionDeniedError):
        c.get_dataset("toy", 5)
    # a certificate of the CA whose subject is no principal's authenticates nobody
    c = conn(server.target, pki, client="stranger")
    with pytest.raises(UnauthenticatedError, match="subject"):
        c.get_dataset("web@1", 5)
    # a token, sent with a certificate, is what decides
    c = conn(server.target, pki, token=TOKEN_A, client="stranger")
    assert c.get_dataset("toy", 5).name == "toy"
    server.stop()


def test_a_loader_with_tls_and_a_token_reads_an_epoch_exactly_once_across_a_failover(servers, pki, tmp_path) -> None:  # type: ignore[no-untyped-def]
    auth = write_auth(tmp_path / "auth.yaml", principals())
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    args = (*tls_args(pki), "--auth", str(auth))
    a = servers.start(extra_args=args, credentials=creds(pki), log_path=logs[0])
    b = servers.start(extra_args=args, credentials=creds(pki), log_path=logs[1], workers=2)  # every worker: TLS + auth
    ids: list[int] = []
    with Loader(
        [a.target, b.target], "web@1", batch_size=16, seed=5, tls=tls(pki), token=TOKEN_ALL, prefetch=1,
        max_message_bytes=1,  # a step per message: the stream is long, in flight when its server dies
    ) as ld:
        for i, batch in enumerate(ld):
            ids += batch["id"].tolist()
            if i == 2:
                a.kill()  # SIGKILL mid-epoch: rank 0's stream was on the first endpoint
    assert sorted(ids) == list(range(WEB_ROWS))  # every sample exactly once
    wait_for(lambda: "method=Read principal=all dataset=web@1" in logs[1].read_text(), "b's audit line of the resumed stream")
    resumed = re.search(r"method=Read principal=all dataset=web@1 rank=0 world=1 epoch=0 offset=0 first_step=(\d+)", logs[1].read_text())
    assert resumed and int(resumed[1]) > 0, "the stream resumed on b past its start"
    for text in (p.read_text() for p in logs):
        assert TOKEN_ALL not in text


# --- tokens and per-dataset access -------------------------------------------------------------------


def test_no_token_or_an_unknown_one_is_unauthenticated(tls_server, pki, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("SHARDSTREAM_TOKEN", raising=False)
    for token in ("", "not-a-known-token"):
        with (
            Loader([tls_server.target], "toy@1", batch_size=8, tls=tls(pki), token=token) as ld,
            pytest.raises(UnauthenticatedError) as exc,
        ):
            next(iter(ld))
        assert "not-a-known-token" not in str(exc.value)
    c = conn(tls_server.target, pki)
    assert read_code(c, pb.ReadRequest(dataset="toy@1", world_size=1, batch_size=4)) == grpc.StatusCode.UNAUTHENTICATED
    monkeypatch.setenv("SHARDSTREAM_TOKEN", TOKEN_A)  # the default token
    with Loader([tls_server.target], "toy@1", batch_size=100, tls=tls(pki)) as ld:
        assert sum(len(b["id"]) for b in ld) == 500
    assert "not-a-known-token" not in tls_server.log_file.read_text()


def test_a_token_without_web_is_denied_on_get_dataset_read_and_as_a_mixture_source(tls_server, pki) -> None:  # type: ignore[no-untyped-def]
    c = conn(tls_server.target, pki, TOKEN_A)
    with pytest.raises(PermissionDeniedError):
        c.get_dataset("web", 5)
    with pytest.raises(PermissionDeniedError), Loader([tls_server.target], "web", batch_size=8, tls=tls(pki), token=TOKEN_A) as ld:
        next(iter(ld))
    read = pb.ReadRequest(dataset="web@1", world_size=1, batch_size=4)
    err = read_error(c, read)
    assert isinstance(err, PermissionDeniedError)
    mixture = pb.ReadRequest(world_size=1, batch_size=4)
    mixture.mixture.add(dataset="toy@1", weight=1.0)
    mixture.mixture.add(dataset="web@1", weight=1.0)
    err = read_error(c, mixture)
    assert err.status == grpc.StatusCode.PERMISSION_DENIED and "mixture source 1" in str(err)
    # what the answer reveals: the same words for a dataset that exists and one that does not
    details = {}
    for name in ("web", "nothing-here"):
        with pytest.raises(PermissionDeniedError) as exc:
            c.get_dataset(f"{name}@1", 5)
        details[name] = str(exc.value).replace(name, "NAME")
        assert read_error(c, pb.ReadRequest(dataset=f"{name}@1", world_size=1, batch_size=4)).status == grpc.StatusCode.PERMISSION_DENIED
    assert details["web"] == details["nothing-here"]
    # inside the principal's patterns, a dataset that does not exist is NOT_FOUND as usual
    with pytest.raises(NotFoundError):
        c.get_dataset("code-rs", 5)
    assert c.get_dataset("code-py", 5).name == "code-py"
    assert read_code(c, pb.ReadRequest(dataset="toy", world_size=1, batch_size=100)) == grpc.StatusCode.OK
    wait_for(lambda: "principal=team-a dataset=toy@1 rank=0" in tls_server.log_file.read_text(), "the audit line")
    audit = tls_server.log_file.read_text()  # the version a stream read, once planned; the request's words before
    assert "method=GetDataset principal=team-a dataset=web outcome=PERMISSION_DENIED" in audit
    assert re.search(r"method=Read principal=team-a dataset=toy@1\+web@1 .* outcome=PERMISSION_DENIED", audit)


def test_list_datasets_shows_only_what_the_caller_may_read(tls_server, pki) -> None:  # type: ignore[no-untyped-def]
    assert sorted(d.name for d in conn(tls_server.target, pki, TOKEN_A).list_datasets(5).datasets) == ["code-py", "toy"]
    assert sorted(d.name for d in conn(tls_server.target, pki, TOKEN_ALL).list_datasets(5).datasets) == ["code-py", "toy", "web"]


def test_rotating_the_token_file_takes_effect_without_a_restart(tls_server, pki) -> None:  # type: ignore[no-untyped-def]
    new_token = "team-a-rotated-5555"
    pid = tls_server.pid

    def works(token: str) -> bool:
        try:
            conn(tls_server.target, pki, token).get_dataset("toy", 5)
            return True
        except UnauthenticatedError:
            return False

    assert works(TOKEN_A) and not works(new_token)
    write_auth(tls_server.auth_path, principals(new_token))
    try:
        wait_for(lambda: works(new_token), "the rotated token to be accepted", 30)
        assert not works(TOKEN_A)
        write_atomic(tls_server.auth_path, b"principals: [oops")  # a broken edit keeps the last good file
        # the file is looked at by the next call: it is still served with the last good principals
        wait_for(lambda: works(new_token) and "does not load" in tls_server.log_file.read_text(), "the reload error", 30)
    finally:
        write_auth(tls_server.auth_path, principals())
        wait_for(lambda: works(TOKEN_A), "the first token back", 30)
    assert tls_server.info()["pid"] == pid


def test_the_certificate_is_rotated_without_a_restart(servers, pki, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = Pki(tmp_path / "pki")
    old_ca, new_ca = p.ca("old-ca"), p.ca("new-ca")
    old, new = p.server(old_ca, "old"), p.server(new_ca, "new")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_atomic(cert, old.pem)
    write_atomic(key, old.key.read_bytes())
    server = servers.start(
        extra_args=("--tls-cert", str(cert), "--tls-key", str(key)), credentials=grpc.ssl_channel_credentials(old_ca.pem)
    )

    def trusted_by(ca: Issued) -> bool:
        c = Connection(server.target, ChannelSecurity.from_options({"ca": str(ca.cert)}, ""))
        try:
            c.list_datasets(timeout_s=5)
            return True
        except UnavailableError:
            return False
        finally:
            c.close()

    assert trusted_by(old_ca) and not trusted_by(new_ca)
    write_atomic(key, new.key.read_bytes())  # the key first: a moment where the pair does not match
    write_atomic(cert, new.pem)
    wait_for(lambda: trusted_by(new_ca), "connections to get the new certificate", 30)
    assert not trusted_by(old_ca)
    assert server.proc.poll() is None


# --- safe defaults ----------------------------------------------------------------------------------


def test_an_exposed_plaintext_bind_warns_once_and_reflection_is_off_unless_asked(servers, pki, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    exposed = servers.start(extra_args=("--host", "0.0.0.0", "--reflection"), log_path=tmp_path / "exposed.log")
    quiet = servers.start(extra_args=("--host", "0.0.0.0", *tls_args(pki)), credentials=creds(pki), log_path=tmp_path / "tls.log")
    assert len(re.findall("without TLS or --auth", (tmp_path / "exposed.log").read_text())) == 1
    assert "WARNING" not in (tmp_path / "tls.log").read_text()
    reflect = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    request = b"\x3a\x00"  # ServerReflectionRequest{list_services: ""}
    with grpc.insecure_channel(exposed.target) as ch:
        assert b"shardstream.v1.ShardStream" in b"".join(ch.stream_stream(reflect)(iter([request]), timeout=5))
    with grpc.secure_channel(quiet.target, creds(pki)) as ch, pytest.raises(grpc.RpcError) as exc:
        list(ch.stream_stream(reflect)(iter([request]), timeout=5))
    assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED
    exposed.stop()
    quiet.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tls-cert", "{cert}"), "--tls-cert and --tls-key go together"),
        (("--tls-client-ca", "{ca}"), "--tls-client-ca needs --tls-cert"),
        (("--tls-cert", "{cert}", "--tls-key", "{ca}"), "not a PEM certificate chain and its private key"),
        (("--auth", "{missing}"), "--auth {missing}: No such file"),
        (("--auth", "{mtls_auth}"), "['ci'] authenticate by mtls_subject only"),
    ],
)
def test_bad_security_flags_stop_the_server_with_one_line(pki, tmp_path: Path, args, message) -> None:  # type: ignore[no-untyped-def]
    mtls_auth = write_auth(tmp_path / "auth.yaml", principals(mtls=True))
    paths = {"cert": pki["server"].cert, "ca": pki["ca"].cert, "missing": tmp_path / "missing.yaml", "mtls_auth": mtls_auth}
    argv = [a.format(**paths) for a in args]
    root = tmp_path / "root"
    root.mkdir()
    done = run_cli("serve", "--root", str(root), "--port", "0", "--workers", "1", *argv, cwd=tmp_path)
    assert done.returncode == 1
    assert message.format(**paths) in done.stderr
    assert "Traceback" not in done.stderr


def test_the_visualizers_data_source_dials_a_tls_fleet_with_a_token(tls_server, pki) -> None:  # type: ignore[no-untyped-def]
    from shardstream.viz.fleet_status import FleetMonitor
    from shardstream.viz.query import StepQuery
    from shardstream.viz.source import DataSource

    with DataSource.open(server=tls_server.target, root=None, tls=tls(pki), token=TOKEN_A) as source:
        assert [d.name for d in source.list_datasets()] == ["code-py", "toy"]
        step = source.read_step(StepQuery("toy@1", batch_size=4, step=2))
        assert len(step.batch["id"]) == 4
        with pytest.raises(PermissionDeniedError):
            source.dataset_info("web@1")
        (status,) = FleetMonitor(source.endpoints, [], source.security).status()
        assert status.health == "SERVING"  # grpc.health.v1 over the same TLS port
