"""The proof that binds a data-plane grant to the client certificate it was issued to (DESIGN §10).

A grant (server/policy/grants.py) is the control plane's word, to its Flight data plane, for a caller it
knew by its client certificate; it names the SHA-256 fingerprint of that certificate. pyarrow's
Flight server cannot see the certificate of a call's TLS handshake, so it cannot compare the two
itself: instead, a DoGet that carries a grant (`x-shardstream-grant`) also carries

- `x-shardstream-grant-cert`: the client's certificate, DER, base64 (urlsafe), and
- `x-shardstream-grant-proof`: a signature, made with that certificate's private key, over
  `proof_message(grant, ticket)` — a fixed domain-separation prefix, the grant, and the SHA-256 of
  the DoGet's ticket (the serialized ReadRequest),

and the data plane checks that the certificate's fingerprint is the grant's and that the signature
verifies with the certificate's public key. Only whoever holds the key of the certificate the grant
was issued to can use it: a grant read off one client is worthless with another certificate, and a
proof read off one call is good for that call's ticket only (until the grant expires).

Keys: ECDSA (the signature over SHA-256), RSA (PSS, MGF1 with SHA-256, a salt as long as the
digest) and EdDSA (Ed25519, Ed448). This module is the one definition of the message and of the
signature schemes: the client signs with `Prover`, the server checks with `verify`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
import struct
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa

from shardstream.errors import InvalidArgumentError

__all__ = [
    "CERT_HEADER",
    "GRANT_HEADER",
    "PROOF_HEADER",
    "SUPPORTED_KEYS",
    "Prover",
    "fingerprint",
    "fingerprint_of_pem",
    "proof_message",
    "unb64",
    "verify",
]

GRANT_HEADER = "x-shardstream-grant"  # the grant, as GetDataset gave it (DatasetInfo.data_grant)
CERT_HEADER = "x-shardstream-grant-cert"  # the client certificate, DER, urlsafe base64
PROOF_HEADER = "x-shardstream-grant-proof"  # the signature over proof_message, urlsafe base64
_DOMAIN = b"shardstream/v1 data-plane grant proof\0"  # a signature made for anything else never matches
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.DIGEST_LENGTH)
SUPPORTED_KEYS = "EC, RSA, Ed25519 or Ed448"


def proof_message(grant: bytes, ticket: bytes) -> bytes:
    """What a DoGet's proof signs: the domain, the grant (length-prefixed) and the ticket's SHA-256."""
    return _DOMAIN + struct.pack(">I", len(grant)) + grant + hashlib.sha256(ticket).digest()


def fingerprint(der: bytes) -> str:
    """A certificate's SHA-256 fingerprint (hex) from its DER bytes."""
    return hashlib.sha256(der).hexdigest()


def fingerprint_of_pem(pem: bytes | str) -> str:
    """The SHA-256 fingerprint of the (first) certificate of a PEM text."""
    text = pem.decode("ascii", "replace") if isinstance(pem, bytes) else pem
    return fingerprint(ssl.PEM_cert_to_DER_cert(text))


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data)


def unb64(value: str | bytes) -> bytes | None:
    """urlsafe base64 decoded, or None when it is not that."""
    try:
        return base64.urlsafe_b64decode(value)
    except (binascii.Error, ValueError, TypeError):
        return None


def verify(certificate_der: bytes, signature: bytes, message: bytes) -> bool:
    """Whether `signature` over `message` verifies with the public key of the DER certificate."""
    try:
        key: Any = x509.load_der_x509_certificate(certificate_der).public_key()
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, message, _PSS, hashes.SHA256())
        elif isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
            key.verify(signature, message)
        else:
            return False
    except (InvalidSignature, UnsupportedAlgorithm, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True)
class Prover:
    """A client's certificate and its private key: the headers that prove a DoGet's grant is its."""

    certificate_der: bytes = field(repr=False)
    key: Any = field(repr=False)

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes, where: str = "tls") -> Prover:
        """From the PEM files of mTLS (the first certificate of the chain is the client's);
        InvalidArgumentError when they do not load or do not belong together."""
        try:
            cert = x509.load_pem_x509_certificates(cert_pem)[0]
        except (ValueError, IndexError) as exc:
            raise InvalidArgumentError(f"{where}['cert'] is not a PEM certificate") from exc
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise InvalidArgumentError(f"{where}['key'] is not an unencrypted PEM private key") from exc
        public = serialization.PublicFormat.SubjectPublicKeyInfo
        if key.public_key().public_bytes(serialization.Encoding.DER, public) != cert.public_key().public_bytes(
            serialization.Encoding.DER, public
        ):
            raise InvalidArgumentError(f"{where}['key'] is not the key of the certificate in {where}['cert']")
        return cls(cert.public_bytes(serialization.Encoding.DER), key)

    def sign(self, message: bytes) -> bytes:
        key = self.key
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return bytes(key.sign(message, ec.ECDSA(hashes.SHA256())))
        if isinstance(key, rsa.RSAPrivateKey):
            return bytes(key.sign(message, _PSS, hashes.SHA256()))
        if isinstance(key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)):
            return bytes(key.sign(message))
        raise InvalidArgumentError(
            f"the client certificate's key ({type(key).__name__}) cannot prove a data-plane grant: "
            f"use an {SUPPORTED_KEYS} key"
        )

    def headers(self, grant: bytes, ticket: bytes) -> list[tuple[bytes, bytes]]:
        """A DoGet's grant headers: the grant, this certificate and the proof for `ticket`."""
        proof = self.sign(proof_message(grant, ticket))
        return [
            (GRANT_HEADER.encode(), grant),
            (CERT_HEADER.encode(), _b64(self.certificate_der)),
            (PROOF_HEADER.encode(), _b64(proof)),
        ]
