"""Data-plane grants (server/policy/grants.py, shardstream/grant_proof.py): bound to the certificate they
were issued to by a proof of possession of its key, never wider than a token on the same call, and
a supervisor's grant key kept off every command line and environment of its processes.

Real `shardstream serve` processes with real certificates (tests/support/certs.py); the DoGets are
plain pyarrow Flight clients, so each header a test sends or leaves out is the one named.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow.flight as flight
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from shardstream.client import Loader
from shardstream.client.credentials import ChannelSecurity
from shardstream.client.transport.channel import Connection
from shardstream.errors import FlightStatus, InvalidArgumentError, UnauthenticatedError
from shardstream.grant_proof import GRANT_HEADER, Prover, fingerprint
from shardstream.server.local_fleet import LocalServer
from shardstream.server.policy.auth import Authenticator, Principal, normalize_subject, token_sha256
from shardstream.server.policy.grants import GRANT_TTL_S, Grants, new_key
from shardstream.v1 import shardstream_pb2 as pb

from .support.certs import Issued, Pki
from .support.data import write_dataset
from .support.servers import Servers

N = 600
TOKEN_WEB = "team-web-0123456789abcdef"  # web only
TOKEN_SECRET = "secret-token-fedcba9876543210"  # never sent: must not show up in any process


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grants") / "root"
    write_dataset(root, "toy", N, row_group_rows=100, shard_rows=300)
    write_dataset(root, "web", 200)
    return root


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Issued]:
    p = Pki(tmp_path_factory.mktemp("pki"))
    ca = p.ca("ca")
    return {
        "ca": ca,
        "server": p.server(ca),
        "ci": p.client(ca, "ci", org="lab"),
        "other": p.client(ca, "other"),
        "stranger": p.client(ca, "stranger"),
    }


def auth_doc() -> dict[str, object]:
    return {
        "principals": [
            {"name": "ci", "mtls_subject": "CN=ci, O=lab", "datasets": ["toy"]},
            {"name": "other", "mtls_subject": "CN=other", "datasets": ["toy", "web"]},
            {"name": "team-web", "token_sha256": token_sha256(TOKEN_WEB), "datasets": ["web"]},
            {"name": "secret", "token_sha256": token_sha256(TOKEN_SECRET), "datasets": ["*"]},
        ]
    }


def mtls_args(pki: dict[str, Issued], auth: Path) -> tuple[str, ...]:
    return (
        "--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key),
        "--tls-client-ca", str(pki["ca"].cert), "--auth", str(auth),
    )  # fmt: skip


@pytest.fixture(scope="module")
def servers(root: Path) -> Iterator[Servers]:
    with Servers(root) as s:
        yield s


@pytest.fixture(scope="module")
def server(servers: Servers, pki: dict[str, Issued], tmp_path_factory: pytest.TempPathFactory) -> LocalServer:
    auth = tmp_path_factory.mktemp("auth") / "auth.yaml"
    auth.write_text(yaml.safe_dump(auth_doc()))
    ci = pki["ci"]
    creds = grpc.ssl_channel_credentials(pki["ca"].pem, ci.key.read_bytes(), ci.pem)
    return servers.start(extra_args=mtls_args(pki, auth), credentials=creds)


def tls(pki: dict[str, Issued], who: str) -> dict[str, str]:
    return {"ca": str(pki["ca"].cert), "cert": str(pki[who].cert), "key": str(pki[who].key)}


def grant_of(server: LocalServer, pki: dict[str, Issued], who: str, token: str = "") -> bytes:
    c = Connection(server.target, ChannelSecurity.from_options(tls(pki, who), token))
    try:
        return c.get_dataset("toy@1", 5).data_grant
    finally:
        c.close()


def prover(issued: Issued) -> Prover:
    return Prover.from_pem(issued.pem, issued.key.read_bytes())


def ticket(dataset: str = "toy@1", start: int = 0) -> bytes:
    return pb.ReadRequest(dataset=dataset, batch_size=50, world_size=1, start_offset=start).SerializeToString()


def doget(
    port: int, pki: dict[str, Issued], who: str, headers: list[tuple[bytes, bytes]], raw_ticket: bytes
) -> grpc.StatusCode:
    """A DoGet over a connection made with `who`'s certificate, sending exactly `headers`."""
    c = flight.connect(
        f"grpc+tls://127.0.0.1:{port}",
        tls_root_certs=pki["ca"].pem,
        cert_chain=pki[who].pem,
        private_key=pki[who].key.read_bytes(),
    )
    try:
        c.do_get(flight.Ticket(raw_ticket), flight.FlightCallOptions(headers=headers)).read_all()
        return grpc.StatusCode.OK
    except flight.FlightError as exc:
        return FlightStatus.of(exc).code()
    finally:
        c.close()


def bearer(token: str) -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {token}".encode())


# --- the proof, alone --------------------------------------------------------------------------------


