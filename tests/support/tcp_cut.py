"""FAULT INJECTOR (not a mock): a TCP proxy in front of a real server that cuts one connection midway.

`CutOnce(port, cut_after_bytes=N)` forwards bytes both ways unchanged, except that its first
connection is closed (both sides) once N bytes have come back from the server: a gRPC stream broken
at a chosen point of what it sent (in the middle of a step sent in parts, say), which a server
cannot be asked to do. Later connections go through whole. The listener thread and its shutdown are
the chaos suite's (`loadtest/chaos_net.py: ProxyThread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from loadtest.chaos_net import ProxyThread

__all__ = ["CutOnce"]


class CutOnce(ProxyThread):
    def __init__(self, upstream_port: int, *, cut_after_bytes: int) -> None:
        super().__init__(upstream_port)
        self.cut_after_bytes = cut_after_bytes
        self.cut = threading.Event()  # set once the cut is done
        self._connections = 0

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._connections += 1
        limit = self.cut_after_bytes if self._connections == 1 else None
        up_r, up_w = await self._upstream()
        tasks = [
            asyncio.ensure_future(self._pipe(up_r, client_w, limit)),
            asyncio.ensure_future(self._pipe(client_r, up_w, None)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            up_w.close()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, budget: int | None) -> None:
        """Forward r to w; with a budget, stop (the cut) once that many bytes went through."""
        with contextlib.suppress(ConnectionError):
            while True:
                data = await r.read(65536)
                if not data:
                    return
                if budget is not None and len(data) >= budget:
                    w.write(data[:budget])
                    await w.drain()
                    self.cut.set()
                    return
                if budget is not None:
                    budget -= len(data)
                w.write(data)
                await w.drain()
