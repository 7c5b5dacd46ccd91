"""FAULT INJECTOR (not a mock): a TCP proxy in front of a real server that cuts one connection midway.

`CutOnce(port, cut_after_bytes=N)` forwards bytes both ways unchanged, except that its first
connection is closed (both sides) once N bytes have come back from the server: a gRPC stream broken
at a chosen point of what it sent (in the middle of a step sent in parts, say), which a server
cannot be asked to do. Later connections go through whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

__all__ = ["CutOnce"]


class CutOnce:
    def __init__(self, upstream_port: int, *, cut_after_bytes: int) -> None:
        self.upstream_port = upstream_port
        self.cut_after_bytes = cut_after_bytes
        self.cut = threading.Event()  # set once the cut is done
        self.port = 0
        self._connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> CutOnce:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
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
        self._connections += 1
        limit = self.cut_after_bytes if self._connections == 1 else None
        writers = [client_w]
        tasks: list[asyncio.Future[None]] = []
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            writers.append(up_w)
            tasks = [
                asyncio.ensure_future(self._pipe(up_r, client_w, limit)),
                asyncio.ensure_future(self._pipe(client_r, up_w, None)),
            ]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except OSError:
            pass
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in writers:
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()

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