def self_signed(key: Any, cn: str) -> bytes:
    """A self-signed certificate (DER) for `key` (Ed25519 signs without a separate hash)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


def as_flight_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, list[str]]:
    """Headers as pyarrow's Flight server hands them to its middleware."""
    out: dict[str, list[str]] = {}
    for k, v in headers:
        out.setdefault(k.decode(), []).append(v.decode())
    return out


KEYS = {
    "ec": lambda: ec.generate_private_key(ec.SECP256R1()),
    "rsa": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ed25519": ed25519.Ed25519PrivateKey.generate,
}


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_grant_is_the_certificates_it_was_issued_to_and_expires(kind: str, tmp_path: Path) -> None:
    auth_file = tmp_path / "auth.yaml"
    auth_file.write_text(
        yaml.safe_dump({"principals": [{"name": "ci", "mtls_subject": "CN=ci", "datasets": ["*"]}]})
    )
    auth = Authenticator(str(auth_file))
    (ci,) = auth.file.principals()  # type: ignore[union-attr]
    mine = Prover(self_signed(key := KEYS[kind](), "ci"), key)
    theirs = Prover(self_signed(other := KEYS[kind](), "other"), other)
    grants = Grants(new_key())
    grant = grants.issue(ci, fingerprint(mine.certificate_der), now=1000.0)

    def check(headers: list[tuple[bytes, bytes]], for_ticket: bytes = ticket(), now: float = 1000.0) -> str:
        try:
            return grants.principal(as_flight_headers(headers), for_ticket, auth, now=now).name
        except UnauthenticatedError as exc:
            return str(exc)

    assert check(mine.headers(grant, ticket())) == "ci"
    assert check(mine.headers(grant, ticket()), now=1000.0 + GRANT_TTL_S - 1) == "ci"
    assert "expired" in check(mine.headers(grant, ticket()), now=1000.0 + GRANT_TTL_S + 1)
    # the proof is for one ticket: a copy of it does not read another
    assert "does not verify" in check(mine.headers(grant, ticket()), ticket(start=100))
    # another certificate, with a proof of its own key: not the one the grant names
    assert "another client certificate" in check(theirs.headers(grant, ticket()))
    # the grant's certificate sent by another key's holder: the signature gives it away
    (g, _), (c, der), (p, _) = mine.headers(grant, ticket())
    forged = theirs.headers(grant, ticket())[2][1]
    assert "does not verify" in check([(g, grant), (c, der), (p, forged)])
    assert "needs its proof" in check([(GRANT_HEADER.encode(), grant)])
    assert "needs its proof" in check([(g, grant), (c, der)])
    # not this server's key; not a grant at all
    elsewhere = Grants(new_key()).issue(ci, fingerprint(mine.certificate_der), now=1000.0)
    assert "not this server's" in check(mine.headers(elsewhere, ticket()))
    assert "not this server's" in check(mine.headers(b"garbage", ticket()))
    auth_file.write_text(
        yaml.safe_dump({"principals": [{"name": "x", "mtls_subject": "CN=x", "datasets": ["*"]}]})
    )
    assert "no longer in --auth" in check(mine.headers(grant, ticket()))


def test_a_client_key_that_is_not_its_certificates_is_refused_at_construction(pki: dict[str, Issued]) -> None:
    with pytest.raises(InvalidArgumentError, match="not the key of the certificate"):
        Prover.from_pem(pki["ci"].pem, pki["other"].key.read_bytes())
    with pytest.raises(InvalidArgumentError, match="not an unencrypted PEM private key"):
        Prover.from_pem(pki["ci"].pem, pki["ci"].pem)
    mixed = {"ca": str(pki["ca"].cert), "cert": str(pki["ci"].cert), "key": str(pki["other"].key)}
    with pytest.raises(InvalidArgumentError, match="not the key of the certificate"):
        ChannelSecurity.from_options(mixed, "")


# --- against a real server ---------------------------------------------------------------------------


def test_a_certificate_principal_reads_with_its_grant_and_nothing_wider(server: LocalServer, pki) -> None:  # type: ignore[no-untyped-def]
    with Loader([server.target], "toy@1", output="numpy", batch_size=50, tls=tls(pki, "ci")) as ld:
        assert sorted(int(i) for b in ld for i in b["id"]) == list(range(N))  # over Flight, with its grant
    port = server.info()["data_port"]
    grant = grant_of(server, pki, "ci")
    ci = prover(pki["ci"])
    assert doget(port, pki, "ci", ci.headers(grant, ticket()), ticket()) == grpc.StatusCode.OK
    web = ticket("web@1")
    assert doget(port, pki, "ci", ci.headers(grant, web), web) == grpc.StatusCode.PERMISSION_DENIED
    # a certificate alone proves nothing on this plane; nor does a grant without its proof
    assert doget(port, pki, "stranger", [], ticket()) == grpc.StatusCode.UNAUTHENTICATED
    assert doget(port, pki, "ci", [(GRANT_HEADER.encode(), grant)], ticket()) == grpc.StatusCode.UNAUTHENTICATED


