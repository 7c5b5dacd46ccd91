"""What a server's security flags add up to, checked once at start (DESIGN §10).

`check(cfg)` runs before anything listens (in the one process, or in the supervisor before its
workers start): TLS files that do not load and an `--auth` file that does not parse stop the server
with one line naming the file; so does an `--auth` file with principals that only an `mtls_subject`
authenticates on a server that verifies no client certificate (no `--tls-client-ca`: they could
never call). A
non-loopback bind with neither TLS nor `--auth` — anyone who reaches the port reads every dataset in
plaintext — is allowed but said once, as a warning line; so is `--auth` with bearer tokens but
without TLS there (the tokens would cross the network in the clear).

`credentials(cfg)` is what each serving process binds its port with (tls.py), or None for plaintext.
"""

from __future__ import annotations

import ipaddress
import logging

import grpc

from shardstream.errors import InvalidArgumentError

from ..policy.auth import Authenticator
from .config import ServerConfig
from .tls import TlsFiles, server_credentials

__all__ = ["check", "credentials", "describe", "is_loopback", "tls_files"]

log = logging.getLogger("shardstream.server")

_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether binding `host` exposes the port to this machine only."""
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to may be reachable


def tls_files(cfg: ServerConfig) -> TlsFiles | None:
    """The config's TLS files (None: plaintext); InvalidArgumentError for an incomplete set."""
    if cfg.tls_cert is None and cfg.tls_key is None:
        if cfg.tls_client_ca is not None:
            raise InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key (mTLS is TLS first)")
        return None
    if cfg.tls_cert is None or cfg.tls_key is None:
        raise InvalidArgumentError("--tls-cert and --tls-key go together: the certificate chain and its key")
    return TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)


def credentials(cfg: ServerConfig) -> grpc.ServerCredentials | None:
    files = tls_files(cfg)
    return None if files is None else server_credentials(files)[0]


def describe(cfg: ServerConfig) -> str:
    """'plaintext', 'TLS' or 'mTLS', and whether --auth is on (the server's start line)."""
    transport = "plaintext" if cfg.tls_cert is None else ("mTLS" if cfg.tls_client_ca else "TLS")
    return f"{transport}, {'--auth ' + cfg.auth_file if cfg.auth_file else 'no auth'}"


def check(cfg: ServerConfig) -> None:
    """Refuse what cannot work; warn about what exposes data (see the module docstring)."""
    files = tls_files(cfg)
    if files is not None:
        server_credentials(files)  # loads and checks the files
    auth = Authenticator(cfg.auth_file)
    if auth.file is not None and cfg.tls_client_ca is None:
        only = [p.name for p in auth.file.principals() if p.subject is not None and p.token_digest is None]
        if only:
            raise InvalidArgumentError(
                f"--auth {cfg.auth_file}: principal(s) {only} authenticate by mtls_subject only, but without "
                "--tls-client-ca no client certificate is asked for or verified"
            )
    if is_loopback(cfg.host):
        return
    if files is None and not auth.enabled:
        log.warning(
            "serving on %s without TLS or --auth: anyone who reaches the port reads every dataset in plaintext "
            "(give --tls-cert/--tls-key and --auth, or bind 127.0.0.1)",
            cfg.host,
        )
    elif files is None and auth.has_tokens():
        log.warning(
            "serving on %s with --auth but without TLS: bearer tokens cross the network in the clear",
            cfg.host,
        )
