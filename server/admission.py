"""Admission of Read streams: how many run at once, per server process and per peer, and the bytes
of built messages they hold.

`Admission.admit(peer)` gives a new stream its `Ticket`, or refuses it with RESOURCE_EXHAUSTED and
a retry hint (`grpc-retry-pushback-ms`, errors.py) when the process already runs `max_streams`
streams, `max_streams_per_peer` of them for that peer, or its streams hold `buffer_bytes` of built
messages not yet sent. The client (client/session.py) then tries its next endpoint after at least
that long; the refusal is counted by the limit it hit. A peer is the client's address without its
port (`peer_host`): the ranks of one host share its allowance, however many connections they open.

Each stream counts on its ticket the bytes of the messages it built and has not finished writing
(`hold` / `release`): a message built ahead while the previous one is written, and the one gRPC is
writing, twice (gRPC copies it; both copies live until the write completes). When the total is over
the budget, streams stop building ahead (`has_room`) and new streams are refused, so memory held
by slow or stalled clients stays near the budget: at most one message per stream beyond it. A
stream whose client stops reading altogether is cut after the write timeout (reaper.py), which
releases what it held.

All calls come from the server's event loop (one thread): no locks.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from shardstream.errors import ResourceExhaustedError

__all__ = [
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_MAX_STREAMS_PER_PEER",
    "DEFAULT_RETRY_AFTER_S",
    "DEFAULT_STREAM_BUFFER_BYTES",
    "Admission",
    "AdmissionLimits",
    "Ticket",
    "peer_host",
]

DEFAULT_MAX_STREAMS = 1024
DEFAULT_MAX_STREAMS_PER_PEER = 256
DEFAULT_STREAM_BUFFER_BYTES = 1 << 30
DEFAULT_RETRY_AFTER_S = 1.0

LIMITS = ("server", "peer", "buffer")
STREAMS_REFUSED = Counter(
    "shardstream_streams_refused_total",
    "Read streams refused with RESOURCE_EXHAUSTED, by the limit they hit (server, peer or buffer)",
    ["limit"],
)
for _limit in LIMITS:  # export 0 for the series known to exist
    STREAMS_REFUSED.labels(_limit)
STREAM_BUFFER_BYTES = Gauge(
    "shardstream_stream_buffer_bytes",
    "Bytes of Read messages built and not yet written (the one being written counted twice)",
    multiprocess_mode="livesum",
)


def peer_host(peer: str) -> str:
    """A gRPC peer string without its port: 'ipv4:10.1.2.3:5678' -> 'ipv4:10.1.2.3',
    'ipv6:[::1]:5678' -> 'ipv6:[::1]'; other forms ('unix:/path', '') as they are."""
    kind, sep, address = peer.partition(":")
    if sep and kind in ("ipv4", "ipv6"):
        host, colon, port = address.rpartition(":")
        if colon and port.isdigit():
            return f"{kind}:{host}"
    return peer


@dataclass(frozen=True)
class AdmissionLimits:
    """Per server process (a supervisor splits the server's limits between its workers, config.py)."""

    max_streams: int = DEFAULT_MAX_STREAMS
    max_streams_per_peer: int = DEFAULT_MAX_STREAMS_PER_PEER
    buffer_bytes: int = DEFAULT_STREAM_BUFFER_BYTES
    retry_after_s: float = DEFAULT_RETRY_AFTER_S

    def __post_init__(self) -> None:
        for name in ("max_streams", "max_streams_per_peer", "buffer_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.retry_after_s >= 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s!r}")


class Ticket:
    """One admitted stream: what it holds, given back by `close()` (once; later calls do nothing)."""

    def __init__(self, admission: Admission, peer: str) -> None:
        self._admission = admission
        self.peer = peer
        self.held = 0
        self._open = True

    def hold(self, nbytes: int) -> None:
        with self._admission._lock:  # a Flight stream builds in one thread and sends from another
            if not self._open:  # a build that finished after its stream ended holds nothing
                return
            self.held += nbytes
            self._admission._add_bytes(nbytes)

    def release(self, nbytes: int) -> None:
        with self._admission._lock:
            nbytes = min(nbytes, self.held)
            self.held -= nbytes
            self._admission._add_bytes(-nbytes)

    def close(self) -> None:
        with self._admission._lock:
            if self._open:
                self._open = False
                self.release(self.held)
                self._admission._leave(self.peer)


class Admission:
    """The Read streams of one server process."""

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        self.streams = 0
        self.buffered_bytes = 0
        self._per_peer: Tally[str] = Tally()
        # The event loop's Read streams and the Flight plane's threads share one admission.
        self._lock = threading.RLock()

    def has_room(self) -> bool:
        """Whether streams may build a message ahead (the buffer budget is not spent)."""
        return self.buffered_bytes < self.limits.buffer_bytes

    def admit(self, peer: str) -> Ticket:
        """A ticket for a new stream from `peer` (a gRPC peer string), or ResourceExhaustedError."""
        with self._lock:
            return self._admit(peer)

    def _admit(self, peer: str) -> Ticket:
        lim = self.limits
        host = peer_host(peer)
        if self.streams >= lim.max_streams:
            self._refuse(
                "server", f"{self.streams} Read streams in progress, this server's limit (--max-streams)"
            )
        if self._per_peer[host] >= lim.max_streams_per_peer:
            self._refuse(
                "peer",
                f"{self._per_peer[host]} Read streams in progress from {host or 'this peer'}, this server's "
                "limit per peer (--max-streams-per-peer)",
            )
        if not self.has_room():
            self._refuse(
                "buffer",
                f"its streams hold {self.buffered_bytes} bytes of messages not yet sent, over its budget of "
                f"{lim.buffer_bytes} (--stream-buffer-mib)",
            )
        self.streams += 1
        self._per_peer[host] += 1
        return Ticket(self, host)

    def _refuse(self, limit: str, why: str) -> None:
        STREAMS_REFUSED.labels(limit).inc()
        wait = self.limits.retry_after_s
        raise ResourceExhaustedError(
            f"server busy: {why}; try another server, or this one again in {wait:g} s", retry_after_s=wait
        )

    def _leave(self, host: str) -> None:
        with self._lock:
            self.streams -= 1
            self._per_peer[host] -= 1
            if self._per_peer[host] <= 0:
                del self._per_peer[host]

    def _add_bytes(self, nbytes: int) -> None:
        with self._lock:
            self.buffered_bytes += nbytes
        STREAM_BUFFER_BYTES.inc(nbytes)
