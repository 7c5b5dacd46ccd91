"""Grants: the control plane vouches to the Flight data plane for a caller it knew by its certificate.

pyarrow's Flight server cannot see the client certificate of a call's TLS handshake (it has no API
for it), so it cannot know a principal that the --auth file names by `mtls_subject`. The gRPC port,
which sees the verified certificate, answers such a caller's GetDataset with a grant
(`DatasetInfo.data_grant`): an expiry, the SHA-256 fingerprint of the client certificate it was
issued to, and the principal's name, signed (HMAC-SHA256) with a key of this server's (its workers
share it: the supervisor makes it and hands it to each worker through a pipe, never a command line).

A grant alone proves nothing: the data plane cannot check that the certificate of the connection is
the one the grant names, so the client proves it holds that certificate's key (proof of possession,
shardstream/grant_proof.py). Each DoGet with a grant also carries the certificate (DER) and a
signature, made with its private key, over a domain-separated message holding the grant and the
SHA-256 of the ticket. `Grants.principal` checks, in this order: the HMAC (a grant not made with this
server's key is refused), the expiry, that the certificate's fingerprint is the grant's, that the
signature verifies with the certificate's public key (EC, RSA-PSS, Ed25519/Ed448), and that the
principal is still in the --auth file as it is now (a principal removed since is refused). Any
failure is UNAUTHENTICATED. So a grant copied off one client is useless with another certificate,
and a copied proof is good for that one ticket only, until the grant expires.

A grant is good for GRANT_TTL_S (kept short) on this server only: clients ask again before it runs
out, and a stream that began before goes on. A grant never widens what a token may read: a DoGet
that carries a bearer token is that token's (an unknown token is UNAUTHENTICATED), and a grant beside
it is not looked at (data_plane.py); GetDataset gives grants only to callers it authenticated by
their certificate, not by a token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardstream.errors import UnauthenticatedError
from shardstream.grant_proof import (
    CERT_HEADER,
    GRANT_HEADER,
    PROOF_HEADER,
    fingerprint,
    fingerprint_of_pem,
    proof_message,
    unb64,
    verify,
)

from .auth import Authenticator, Principal, has_token

__all__ = ["GRANT_HEADER", "GRANT_TTL_S", "Grants", "new_key", "peer_fingerprint"]

GRANT_TTL_S = 600
_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}\Z")
_PEM_CERT_KEY = "x509_pem_cert"  # grpc's auth context: the verified client certificate, PEM


def new_key() -> str:
    """A fresh signing key, hex (a server's; its workers are given the supervisor's)."""
    return secrets.token_hex(32)


def peer_fingerprint(auth_context: Mapping[str, Sequence[bytes]] | None) -> str | None:
    """The SHA-256 fingerprint of the verified client certificate of a gRPC call (None: it sent none)."""
    pem = (auth_context or {}).get(_PEM_CERT_KEY) or ()
    if not pem:
        return None
    try:
        return fingerprint_of_pem(pem[0])
    except ValueError:
        return None


def _first(values: Sequence[str | bytes] | None) -> str | bytes:
    return values[0] if values else b""


class Grants:
    def __init__(self, key_hex: str) -> None:
        self._key = bytes.fromhex(key_hex)

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()

    def issue(self, principal: Principal, cert_fingerprint: str, now: float | None = None) -> bytes:
        """The grant of `principal` to the certificate of `cert_fingerprint`, valid GRANT_TTL_S from now."""
        if not _FINGERPRINT_RE.match(cert_fingerprint):
            raise ValueError(f"not a SHA-256 fingerprint in hex: {cert_fingerprint!r}")
        expiry = int((time.time() if now is None else now) + GRANT_TTL_S)
        body = f"{expiry}\n{cert_fingerprint}\n{principal.name}".encode()
        return base64.urlsafe_b64encode(self._mac(body) + body)

    def principal(
        self,
        headers: Mapping[str, Sequence[str | bytes]],
        ticket: bytes,
        auth: Authenticator,
        now: float | None = None,
    ) -> Principal:
        """The principal a DoGet's grant headers vouch for, its proof checked against `ticket` (the
        DoGet's ticket bytes); UnauthenticatedError otherwise (see the module docstring)."""
        grant = _first(headers.get(GRANT_HEADER))
        grant_bytes = grant.encode("ascii", "replace") if isinstance(grant, str) else grant
        raw = unb64(grant_bytes) or b""
        mac, body = raw[:32], raw[32:]
        if len(mac) != 32 or not hmac.compare_digest(mac, self._mac(body)):
            raise UnauthenticatedError("the data-plane grant is not this server's: ask its GetDataset again")
        expiry, _, rest = body.decode("utf-8", "replace").partition("\n")
        granted_to, _, name = rest.partition("\n")
        if not expiry.isdigit() or int(expiry) < (time.time() if now is None else now):
            raise UnauthenticatedError("the data-plane grant has expired: ask GetDataset again")
        certificate = unb64(_first(headers.get(CERT_HEADER)))
        proof = unb64(_first(headers.get(PROOF_HEADER)))
        if not certificate or not proof:
            raise UnauthenticatedError(
                f"a data-plane grant needs its proof: the {CERT_HEADER} and {PROOF_HEADER} headers"
            )
        if not hmac.compare_digest(fingerprint(certificate), granted_to):
            raise UnauthenticatedError("the data-plane grant was issued to another client certificate")
        if not verify(certificate, proof, proof_message(grant_bytes, ticket)):
            raise UnauthenticatedError(
                "the data-plane grant's proof does not verify with its certificate's key (for this ticket)"
            )
        principals = auth.file.principals() if auth.file is not None else []
        for p in principals:
            if p.name == name and p.subject is not None:
                return p
        raise UnauthenticatedError(f"the data-plane grant's principal {name!r} is no longer in --auth")


def caller_principal(
    auth: Authenticator,
    grants: Grants | None,
    headers: Mapping[str, Sequence[str | bytes]],
    metadata: Sequence[tuple[str, Any]],
    signed: Callable[[], bytes],
) -> Principal:
    """A data-port caller (a Read stream's DoGet, a checkpoint call): its token's principal when it
    sent a token (a grant beside it is not looked at: a grant never widens what a token may read),
    else the principal of the grant the gRPC port gave its certificate, with the proof over `signed()`
    (the bytes the call asks with) that it holds that certificate's key. `signed` is called only for
    a grant, after the token check: a caller without credentials is refused before its body is read."""
    if headers.get(GRANT_HEADER) and grants is not None and auth.enabled and not has_token(metadata):
        return grants.principal(headers, signed(), auth)
    return auth.authenticate(metadata, None)
