"""Streams whose client stopped reading: cut after a write timeout, so they hold no server memory.

A Read stream writes with backpressure: Flight's writer waits while the client's HTTP/2
flow-control window is full, and the message waits in gRPC's buffers meanwhile. A client that
reads nothing — frozen (SIGSTOP, a debugger), or alive but stuck — would hold the message, its
stream's admission slot (admission.py) and the next message built ahead for as long as it lasts.
gRPC offers a server no way to cancel one call, and a frozen process's kernel keeps acknowledging
TCP, so nothing ends it.

The data plane (data_plane.py) times each write with a `Reaper`: `watch(stream)` when a stream starts,
`writing.since` set while Flight writes a message, `forget(writing)` when it ends. A write that has
waited the write timeout (plus at most a quarter of it, or 1 s) is reaped by the Reaper's sweeper thread: logged, counted (`shardstream_streams_reaped_total`)
and its connection shut down by `shutdown_connection(peer, port)` — the socket whose remote address
is the call's peer, found in /proc/net/tcp{,6} and among this process's descriptors (Linux; the
descriptor is checked to be that socket before `shutdown`). gRPC then ends every call of that
connection and frees their buffers. The client, if it ever reads again, sees UNAVAILABLE and
resumes at its first missing step (on any endpoint), as after any broken connection.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

from prometheus_client import Counter

from .stream_log import StreamLog

__all__ = ["STREAMS_REAPED", "Reaper", "Writing", "shutdown_connection"]

log = logging.getLogger(__name__)

STREAMS_REAPED = Counter(
    "shardstream_streams_reaped_total",
    "Read streams cut because their client read nothing for the write timeout (--write-timeout-s)",
)
_REMEMBER_SHUT_S = 60.0  # how long the streams of a connection the reaper shut down count as reaped


@dataclass
class Writing:
    """A stream as the reaper sees it: since when Flight writes its message (None: it does not)."""

    peer: str
    stream: StreamLog
    since: float | None = None
    reaped: bool = False

    def overdue(self, now: float, timeout_s: float) -> bool:
        since = self.since
        return since is not None and not self.reaped and now - since > timeout_s


class Reaper:
    """The streams of one data plane that Flight is writing, and the sweeper thread that cuts those
    written to for longer than `timeout_s`: their connection (on the plane's `local_port()`) is shut
    down and every stream of it ends as reaped."""

    def __init__(self, timeout_s: float, local_port: Callable[[], int]) -> None:
        self.timeout_s = timeout_s
        self._local_port = local_port
        self._writing: dict[int, Writing] = {}
        self._shut: dict[str, float] = {}  # peer -> when the reaper shut its connection down
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, name="flight-reaper", daemon=True)
        self._sweeper.start()

    def stop(self) -> None:
        self._stopped.set()

    def watch(self, stream: StreamLog) -> tuple[int, Writing]:
        """Start watching `stream`'s writes: its key (for `forget`) and what its sender updates."""
        writing = Writing(stream.peer, stream)
        key = next(self._keys)
        with self._lock:
            self._writing[key] = writing
        return key, writing

    def forget(self, key: int) -> None:
        with self._lock:
            self._writing.pop(key, None)

    def left(self, writing: Writing) -> None:
        """Its client stopped asking: reaped if the reaper shut its connection down lately (another
        stream of the connection read nothing), else simply gone."""
        if self._was_shut(writing.peer):
            self._reap(writing, "reaped: its connection was shut down (another stream read nothing)")

    def _was_shut(self, peer: str) -> bool:
        now = time.monotonic()
        with self._lock:
            for old in [p for p, t in self._shut.items() if now - t > _REMEMBER_SHUT_S]:
                del self._shut[old]
            return peer in self._shut

    def _reap(self, writing: Writing, reason: str) -> bool:
        """Count `writing`'s stream as reaped, once (the sweeper and its connection's end may both
        see it): True the first time."""
        with self._lock:
            if writing.reaped:
                return False
            writing.reaped = True
        STREAMS_REAPED.inc()
        writing.stream.reason = reason
        return True

    def _sweep(self) -> None:
        timeout_s = self.timeout_s
        while not self._stopped.wait(min(1.0, timeout_s / 4)):
            now = time.monotonic()
            with self._lock:
                overdue = [w for w in self._writing.values() if w.overdue(now, timeout_s)]
            shut: set[str] = set()  # a connection's streams go together
            for w in overdue:
                if not self._reap(w, "reaped: nothing read for --write-timeout") or w.peer in shut:
                    continue
                with self._lock:  # before the shutdown: its other streams end as reaped, not gone
                    self._shut[w.peer] = time.monotonic()
                closed = shutdown_connection(w.peer, self._local_port())
                if closed:
                    shut.add(w.peer)
                else:
                    with self._lock:
                        self._shut.pop(w.peer, None)
                log.warning(
                    "reaped the Read streams of %s on the Flight data plane: its client read nothing for %g s (%s)",
                    w.peer or "an unknown peer",
                    timeout_s,
                    "connection shut down" if closed else "its connection was not found",
                )


def _parse_peer(peer: str) -> tuple[str, int] | None:
    """'ipv4:10.1.2.3:5678' / 'ipv6:[::1]:5678' (brackets may come %-encoded) -> (host, port)."""
    kind, _, address = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return None
    return _plain(host.strip("[]")), int(port)


def _plain(ip: str) -> str:
    """An IPv4-mapped IPv6 address as IPv4, anything else as it is."""
    return ip.removeprefix("::ffff:") if ip.startswith("::ffff:") and "." in ip else ip


def _proc_ip(hex_ip: str) -> str:
    """An address as /proc/net/tcp{,6} write it (32-bit words in host byte order, little endian)."""
    raw = b"".join(bytes.fromhex(hex_ip[i : i + 8])[::-1] for i in range(0, len(hex_ip), 8))
    return _plain(socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw))


def _socket_inodes(local_port: int, host: str, port: int) -> set[int]:
    """Inodes of the TCP sockets from local_port to host:port (this network namespace)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote, inode = fields[1], fields[2], int(fields[9])
            rhost, _, rport = remote.rpartition(":")
            if int(local.rpartition(":")[2], 16) == local_port and int(rport, 16) == port and inode:
                if _proc_ip(rhost) == host:
                    inodes.add(inode)
    return inodes


def shutdown_connection(peer: str, local_port: int) -> bool:
    """Shut down this process's TCP connection from `peer` (a gRPC peer string) to `local_port`;
    False when it is not found (not TCP, not Linux, already closed)."""
    parsed = _parse_peer(peer)
    if parsed is None or not local_port:
        return False
    inodes = _socket_inodes(local_port, *parsed)
    if not inodes:
        return False
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for name in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not (link.startswith("socket:[") and int(link[8:-1]) in inodes):
            continue
        try:
            dup = os.dup(int(name))
        except OSError:
            continue
        try:
            if os.fstat(dup).st_ino not in inodes:  # the descriptor was reused meanwhile
                continue
            with socket.socket(fileno=dup) as sock:  # closes the duplicate only
                dup = -1
                sock.shutdown(socket.SHUT_RDWR)
            return True
        except OSError:
            return False
        finally:
            if dup >= 0:
                os.close(dup)
    return False
