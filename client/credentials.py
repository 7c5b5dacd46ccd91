"""How a client proves who it is and checks who it talks to: TLS options and a bearer token.

    Loader(..., tls=True)                                   # TLS, the system's root CAs
    Loader(..., tls={"ca": "ca.crt"})                       # TLS, a private CA
    Loader(..., tls={"ca": "ca.crt", "cert": "client.crt", "key": "client.key"})   # mTLS
    Loader(..., token="...")                                # default: $SHARDSTREAM_TOKEN

`tls` keys: `ca` (PEM roots to verify the server with; default the system's), `cert` and `key` (a
client certificate, for servers started with `--tls-client-ca`), `server_name` (the name the server's
certificate must carry, when the endpoint's host is not it: an IP address, a tunnel). The files are
read when the options are checked (at construction), so a wrong path fails there, naming it; so
does a key that is not the certificate's.

A server's Flight data plane cannot see the client certificate of its TLS handshake: a caller the
server knows by its certificate reads there with the grant its GetDataset gave (bound to that
certificate) and proves, on each DoGet, that it holds the certificate's key — a signature over the
grant and the DoGet's ticket (shardstream/grant_proof.py; `grant_headers`). EC, RSA and Ed25519
keys can make it.

The token travels as call metadata `authorization: Bearer <token>` on every call (GetDataset,
ListDatasets, each Read). It is never logged, and never in a repr. Without TLS it crosses the network
in the clear: fine on loopback or inside a mesh that encrypts, said once in the log otherwise.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import pyarrow.flight as flight

from shardstream.errors import InvalidArgumentError
from shardstream.grant_proof import Prover

__all__ = ["ChannelSecurity", "TOKEN_ENV", "TlsOption"]

log = logging.getLogger("shardstream.client")

TOKEN_ENV = "SHARDSTREAM_TOKEN"
TLS_KEYS = ("ca", "cert", "key", "server_name")
TlsOption = bool | Mapping[str, str] | None
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
_warned: set[str] = set()


def _read(key: str, path: Any) -> bytes:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"tls[{key!r}] must be a file path, got {type(path).__name__}")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgumentError(f"tls[{key!r}] {path}: {exc.strerror}") from exc


def _check_token(token: Any, source: str) -> str | None:
    if token is None or token == "":
        return None
    if not isinstance(token, str):
        raise InvalidArgumentError(f"{source} must be a string, got {type(token).__name__}")
    token = token.strip()
    if not token or not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        # the token itself is not quoted: error messages end up in logs
        raise InvalidArgumentError(f"{source} must be printable ASCII without spaces")
    return token


@dataclass(frozen=True)
class ChannelSecurity:
    """Checked TLS options and token; makes the channels and call metadata of a client."""

    credentials: grpc.ChannelCredentials | None = field(default=None, repr=False)
    server_name: str | None = None
    metadata: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # The PEM files as read (ca, cert, key), for the Flight data plane's client (flight.connect)
    pem: tuple[bytes | None, bytes | None, bytes | None] = field(default=(None, None, None), repr=False)
    # The client certificate and its key, which prove a data-plane grant is this client's (mTLS only)
    prover: Prover | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.credentials is not None

    @classmethod
    def from_options(cls, tls: TlsOption = None, token: str | None = None) -> ChannelSecurity:
        """Validate `tls` and `token` (None: $SHARDSTREAM_TOKEN; "" for none) — see the module docstring."""
        if token is None:
            bearer = _check_token(os.environ.get(TOKEN_ENV), f"${TOKEN_ENV}")
        else:
            bearer = _check_token(token, "token")
        metadata = (("authorization", f"Bearer {bearer}"),) if bearer else ()
        if tls is None or tls is False:
            return cls(metadata=metadata)
        if tls is True:
            return cls(grpc.ssl_channel_credentials(), metadata=metadata)
        if not isinstance(tls, Mapping):
            raise InvalidArgumentError(
                f"tls must be True, False/None or a dict with keys {', '.join(TLS_KEYS)}, got {type(tls).__name__}"
            )
        unknown = sorted(set(map(str, tls)) - set(TLS_KEYS))
        if unknown:
            raise InvalidArgumentError(f"tls: unknown key(s) {unknown} (known: {', '.join(TLS_KEYS)})")
        if ("cert" in tls) != ("key" in tls):
            raise InvalidArgumentError("tls: 'cert' and 'key' go together (a client certificate and its key)")
        server_name = tls.get("server_name")
        if server_name is not None and (not isinstance(server_name, str) or not server_name):
            raise InvalidArgumentError(f"tls['server_name'] must be a host name, got {server_name!r}")
        ca = _read("ca", tls["ca"]) if "ca" in tls else None
        key = _read("key", tls["key"]) if "key" in tls else None
        cert = _read("cert", tls["cert"]) if "cert" in tls else None
        creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        prover = Prover.from_pem(cert, key) if cert is not None and key is not None else None
        return cls(creds, server_name, metadata, (ca, cert, key), prover)

    def grant_headers(self, grant: bytes, ticket: bytes) -> list[tuple[bytes, bytes]]:
        """The headers of a DoGet of `ticket` with the grant a GetDataset gave this client's
        certificate: the grant, the certificate, and the proof that this client holds its key."""
        if self.prover is None:  # a grant is given to a client certificate only: never happens
            raise InvalidArgumentError("a data-plane grant needs the client certificate (tls['cert'], tls['key'])")
        return self.prover.headers(grant, ticket)

    def channel(self, target: str, options: list[tuple[str, Any]]) -> grpc.Channel:
        """A channel to `target` with these credentials (plaintext without TLS)."""
        if self.credentials is None:
            if (
                self.metadata
                and not target.split("/")[-1].startswith(_LOOPBACK_HOSTS)
                and target not in _warned
            ):
                _warned.add(target)
                log.warning(
                    "sending a bearer token to %s without TLS: it crosses the network in the clear", target
                )
            return grpc.insecure_channel(target, options=options)
        if self.server_name:
            options = [*options, ("grpc.ssl_target_name_override", self.server_name)]
        return grpc.secure_channel(target, self.credentials, options=options)

    def flight_client(
        self,
        host: str,
        port: int,
        options: list[tuple[str, Any]],
        server_name: str | None = None,
    ) -> flight.FlightClient:
        """A Flight client of the data plane at host:port with these credentials (`server_name`:
        the name its certificate must have, when `host` is an address of it)."""
        if self.credentials is None:
            return flight.connect(flight.Location.for_grpc_tcp(host, port), generic_options=options)
        ca, cert, key = self.pem
        tls = {
            "tls_root_certs": ca,
            "override_hostname": self.server_name or server_name,
            "cert_chain": cert,
            "private_key": key,
        }
        return flight.connect(
            flight.Location.for_grpc_tls(host, port),
            generic_options=options,
            **{k: v for k, v in tls.items() if v is not None},
        )
