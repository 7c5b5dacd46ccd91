"""Grants: the control plane vouches to the Flight data plane for a caller it knew by its certificate.

pyarrow's Flight server cannot see a client certificate's subject, which an --auth principal may be
known by (`mtls_subject`). So the gRPC port, which sees it, answers such a caller's GetDataset with
a grant (`DatasetInfo.data_grant`): the principal's name and an expiry, signed (HMAC-SHA256) with a
key of this server's (its workers share it; the supervisor makes it). The client sends the grant as
the `x-shardstream-grant` header of its DoGets; the data plane checks the signature and the expiry
and reads the principal by name from the --auth file as it is now (a principal removed since is
refused). A grant is good for GRANT_TTL_S on this server only: clients ask again before it runs out,
and a stream that began before goes on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

from shardstream.errors import UnauthenticatedError

from .auth import Authenticator, Principal

__all__ = ["GRANT_HEADER", "GRANT_TTL_S", "Grants", "new_key"]

GRANT_HEADER = "x-shardstream-grant"
GRANT_TTL_S = 600


def new_key() -> str:
    """A fresh signing key, hex (a server's; its workers are given the supervisor's)."""
    return secrets.token_hex(32)


class Grants:
    def __init__(self, key_hex: str) -> None:
        self._key = bytes.fromhex(key_hex)

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()

    def issue(self, principal: Principal, now: float | None = None) -> bytes:
        """The grant of `principal`, valid GRANT_TTL_S from now."""
        expiry = int((time.time() if now is None else now) + GRANT_TTL_S)
        body = f"{expiry}\n{principal.name}".encode()
        return base64.urlsafe_b64encode(self._mac(body) + body)

    def principal(self, grant: str | bytes, auth: Authenticator, now: float | None = None) -> Principal:
        """The principal `grant` vouches for, or UnauthenticatedError."""
        try:
            raw = base64.urlsafe_b64decode(grant)
        except (ValueError, TypeError):
            raw = b""
        mac, body = raw[:32], raw[32:]
        if len(mac) != 32 or not hmac.compare_digest(mac, self._mac(body)):
            raise UnauthenticatedError("the data-plane grant is not this server's: ask its GetDataset again")
        expiry, _, name = body.decode("utf-8", "replace").partition("\n")
        if not expiry.isdigit() or int(expiry) < (time.time() if now is None else now):
            raise UnauthenticatedError("the data-plane grant has expired: ask GetDataset again")
        principals = auth.file.principals() if auth.file is not None else []
        for p in principals:
            if p.name == name and p.subject is not None:
                return p
        raise UnauthenticatedError(f"the data-plane grant's principal {name!r} is no longer in --auth")
