"""FAULT INJECTORS (not mocks) of the chaos suite: proxies on loopback in front of real servers.

    Blackhole(upstream_port)        TCP: forwards both ways until `blackhole()`; from then on every
                                    connection, open or new, is accepted and gets nothing back (no
                                    byte, no FIN, no RST): a server hung behind a load balancer, a
                                    partitioned node. What the client has to notice on its own
                                    (keepalive pings unanswered, its idle watchdog).
    S3Faults(upstream_port, ...)    HTTP/1.1 in front of an S3 server: a share of the GETs answered
                                    503 SlowDown or 500 InternalError, a share forwarded with their
                                    body cut mid-read (the connection closed half-way), a share
                                    delayed (latency spikes); everything else goes through unchanged.
                                    Counters say what was injected.

Each runs an asyncio loop in a daemon thread (`ProxyThread`), is a context manager, and listens on
a free loopback port (`port`). The chaos driver (loadtest/chaos.py) and tests/test_chaos.py use them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections import Counter

__all__ = ["Blackhole", "ProxyThread", "S3Faults"]

CHUNK_BYTES = 65536
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    """A loopback port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def data_port_behind(proxy: ProxyThread, data_port: int) -> tuple[str, ...]:
    """`serve` arguments for a data plane on `data_port` that clients reach through `proxy` (started
    with `data_port` upstream): GetDataset names the proxy's port, so Read streams cross it."""
    return ("--data-port", str(data_port), "--advertised-data-port", str(proxy.port))


class ProxyThread:
    """An asyncio TCP server on 127.0.0.1 (a free port) in a thread of its own; `_handle` per connection.
    Leaving the `with` block closes the listener and every connection, so that each handler ends."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._closing: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def target(self) -> str:
        """host:port, as a gRPC client names it."""
        return f"127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        """http://host:port, as an S3 client names it."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._thread.start()
        if not self._ready.wait(STOP_TIMEOUT_S):
            raise RuntimeError(f"{type(self).__name__} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None and self._closing is not None
            self._server.close()
            self._closing.set()
            for w in list(self._writers):
                w.close()
            if self._handlers:
                _, left = await asyncio.wait(self._handlers, timeout=STOP_TIMEOUT_S / 2)
                for task in left:
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(STOP_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._closing = asyncio.Event()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._guarded, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _guarded(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._handlers.discard(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the upstream server, closed with the proxy."""
        r, w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers.add(w)
        return r, w

    async def _closed(self) -> None:
        """Until the proxy closes."""
        assert self._closing is not None
        await self._closing.wait()


class Blackhole(ProxyThread):
    """A TCP proxy that goes silent on `blackhole()` (see the module docstring)."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self._silent = threading.Event()
        self.connections = 0
        self.swallowed_bytes = 0  # what clients sent after the blackhole began (pings, new requests)

    def blackhole(self) -> None:
        self._silent.set()

    @property
    def silent(self) -> bool:
        return self._silent.is_set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.silent:
            await self._swallow(reader)
            return
        up_r, up_w = await self._upstream()
        try:
            tasks = [
                asyncio.ensure_future(self._pipe(reader, up_w)),
                asyncio.ensure_future(self._pipe(up_r, writer)),
            ]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._writers.discard(up_w)
            up_w.close()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(CHUNK_BYTES):
            if self.silent:
                self.swallowed_bytes += len(data)
                await self._swallow(r)  # nothing more goes through, the connection stays open
                return
            w.write(data)
            await w.drain()

    async def _swallow(self, r: asyncio.StreamReader) -> None:
        while data := await r.read(CHUNK_BYTES):
            self.swallowed_bytes += len(data)
        await self._closed()  # the peer closed its side: keep ours open, silent, until the proxy closes


_ERRORS = {
    503: ("Service Unavailable", "SlowDown", "Please reduce your request rate."),
    500: ("Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
}


class S3Faults(ProxyThread):
    """HTTP/1.1 proxy in front of an S3 server that injects faults into GETs (see the module docstring).

    Of the GETs, `error_ratio` are answered 503 or 500 (half each) without reaching the server,
    `cut_ratio` are forwarded with their body cut after a random part of it, `spike_ratio` are
    forwarded `spike_s` late. Other requests (HEAD, PUT, ...) and the other GETs go through unchanged.
    Every response closes its connection (`Connection: close` is asked of the server too), so requests
    never share a connection and a fault hits exactly one. `counts` holds what was done."""

    def __init__(
        self,
        upstream_port: int,
        *,
        error_ratio: float = 0.2,
        cut_ratio: float = 0.1,
        spike_ratio: float = 0.05,
        spike_s: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(upstream_port)
        if error_ratio + cut_ratio > 1 or min(error_ratio, cut_ratio, spike_ratio, spike_s) < 0:
            raise ValueError(
                f"bad fault ratios: errors {error_ratio}, cuts {cut_ratio}, spikes {spike_ratio}"
            )
        self.error_ratio = error_ratio
        self.cut_ratio = cut_ratio
        self.spike_ratio = spike_ratio
        self.spike_s = spike_s
        self._rng = random.Random(seed)
        self.counts: Counter[str] = Counter()

    def _choose(self, method: str) -> tuple[str, float]:
        """(what to do, latency): forward, error_503, error_500 or cut."""
        if method != "GET":
            return "forward", 0.0
        self.counts["get"] += 1
        spike = self.spike_s if self._rng.random() < self.spike_ratio else 0.0
        x = self._rng.random()
        if x < self.error_ratio:
            return ("error_503" if self._rng.random() < 0.5 else "error_500"), spike
        if x < self.error_ratio + self.cut_ratio:
            return "cut", spike
        return "forward", spike

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method = lines[0].split(" ", 1)[0]
        headers = [ln for ln in lines[1:] if ln and not ln.lower().startswith(("connection:", "keep-alive:"))]
        fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in headers)}
        body = await reader.readexactly(int(fields.get("content-length", "0")))
        action, spike = self._choose(method)
        if spike:
            self.counts["spike"] += 1
            await asyncio.sleep(spike)
        if action.startswith("error_"):
            self.counts[action] += 1
            await self._error(writer, int(action[-3:]))
            return
        up_r, up_w = await self._upstream()
        try:
            up_w.write(
                ("\r\n".join([lines[0], *headers, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + body
            )
            await up_w.drain()
            if action == "cut":
                await self._cut(up_r, writer)
                return
            while data := await up_r.read(CHUNK_BYTES):
                writer.write(data)
                await writer.drain()
        finally:
            self._writers.discard(up_w)
            up_w.close()

    async def _cut(self, up_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward the response head and a random part of its body, then close."""
        head = await up_r.readuntil(b"\r\n\r\n")
        length = 0
        for ln in head.decode("latin-1").split("\r\n"):
            if ln.lower().startswith("content-length:"):
                length = int(ln.split(":", 1)[1])
        writer.write(head)
        if length < 2:  # nothing to cut in: an empty or one-byte body goes through whole
            writer.write(await up_r.read(length) if length else b"")
            await writer.drain()
            return
        keep = self._rng.randrange(1, length)
        writer.write(await up_r.readexactly(keep))
        await writer.drain()
        self.counts["cut"] += 1

    async def _error(self, writer: asyncio.StreamWriter, status: int) -> None:
        reason, code, message = _ERRORS[status]
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>chaos</RequestId></Error>"
        ).encode()
        writer.write(
            (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
                "x-amz-request-id: chaos\r\nConnection: close\r\n\r\n"
            ).encode()
            + body
        )
        await writer.drain()
