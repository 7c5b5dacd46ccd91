"""FAULT INJECTOR (not a mock): a TCP proxy in front of the real S3 server that cuts responses.

`CuttingProxy` forwards bytes both ways unchanged, except that for its first `cuts` connections
whose request is a GET, it closes the connection once `cut_after_bytes` of the response have gone
through — a body cut mid-read, which SeaweedFS cannot be told to do.
"""

from __future__ import annotations

import asyncio
import threading


class CuttingProxy:
    def __init__(self, upstream_port: int, *, cut_after_bytes: int, cuts: int) -> None:
        self.upstream_port = upstream_port
        self.cut_after_bytes = cut_after_bytes
        self.cuts_left = cuts
        self.cuts_done = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> CuttingProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
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

        await asyncio.gather(
            pipe(client_r, up_w, None), pipe(up_r, client_w, self.cut_after_bytes if cut else None)
        )
