"""FAULT INJECTOR (not a mock): a TCP proxy in front of the real S3 server that cuts responses.

`CuttingProxy` forwards bytes both ways unchanged, except that for its first `cuts` connections
whose request is a GET, it closes the connection once `cut_after_bytes` of the response have gone
through — a body cut mid-read, which SeaweedFS cannot be told to do. The listener thread and its
shutdown are the chaos suite's (`loadtest/chaos_net.py: ProxyThread`).
"""

from __future__ import annotations

import asyncio
import contextlib

from loadtest.chaos_net import ProxyThread

__all__ = ["CuttingProxy"]


class CuttingProxy(ProxyThread):
    def __init__(self, upstream_port: int, *, cut_after_bytes: int, cuts: int) -> None:
        super().__init__(upstream_port)
        self.cut_after_bytes = cut_after_bytes
        self.cuts_left = cuts
        self.cuts_done = 0

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await self._upstream()
        first = await client_r.read(65536)
        cut = first.startswith(b"GET ") and self.cuts_left > 0
        if cut:
            self.cuts_left -= 1
        up_w.write(first)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, limit: int | None) -> None:
            sent = 0
            try:
                while data := await r.read(16384):
                    if limit is not None and sent + len(data) > limit:
                        w.write(data[: limit - sent])
                        await w.drain()
                        self.cuts_done += 1
                        break
                    w.write(data)
                    sent += len(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for writer in (client_w, up_w):
                    writer.close()

        with contextlib.suppress(ConnectionError, OSError):
            await asyncio.gather(
                pipe(client_r, up_w, None), pipe(up_r, client_w, self.cut_after_bytes if cut else None)
            )
