"""Admission of Read streams: how many run at once, per server process and per peer, and the bytes
they hold.

`Admission.admit(peer)` gives a new stream its `Ticket`, or refuses it with RESOURCE_EXHAUSTED and
a retry hint (`grpc-retry-pushback-ms`, errors.py) when the process already runs `max_streams`
streams, `max_streams_per_peer` of them for that peer, or its streams hold their buffer budget
(`buffer_bytes`, `--stream-buffer-mib`). The client (client/transport/session.py) then tries its next
endpoint after at least that long; the refusal is counted by the limit it hit. A peer is the
client's address without its port (`peer_host`): the ranks of one host share its allowance,
however many connections they open.

The budget counts every byte a stream holds, continuously, not only at admission:

- before a message is built, the stream reserves what the build may take (`Ticket.reserve`: the
  rows gathered, taken and transformed, estimated from the stream's last message, server/read/message_steps.py
  `build_estimate`); once built, the reservation becomes what the message keeps alive (`settle`:
  its Arrow buffers, a slice of a row group counted whole, server/read/message_steps.py `Message.holds`);
- the message is released when Flight asks for the next one (`release`): it has been written to
  the connection, out of the process's hands. A stream whose client stops reading therefore holds
  the message Flight is writing and at most the one built ahead.

A reservation is granted when it fits the budget, or when the stream holds nothing and the budget
is not spent (so a stream always progresses, even with a message larger than the budget, and the
budget is overrun by at most one message's estimate). Otherwise a new stream is refused (its first
message: RESOURCE_EXHAUSTED, limit "buffer") and a running one waits, holding nothing, until bytes
drain (`reserve(wait=True)`); building ahead is skipped. A stream whose client stops reading
altogether is cut after the write timeout (reaper.py), which releases what it held.

The bound this gives (deploy/RUNBOOK.md, "Limits"), per server process:

    RSS <= warm + caches (--cache-mib, read-ahead within it) + BOUND_FACTOR x --stream-buffer-mib

"warm" is the process after serving one stream (thread pools, libraries); "caches" holds the row
groups builds in flight use too (they are pinned in the cache, and a build waits for room there:
server/read/cache.py `lease`); the factor covers what
gRPC and the allocators keep around the counted bytes, and the buffers of gathered messages kept for
reuse (an eighth of the budget, at most 32 MiB: server/read/message_buffers.py). The server
allocates Arrow memory from jemalloc with immediate decay (server/lifecycle.py) so that freed build memory goes back to the system.
Measured with `python -m loadtest.stall_bench` (loadtest/README.md): 256 stalled streams from one
peer and 1,000 from several, each shuffle mode, within the bound.

The Flight plane's threads share one admission: a lock guards it; waiting streams sleep on its
condition.
"""
from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from shardstream.errors import ResourceExhaustedError

__all__ = [
    "BOUND_FACTOR",
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
_WAIT_POLL_S = 0.25  # how often a stream waiting for room looks whether its client left
BOUND_FACTOR = 2  # RSS <= warm + caches + BOUND_FACTOR x budget (the module docstring)

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
    "Bytes Read streams hold: messages built and not yet written, and builds in progress (reserved)",
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

    def reserve(
        self, nbytes: int, *, wait: bool = False, cancelled: Callable[[], bool] | None = None
    ) -> bool:
        """Hold `nbytes` for a message about to be built: True once granted (module docstring).
        Without `wait`, False at once when the budget has no room; with it, wait until it has, and
        False only when `cancelled()` says the stream is over (or the ticket was closed)."""
        adm = self._admission
        with adm._room:
            while self._open and not adm._fits(self, nbytes):
                if not wait or (cancelled is not None and cancelled()):
                    return False
                adm._room.wait(_WAIT_POLL_S)
            if not self._open:
                return False
            self.held += nbytes
            adm._add_bytes(nbytes)
            return True

    def reserve_or_refuse(self, nbytes: int) -> None:
        """`reserve` for a new stream's first message: ResourceExhaustedError when there is no room."""
        if not self.reserve(nbytes):
            adm = self._admission
            adm._refuse(
                "buffer",
                f"its streams hold {adm.buffered_bytes} bytes of messages, at its budget of "
                f"{adm.limits.buffer_bytes} (--stream-buffer-mib)",
            )

    def settle(self, reserved: int, nbytes: int) -> None:
        """A build that reserved `reserved` bytes now holds `nbytes` (its message)."""
        if nbytes >= reserved:
            self.hold(nbytes - reserved)
        else:
            self.release(reserved - nbytes)

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
        # The Flight plane's threads share one admission; streams waiting for room sleep on _room.
        self._lock = threading.RLock()
        self._room = threading.Condition(self._lock)

    def has_room(self) -> bool:
        """Whether the buffer budget is not spent (a new stream may start)."""
        return self.buffered_bytes < self.limits.buffer_bytes

    def _fits(self, ticket: Ticket, nbytes: int) -> bool:
        """Whether `ticket` may reserve `nbytes` more: within the budget, or it holds nothing and the
        budget is not spent (progress for every stream, whatever its message's size)."""
        budget = self.limits.buffer_bytes
        return self.buffered_bytes + nbytes <= budget or (ticket.held == 0 and self.buffered_bytes < budget)

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
                f"its streams hold {self.buffered_bytes} bytes of messages, at its budget of "
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
            if nbytes < 0:
                self._room.notify_all()
        STREAM_BUFFER_BYTES.inc(nbytes)
