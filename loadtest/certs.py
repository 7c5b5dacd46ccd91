"""Real X.509 certificates made on the spot (cryptography): a CA, server and client certificates.

The one copy: the TLS benchmark (tls_bench.py) and the tests (tests/support/certs.py re-exports it)
both make their certificates here.

`Pki(dir)` writes PEM files: `ca()` a self-signed CA, `server(ca)` a certificate for 127.0.0.1 and
localhost signed by it, `client(ca, cn)` a client certificate with subject CN=cn. ECDSA P-256 keys
(fast to make), valid from an hour ago for a day.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Issued", "Pki", "write_atomic"]


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    @property
    def pem(self) -> bytes:
        return self.cert.read_bytes()


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` as a Secret update does: write beside it, then rename over it (a new inode)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Pki:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def _write(self, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
        cert_path, key_path = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return Issued(cert_path, key_path, cert, key)

    @staticmethod
    def _builder(
        subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
    ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.timezone.utc)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def ca(self, name: str = "ca") -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"shardstream test {name}")])
        cert = (
            self._builder(subject, subject, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return self._write(name, cert, key)

    def _leaf(self, ca: Issued, name: str, subject: x509.Name, server: bool) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = self._builder(subject, ca.certificate.subject, key).add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return self._write(name, builder.sign(ca.private_key, hashes.SHA256()), key)

    def server(self, ca: Issued, name: str = "server") -> Issued:
        return self._leaf(ca, name, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shardstream")]), True)

    def client(self, ca: Issued, cn: str, org: str | None = None, name: str | None = None) -> Issued:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return self._leaf(ca, name or f"client-{cn}", x509.Name(attrs), False)