def test_another_clients_grant_is_worthless_with_another_certificate(server: LocalServer, pki) -> None:  # type: ignore[no-untyped-def]
    port = server.info()["data_port"]
    grant = grant_of(server, pki, "ci")  # ci's, as a client that saw its headers would have it
    stolen = prover(pki["ci"]).headers(grant, ticket())
    other = prover(pki["other"])
    # replayed with the thief's own certificate and proof
    assert doget(port, pki, "other", other.headers(grant, ticket()), ticket()) == grpc.StatusCode.UNAUTHENTICATED
    # replayed with ci's certificate but a signature of the thief's key
    forged = [stolen[0], stolen[1], other.headers(grant, ticket())[2]]
    assert doget(port, pki, "other", forged, ticket()) == grpc.StatusCode.UNAUTHENTICATED
    # ci's whole headers, copied, for another ticket than the one they were made for
    later = ticket(start=300)
    assert doget(port, pki, "other", stolen, later) == grpc.StatusCode.UNAUTHENTICATED
    # its own grant, it reads
    own = grant_of(server, pki, "other")
    assert doget(port, pki, "other", other.headers(own, ticket()), ticket()) == grpc.StatusCode.OK


def test_a_grant_forged_without_the_servers_key_is_unauthenticated(server: LocalServer, pki) -> None:  # type: ignore[no-untyped-def]
    port = server.info()["data_port"]
    principal = Principal("other", ("*",), subject=normalize_subject("CN=other"))
    other = prover(pki["other"])
    forged = Grants(new_key()).issue(principal, fingerprint(other.certificate_der))  # a key of its own
    assert doget(port, pki, "other", other.headers(forged, ticket("web@1")), ticket("web@1")) == grpc.StatusCode.UNAUTHENTICATED
    tampered = bytearray(grant_of(server, pki, "ci"))
    tampered[5] ^= 1
    ci_prover = prover(pki["ci"])
    assert doget(port, pki, "ci", ci_prover.headers(bytes(tampered), ticket()), ticket()) == grpc.StatusCode.UNAUTHENTICATED


def test_a_token_beside_a_grant_decides_alone(server: LocalServer, pki) -> None:  # type: ignore[no-untyped-def]
    port = server.info()["data_port"]
    grant = grant_of(server, pki, "ci")  # ci may read toy; team-web's token, web only
    ci = prover(pki["ci"])
    with_token = [bearer(TOKEN_WEB), *ci.headers(grant, ticket())]
    assert doget(port, pki, "ci", with_token, ticket()) == grpc.StatusCode.PERMISSION_DENIED
    unknown = [bearer("not-a-known-token"), *ci.headers(grant, ticket())]
    assert doget(port, pki, "ci", unknown, ticket()) == grpc.StatusCode.UNAUTHENTICATED  # no fallback to the grant
    web = ticket("web@1")
    assert doget(port, pki, "ci", [bearer(TOKEN_WEB), *ci.headers(grant, web)], web) == grpc.StatusCode.OK
    # a caller authenticated by its token gets no grant: it sends the token to the data plane too
    c = Connection(server.target, ChannelSecurity.from_options(tls(pki, "other"), TOKEN_WEB))
    try:
        assert c.get_dataset("web@1", 5).data_grant == b""
    finally:
        c.close()


# --- the supervisor's secrets ------------------------------------------------------------------------


def _group(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()  # after "pid (comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid:
            out.append(int(entry))
    return out


_HEX_KEY = re.compile(rb"[0-9a-fA-F]{64}")


def test_no_secret_is_on_a_workers_command_line_or_in_its_environment(
    servers: Servers, pki: dict[str, Issued], tmp_path: Path
) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(yaml.safe_dump(auth_doc()))
    ci = pki["ci"]
    creds = grpc.ssl_channel_credentials(pki["ca"].pem, ci.key.read_bytes(), ci.pem)
    server = servers.start(extra_args=mtls_args(pki, auth), credentials=creds, workers=2)
    assert server.proc is not None
    info = server.info()
    pids = _group(server.proc.pid)
    assert {server.proc.pid, *info["workers"]} <= set(pids)  # the supervisor and both workers
    # what the test's own environment holds is inherited, not made by the server
    inherited = {m for v in os.environ.values() for m in _HEX_KEY.findall(v.encode())}
    secrets = [TOKEN_SECRET, TOKEN_WEB, token_sha256(TOKEN_SECRET), token_sha256(TOKEN_WEB), "grant_key"]
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"{" not in cmdline, f"JSON on the command line of {pid}: {cmdline!r}"
        for where, text in (("command line", cmdline), ("environment", environ)):
            assert not [s for s in secrets if s.encode() in text], f"a secret in the {where} of {pid}"
            keys = set(_HEX_KEY.findall(text)) - inherited
            assert not keys, f"a 64-hex-digit key in the {where} of {pid}"
    # the key did reach the workers: a grant one worker made is good on both data planes
    ports = info["data_ports"]
    assert len(set(ports)) == 2
    grant = grant_of(server, pki, "ci")
    headers = prover(ci).headers(grant, ticket())
    assert [doget(p, pki, "ci", headers, ticket()) for p in ports] == [grpc.StatusCode.OK] * 2
