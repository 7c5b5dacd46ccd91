"""The Flight data plane's lifecycle in one server process: start it, follow its certificates, stop it.

`DataPlane.start(cfg, runtime)` serves data_plane.py's `FlightDataPlane` on `cfg.data_port` (0:
a free one) with the TLS files of the gRPC port, and records its port in the stream runtime (GetDataset
tells clients). pyarrow's Flight server reads its certificate once, so with TLS a watcher thread
looks at the files every CERT_POLL_S (inode, size, mtime, as tls.py does); when they changed and
load, the plane is replaced on the same port: the old one stops listening at once and keeps its
streams until they end, the new one serves every new stream with the new certificate. A pair that
does not load is not used (one error line); the last good one stays.

`stop(grace_s)` stops the plane (and any retiring one): no new streams, and in-flight ones get the grace.
"""

from __future__ import annotations

import logging
import threading
import time

import pyarrow as pa
import pyarrow.flight as flight

from shardstream.errors import InvalidArgumentError
from shardstream.threads import join_all

from ..policy.grants import Grants, new_key
from . import security
from .config import ServerConfig
from .data_plane import FlightDataPlane
from .stream_runtime import StreamRuntime
from .tls import TlsFiles, file_signature, load_pem

__all__ = ["CERT_POLL_S", "DataPlane"]

log = logging.getLogger("shardstream.server")

CERT_POLL_S = 2.0  # how often the TLS files are looked at (a stat each)
_REBIND_S = 5.0  # how long a replacement plane tries to bind the port its predecessor is leaving


class DataPlane:
    def __init__(self, cfg: ServerConfig, runtime: StreamRuntime) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.files: TlsFiles | None = security.tls_files(cfg)
        self.plane: FlightDataPlane | None = None
        self.port = 0
        self.reloads = 0
        self._retiring: list[threading.Thread] = []
        self._stopped = threading.Event()
        self._lock = threading.Lock()

    @classmethod
    def start(cls, cfg: ServerConfig, runtime: StreamRuntime) -> DataPlane:
        runtime.grants = Grants(cfg.grant_key or new_key())
        if cfg.data_port:  # one clear line, before Flight logs its own about the bind
            from .ports import reserve_port

            reserve_port(cfg.host, cfg.data_port, hold=False)
        dp = cls(cfg, runtime)
        signature = file_signature(dp.files.paths()) if dp.files is not None else None
        dp.plane = dp._make(cfg.data_port)
        dp.port = dp.plane.port
        runtime.data_port = cfg.advertised_data_port or dp.port  # what GetDataset names
        if dp.files is not None:
            threading.Thread(target=dp._watch, args=(signature,), name="data-plane-tls", daemon=True).start()
        return dp

    def _make(self, port: int) -> FlightDataPlane:
        host = self.cfg.host.strip("[]")
        try:
            if self.files is None:
                return FlightDataPlane(self.runtime, flight.Location.for_grpc_tcp(host, port))
            cert, key, ca = load_pem(self.files)
            return FlightDataPlane(
                self.runtime,
                flight.Location.for_grpc_tls(host, port),
                tls_certificates=[(cert, key)],
                client_ca=ca,
            )
        except (OSError, pa.ArrowException) as exc:
            raise InvalidArgumentError(
                f"cannot serve the Flight data plane on {self.cfg.host}:{port}: {exc} (is the port in use?)"
            ) from exc

    def _watch(self, signature: tuple[tuple[int, int, int], ...] | None) -> None:
        assert self.files is not None
        bad = None
        while not self._stopped.wait(CERT_POLL_S):
            try:
                now = file_signature(self.files.paths())
            except OSError:
                continue  # a file mid-swap
            if now in (signature, bad):
                continue
            try:
                load_pem(self.files)
            except InvalidArgumentError as exc:
                bad = now
                log.error(
                    "TLS files changed but do not load, the data plane keeps the last good ones: %s", exc
                )
                continue
            if self._replace():
                signature, bad = now, None

    def _replace(self) -> bool:
        """A new plane on the same port (the new certificate); the old one finishes its streams."""
        with self._lock:
            old = self.plane
            if old is None or self._stopped.is_set():
                return False
            retiring = threading.Thread(target=old.shutdown, name="data-plane-retire", daemon=True)
            retiring.start()  # stops listening at once; returns when its streams have ended
            self._retiring.append(retiring)
            deadline = time.monotonic() + _REBIND_S
            while True:
                try:
                    self.plane = self._make(self.port)
                    break
                except InvalidArgumentError:
                    if time.monotonic() > deadline:
                        log.error(
                            "the data plane could not bind port %d again after a certificate change",
                            self.port,
                        )
                        self.plane = None
                        return False
                    time.sleep(0.02)
            self.reloads += 1
        log.info("TLS certificate reloaded on the Flight data plane (port %d)", self.port)
        return True

    def stop(self, grace_s: float) -> bool:
        """Stop serving; True when every stream ended within `grace_s`."""
        self._stopped.set()
        with self._lock:
            plane, self.plane = self.plane, None
        if plane is not None:
            stopping = threading.Thread(target=plane.shutdown, name="data-plane-stop", daemon=True)
            stopping.start()
            self._retiring.append(stopping)
        return join_all(self._retiring, grace_s)
