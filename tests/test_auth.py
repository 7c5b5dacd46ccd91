"""The pieces of TLS and auth on their own (no server): principals and their patterns, the auth file
and its reloads, the certificate watcher, the client's options and the CLI's. test_security.py runs
them together against real servers."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import grpc
import pytest
import yaml

from shardstream.cli import build_parser
from shardstream.cli.common import apply_global_options, client_security
from shardstream.client.credentials import ChannelSecurity
from shardstream.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError, excerpt
from shardstream.manifest import DatasetRef
from shardstream.server.policy.auth import (
    OPEN,
    Authenticator,
    AuthFile,
    Principal,
    load_principals,
    normalize_subject,
    token_sha256,
)
from shardstream.server.serving.config import ServerConfig
from shardstream.server.serving.security import check, is_loopback
from shardstream.server.serving.tls import CertificateFiles, TlsFiles

from .support.certs import Pki, write_atomic

TOKEN = "s3cret-token-value"


def principal(*patterns: str) -> Principal:
    return Principal("p", patterns)


@pytest.mark.parametrize(
    ("patterns", "name", "version", "allowed"),
    [
        (("web",), "web", 3, True),
        (("web",), "web2", 1, False),
        (("web@3",), "web", 3, True),
        (("web@3",), "web", 4, False),
        (("code*",), "code-py", 9, True),
        (("code*",), "mycode", 1, False),
        (("*",), "anything", 1, True),
        (("t?y@1", "x"), "toy", 1, True),
        (("t?y@1", "x"), "toy", 2, False),
        ((), "web", 1, False),
    ],
)
def test_patterns(patterns: tuple[str, ...], name: str, version: int, allowed: bool) -> None:
    p = principal(*patterns)
    assert p.may_read(name, version) is allowed
    if allowed:
        p.check(DatasetRef(name, version=version))
        p.check_version(name, version)
    else:
        with pytest.raises(PermissionDeniedError):
            p.check_version(name, version)


@pytest.mark.parametrize(
    ("write", "read", "job", "may_write", "may_read"),
    [
        (None, None, "run-1", True, True),  # no checkpoints: key, every job
        (("run-*",), None, "run-1", True, True),
        (("run-*",), None, "eval-1", False, False),
        ((), ("run-*",), "run-1", False, True),  # load only
        (("a",), ("run-*",), "a", True, True),
        ((), (), "run-1", False, False),
    ],
)
def test_checkpoint_patterns(
    write: tuple[str, ...] | None, read: tuple[str, ...] | None, job: str, may_write: bool, may_read: bool
) -> None:
    p = Principal("p", checkpoints=write, checkpoints_read=read)
    assert p.may_write_checkpoints(job) is may_write
    assert p.may_read_checkpoints(job) is may_read


def test_a_reference_is_judged_before_it_is_resolved() -> None:
    p = principal("web@3", "code*")
    p.check(DatasetRef("web"))  # latest or a tag: decided on the version it resolves to
    p.check(DatasetRef("web", tag="stable"))
    p.check(DatasetRef("code-py", tag="stable"))
    for ref in (DatasetRef("web", version=4), DatasetRef("secret"), DatasetRef("nothing-here", version=1)):
        with pytest.raises(PermissionDeniedError):
            p.check(ref)
    # the same words whether the dataset exists or not: only the reference differs
    texts = []
    for name in ("secret", "nothing-here"):
        with pytest.raises(PermissionDeniedError) as exc:
            p.check(DatasetRef(name, version=1), "mixture source 2: ")
        texts.append(str(exc.value).replace(name, "NAME"))
    assert texts[0] == texts[1] and texts[0].startswith("mixture source 2: 'NAME@1' is not readable")
    OPEN.check(DatasetRef("anything"))


def doc(*principals: dict[str, object]) -> str:
    return yaml.safe_dump({"principals": list(principals)})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("principals: [", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping with a 'principals' list"),
        (doc({"name": "a", "datasets": ["x"]}), "needs token_sha256 or mtls_subject"),
        (doc({"name": "a", "token_sha256": TOKEN, "datasets": ["x"]}), "64 hex digits"),
        (doc({"name": "a", "token_sha256": "0" * 64, "datasets": "x"}), "datasets must be a list"),
        (doc({"name": "a", "token_sha256": "0" * 64, "datasets": ["bad pattern"]}), "bad dataset pattern"),
        (
            doc({"name": "a", "token_sha256": "0" * 64, "datasets": [], "role": "admin"}),
            "unknown key(s) ['role']",
        ),
        (doc({"name": "a", "mtls_subject": "", "datasets": []}), "mtls_subject must look like"),
        (
            doc(
                {"name": "a", "token_sha256": "0" * 64, "datasets": []},
                {"name": "b", "token_sha256": "0" * 64, "datasets": []},
            ),
            "same token_sha256",
        ),
        ("principals:\n  - !!python/object/apply:os.system ['true']\n", "not valid YAML"),  # safe_load only
    ],
)
def test_a_bad_auth_file_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=None) as exc:
        load_principals(text)
    assert message in str(exc.value)
    assert TOKEN not in str(exc.value)


def test_authentication(tmp_path: Path) -> None:
    path = tmp_path / "auth.yaml"
    path.write_text(
        doc(
            {"name": "team", "token_sha256": token_sha256(TOKEN), "datasets": ["web"]},
            {"name": "ci", "mtls_subject": "CN=ci, O=lab", "datasets": ["*"]},
        )
    )
    auth = Authenticator(str(path))
    bearer = (("authorization", f"Bearer {TOKEN}"),)
    assert auth.authenticate(bearer, {}).name == "team"
    assert auth.authenticate((("authorization", f"bearer  {TOKEN} "),), {}).name == "team"
    subject = {"x509_subject": [b"O=lab,CN=ci"]}  # as gRPC reports it: the certificate's order
    assert auth.authenticate((), subject).name == "ci"
    for metadata, context, message in [
        ((), {}, "needs credentials"),
        ((("authorization", "Bearer nope"),), subject, "not one this server accepts"),  # a token decides
        ((("authorization", TOKEN),), {}, "must be 'Bearer <token>'"),
        ((), {"x509_subject": [b"CN=other"]}, "subject 'CN=other' is not one"),
    ]:
        with pytest.raises(UnauthenticatedError, match=message) as exc:
            auth.authenticate(metadata, context)
        assert TOKEN not in str(exc.value)
    assert Authenticator(None).authenticate((), {}) is OPEN
    assert Authenticator(None).authenticate((), subject).name == "cert:O=lab,CN=ci"
    assert normalize_subject("CN=ci, O=lab") == normalize_subject("O=lab,CN=ci") != normalize_subject("CN=ci")


def test_the_auth_file_is_reread_on_change_and_a_bad_edit_keeps_the_last_good_one(
    tmp_path: Path, caplog
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "auth.yaml"
    write_atomic(path, doc({"name": "a", "token_sha256": token_sha256("one"), "datasets": ["*"]}).encode())
    f = AuthFile(str(path))
    assert [p.name for p in f.principals()] == ["a"]
    write_atomic(path, doc({"name": "b", "token_sha256": token_sha256("two"), "datasets": ["*"]}).encode())
    assert [p.name for p in f.principals()] == ["b"]
    with caplog.at_level(logging.ERROR, "shardstream.server.policy.auth"):
        write_atomic(path, b"principals: [")
        assert [p.name for p in f.principals()] == ["b"]
        assert [p.name for p in f.principals()] == ["b"]
    assert len([r for r in caplog.records if "does not load" in r.getMessage()]) == 1  # once per bad version
    path.unlink()
    assert [p.name for p in f.principals()] == ["b"]  # mid-swap: the last good one
    with pytest.raises(InvalidArgumentError, match="--auth .*: No such file"):
        AuthFile(str(path))


def test_the_certificate_watcher_follows_the_files_and_keeps_a_good_pair(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    pki = Pki(tmp_path / "pki")
    ca = pki.ca()
    first, second = pki.server(ca, "first"), pki.server(ca, "second")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_atomic(cert, first.pem)
    write_atomic(key, first.key.read_bytes())
    watcher = CertificateFiles(TlsFiles(str(cert), str(key)))
    assert watcher.fetch() is None  # nothing changed: a stat per file, nothing read
    with caplog.at_level(logging.ERROR, "shardstream.server.serving.tls"):
        write_atomic(cert, second.pem)  # its key is not there yet: the pair does not match
        assert watcher.fetch() is None and watcher.fetch() is None
    assert len([r for r in caplog.records if "do not load" in r.getMessage()]) == 1
    write_atomic(key, second.key.read_bytes())
    assert isinstance(watcher.fetch(), grpc.ServerCertificateConfiguration)
    assert watcher.fetch() is None and watcher.reloads == 1
    with pytest.raises(InvalidArgumentError, match="not a PEM certificate chain and its private key"):
        CertificateFiles(TlsFiles(str(cert), str(first.key)))


def test_client_options_are_checked_at_construction(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SHARDSTREAM_TOKEN", TOKEN)
    assert ChannelSecurity.from_options().metadata == (("authorization", f"Bearer {TOKEN}"),)
    assert ChannelSecurity.from_options(token="").metadata == ()  # "" : no token, even with the variable
    assert TOKEN not in repr(ChannelSecurity.from_options())
    for token in ("has space", "tab\there", "é", "new\nline"):
        with pytest.raises(InvalidArgumentError, match="printable ASCII") as exc:
            ChannelSecurity.from_options(token=token)
        assert token not in str(exc.value)
    for tls, message in [
        ({"ca": str(tmp_path / "missing.crt")}, "tls\\['ca'\\] .*missing.crt: No such file"),
        ({"cert": "c", "ca": "a"}, "'cert' and 'key' go together"),
        ({"certificate": "c"}, "unknown key"),
        ("yes", "tls must be True"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            ChannelSecurity.from_options(tls, "")
    assert ChannelSecurity.from_options(True, "").tls and not ChannelSecurity.from_options(False, "").tls


def parse(*argv: str) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    apply_global_options(parser, args)
    return args


def test_the_cli_client_options_become_the_loaders(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    assert client_security(parse("view", "--server", "h:1")) == {"tls": None, "token": None}
    assert client_security(parse("web", "--server", "h:1", "--tls")) == {"tls": True, "token": None}
    args = parse(
        "view",
        "--server",
        "h:1",
        "--tls-ca",
        "ca.crt",
        "--tls-cert",
        "c",
        "--tls-key",
        "k",
        "--token-file",
        str(token_file),
    )
    assert client_security(args) == {"tls": {"ca": "ca.crt", "cert": "c", "key": "k"}, "token": TOKEN}
    with pytest.raises(InvalidArgumentError, match="--token-file"):
        client_security(parse("view", "--token-file", str(tmp_path / "none")))


def test_safe_defaults_at_start(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    assert (
        ServerConfig(root="r", port=0).host == "127.0.0.1" and not ServerConfig(root="r", port=0).reflection
    )
    assert parse("serve").host == "127.0.0.1" and not parse("serve").reflection
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.com"))
    auth = tmp_path / "auth.yaml"
    auth.write_text(doc({"name": "a", "token_sha256": token_sha256("t"), "datasets": ["*"]}))
    with caplog.at_level(logging.WARNING, "shardstream.server"):
        check(ServerConfig(root="r", port=0))
        check(ServerConfig(root="r", port=0, host="0.0.0.0", auth_file=str(auth)))
        assert [r.getMessage() for r in caplog.records] == [
            "serving on 0.0.0.0 with --auth but without TLS: bearer tokens cross the network in the clear"
        ]
        caplog.clear()
        check(ServerConfig(root="r", port=0, host="0.0.0.0"))
    assert len(caplog.records) == 1 and "without TLS or --auth" in caplog.records[0].getMessage()


def test_excerpts_are_short() -> None:
    assert excerpt("web@3") == "'web@3'"
    long = excerpt("\x00" * 1000)
    assert len(long) < 160 and long.endswith("(1000 characters)")
