"""TLS for the gRPC port: `serve --tls-cert FILE --tls-key FILE [--tls-client-ca FILE]` (DESIGN §10).

`server_credentials(...)` is gRPC's dynamic SSL credentials: before every new connection's handshake
gRPC asks `CertificateFiles.fetch` whether the certificate changed, and it answers with a fresh
configuration once one of the files has (its inode, size or mtime: cert-manager rewrites a Secret,
the kubelet swaps the mounted directory's symlink). So a rotated certificate is served from the next
connection on, without a restart; connections already open keep theirs. A new pair that does not
load — a key that does not match its certificate, a file caught half-written — is not used: the last
good one stays, with one error line in the log per bad version, and it is tried again at the next
connection.

With `--tls-client-ca`, every client must present a certificate signed by that CA (mTLS); its
subject is what an `--auth` file's `mtls_subject` matches (policy/auth.py). Health checks (grpc.health.v1)
share the port and its TLS; the Helm chart's probes use the metrics port's HTTP health instead, since
the kubelet's gRPC probe speaks no TLS.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass

import grpc

from shardstream.errors import InvalidArgumentError

__all__ = ["CertificateFiles", "TlsFiles", "file_signature", "load_pem", "server_credentials"]

log = logging.getLogger("shardstream.server.serving.tls")

_Signature = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class TlsFiles:
    """The paths of a server's certificate chain, its key and (mTLS) the CA of its clients."""

    cert: str
    key: str
    client_ca: str | None = None

    def paths(self) -> tuple[str, ...]:
        return (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)


def file_signature(paths: tuple[str, ...]) -> _Signature:
    out = []
    for p in paths:
        st = os.stat(p)
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def load_pem(files: TlsFiles) -> tuple[bytes, bytes, bytes | None]:
    """The PEM bytes of the files, checked: the key matches the certificate, the CA parses."""
    contents = []
    for what, path in (
        ("--tls-cert", files.cert),
        ("--tls-key", files.key),
        ("--tls-client-ca", files.client_ca),
    ):
        if path is None:
            contents.append(None)
            continue
        try:
            with open(path, "rb") as f:
                contents.append(f.read())
        except OSError as exc:
            raise InvalidArgumentError(f"{what} {path}: {exc.strerror}") from exc
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as exc:
        raise InvalidArgumentError(
            f"--tls-cert {files.cert} / --tls-key {files.key}: not a PEM certificate chain and its private key "
            f"({exc})"
        ) from exc
    if files.client_ca is not None:
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise InvalidArgumentError(
                f"--tls-client-ca {files.client_ca}: not PEM CA certificates ({exc})"
            ) from exc
    cert, key, ca = contents
    assert cert is not None and key is not None
    return cert, key, ca


def _configuration(cert: bytes, key: bytes, ca: bytes | None) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


class CertificateFiles:
    """The server's certificate configuration, re-read when its files change (see the module docstring)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        try:
            self._signature = file_signature(files.paths())
        except OSError as exc:
            raise InvalidArgumentError(f"TLS file {exc.filename}: {exc.strerror}") from exc
        self.initial = _configuration(*load_pem(files))
        self._bad: _Signature | None = None
        self._lock = threading.Lock()
        self.reloads = 0

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's certificate_configuration_fetcher: a new configuration, or None for no change.

        Called by gRPC before every handshake: a stat of each file, nothing more unless one changed."""
        try:
            sig = file_signature(self.files.paths())
        except OSError:
            return None  # a file mid-swap: keep the current one
        if sig == self._signature or sig == self._bad:
            return None
        with self._lock:
            if sig == self._signature:
                return None
            try:
                config = _configuration(*load_pem(self.files))
            except InvalidArgumentError as exc:
                self._bad = sig
                log.error("TLS files changed but do not load, keeping the last good ones: %s", exc)
                return None
            self._signature, self._bad = sig, None
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.files.cert)
            return config


def server_credentials(files: TlsFiles) -> tuple[grpc.ServerCredentials, CertificateFiles]:
    """Credentials for `add_secure_port` that follow the files, and the watcher behind them."""
    watcher = CertificateFiles(files)
    creds = grpc.dynamic_ssl_server_credentials(
        watcher.initial, watcher.fetch, require_client_authentication=files.client_ca is not None
    )
    return creds, watcher
