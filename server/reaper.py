"""Streams whose client stopped reading: cut after a write timeout, so they hold no server memory.

A Read stream writes with backpressure: `context.write` waits while the client's HTTP/2 flow-control
window is full, and the message waits in gRPC's buffers meanwhile. A client that reads nothing —
frozen (SIGSTOP, a debugger), or alive but stuck — would hold the message, its stream's admission
slot (admission.py) and the next message built ahead for as long as it lasts. gRPC offers a server
no way to cancel one call, and a frozen process's kernel keeps acknowledging TCP, so nothing ends it.

`Reaper.write(context, data, peer, port)` awaits one write; one that has waited `timeout_s` (plus
at most a quarter of it, or 1 s) is reaped: logged and its connection shut down — the socket whose remote address is the
call's peer, found in /proc/net/tcp{,6} and among this process's descriptors (Linux; the descriptor
is checked to be that socket before `shutdown`). gRPC then ends every call of that connection and
frees their buffers; each of those streams is counted (`shardstream_streams_reaped_total`) as its
write fails. The client, if it ever reads again, sees UNAVAILABLE and resumes at its first missing
step (on any endpoint), as after any broken connection. A write that fails because the call ended
under it (its client went away) raises StreamGone: there is no one left to send a status to.
Where the socket is not found, the server's keepalive (app.py) still ends a frozen client's
connection when its pings go unanswered, and the stream leaves its slot at once either way.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import grpc
from prometheus_client import Counter

__all__ = ["Reaper", "StreamGone", "StreamReaped", "shutdown_connection"]

log = logging.getLogger(__name__)

STREAMS_REAPED = Counter(
    "shardstream_streams_reaped_total",
    "Read streams cut because their client read nothing for the write timeout (--write-timeout-s)",
)


_REMEMBER_S = 60.0  # how long the streams of a shut-down connection are counted as reaped


class StreamGone(Exception):
    """The stream's call ended while one of its messages was being written."""


class StreamReaped(StreamGone):
    """The stream's client read nothing for the write timeout; its connection was shut down."""


@dataclass
class _Write:
    since: float  # time.monotonic() when the write began
    peer: str
    local_port: int
    task: asyncio.Task[Any]
    reaped: bool = False


class Reaper:
    """The writes of one server process's streams, with their timeout.

    The writes in progress are in a dict; one sweeper task (running while there are writes) looks
    at them a few times per timeout and reaps the overdue ones: a write costs a dict entry, not a
    timer of its own (asyncio.wait_for costs ~20 µs a message)."""

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"the write timeout must be > 0 seconds, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self._writes: dict[int, _Write] = {}
        self._next = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._shut: dict[str, float] = {}  # peer -> when its connection was shut down

    def _was_shut(self, peer: str) -> bool:
        now = time.monotonic()
        for old in [p for p, t in self._shut.items() if now - t > _REMEMBER_S]:
            del self._shut[old]
        return peer in self._shut

    async def write(self, context: grpc.aio.ServicerContext, data: bytes, peer: str, local_port: int) -> None:
        """Write one message of a stream from `peer`; StreamReaped once it waited for the timeout,
        StreamGone when the call ends under the write."""
        task = asyncio.current_task()
        assert task is not None
        key, self._next = self._next, self._next + 1
        entry = self._writes[key] = _Write(time.monotonic(), peer, local_port, task)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.ensure_future(self._sweep())
        try:
            await context.write(data)
        except asyncio.CancelledError:
            if entry.reaped:  # the sweeper's cancel, not the call's
                if hasattr(task, "uncancel"):  # Python 3.11+
                    task.uncancel()
                raise StreamReaped(f"client {peer} read nothing for {self.timeout_s:g} s") from None
            if self._was_shut(peer):
                STREAMS_REAPED.inc()
            raise
        except Exception as exc:  # noqa: BLE001 — gRPC's errors of a finished call (ExecuteBatchError, UsageError)
            if self._was_shut(peer):
                STREAMS_REAPED.inc()
                raise StreamReaped(f"client {peer}: its connection was shut down") from exc
            raise StreamGone(f"client {peer} went away: {type(exc).__name__}") from exc
        finally:
            del self._writes[key]

    async def _sweep(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while self._writes:
            await asyncio.sleep(period)
            now = time.monotonic()
            for entry in list(self._writes.values()):
                if not entry.reaped and now - entry.since > self.timeout_s:
                    self._reap(entry)

    def _reap(self, entry: _Write) -> None:
        STREAMS_REAPED.inc()
        entry.reaped = True
        closed = shutdown_connection(entry.peer, entry.local_port)
        if closed:
            self._shut[entry.peer] = time.monotonic()
        log.warning(
            "reaped a Read stream of %s: its client read nothing for %g s (%s)",
            entry.peer or "an unknown peer",
            self.timeout_s,
            "connection shut down" if closed else "its connection was not found; keepalive will end it",
        )
        entry.task.cancel()


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
