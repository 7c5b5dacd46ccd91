"""A job's chunks through one session: store byte ranges as content-addressed chunks, commit a step,
fetch a part's tensors back. What `Checkpointer` and the DCP plugins (dcp.py) share.

Storing cuts each byte range into `chunk_bytes` pieces, hashes them (sha256 in `pool`'s threads:
it releases the GIL), asks the server which it has (`checkpoint.has`) and sends only the others, in
DoPuts of up to PUT_BATCH_BYTES without copying them. Committing polls until the last rank's part has
landed, sending again any chunk the server says is missing (a gc took it meanwhile). Fetching spreads
a part's chunks over a few DoGets (transport.chunk_batches) and writes each chunk straight into the
tensors it belongs to.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shardstream.errors import DataLossError, FailedPreconditionError, UnavailableError

from .state_tree import find, new_array, writable_view
from .transport import MAX_PUT_CHUNKS, CheckpointSession, chunk_batches

__all__ = ["COMMIT_POLL_S", "PUT_BATCH_BYTES", "ChunkStore"]

log = logging.getLogger("shardstream.client.checkpoint")

PUT_BATCH_BYTES = 64 << 20  # chunks per DoPut, by bytes
COMMIT_POLL_S = (0.01, 1.0)  # waiting for the other ranks' parts: first and longest wait between polls


class ChunkStore:
    def __init__(self, session: CheckpointSession, job: str, pool: ThreadPoolExecutor, chunk_bytes: int) -> None:
        self.session = session
        self.job = job
        self.pool = pool
        self.chunk_bytes = chunk_bytes

    def store(
        self, views: Sequence[memoryview], sent: list[str] | None = None
    ) -> tuple[list[list[list[Any]]], int, dict[str, memoryview]]:
        """Chunk, hash and store byte ranges: per view its [[sha256, size], ...], the bytes sent
        (those the server did not have), and the chunks by name (until the commit: one a gc took
        meanwhile is sent again). The names of the chunks sent are added to `sent` (a save that
        fails asks the server to remove them: `abort`)."""
        pieces: list[tuple[int, memoryview]] = []  # (view, bytes)
        for i, data in enumerate(views):
            for start in range(0, data.nbytes, self.chunk_bytes):
                pieces.append((i, data[start : start + self.chunk_bytes]))
        hashes = list(self.pool.map(lambda p: hashlib.sha256(p[1]).hexdigest(), pieces))
        by_hash = {h: p[1] for h, p in zip(hashes, pieces, strict=True)}
        names = list(by_hash)
        present: set[str] = set()
        for start in range(0, len(names), 4096):
            body = {"job": self.job, "hashes": names[start : start + 4096]}
            present |= set(self.session.action("checkpoint.has", body)["present"])
        sent_bytes = self.put([h for h in names if h not in present], by_hash, sent)
        chunks: list[list[list[Any]]] = [[] for _ in views]
        for (i, data), h in zip(pieces, hashes, strict=True):
            chunks[i].append([h, data.nbytes])
        return chunks, sent_bytes, by_hash

    def commit(
        self,
        step: int,
        save_id: str,
        world_size: int,
        by_hash: Mapping[str, memoryview],
        sent_names: list[str] | None = None,
    ) -> int:
        """Commit once every rank's part is in (polling for the others'); the bytes sent again."""
        sent = 0
        wait = COMMIT_POLL_S[0]
        while True:
            body = {"job": self.job, "step": step, "world_size": world_size, "save_id": save_id}
            out = self.session.action("checkpoint.commit", body)
            if out["committed"]:
                return sent
            if out["missing"]:  # reclaimed by a gc since the server said it had them: send again
                resend = [h for h in out["missing"] if h in by_hash]
                if not resend:
                    raise FailedPreconditionError(
                        f"checkpoint {self.job}@{step}: {len(out['missing'])} chunk(s) its parts name are not stored "
                        "(removed by a gc during the save?): save the step again"
                    )
                sent += self.put(resend, by_hash, sent_names)
                continue
            time.sleep(wait)  # the other ranks' parts: the last one to land commits
            wait = min(wait * 2, COMMIT_POLL_S[1])

    def put(self, hashes: list[str], by_hash: Mapping[str, memoryview], sent: list[str] | None = None) -> int:
        """Send these chunks, in DoPuts of up to PUT_BATCH_BYTES and MAX_PUT_CHUNKS; the bytes sent."""
        total = 0
        batch: list[tuple[str, memoryview]] = []
        size = 0
        for h in hashes:
            batch.append((h, by_hash[h]))
            size += by_hash[h].nbytes
            if size >= PUT_BATCH_BYTES or len(batch) == MAX_PUT_CHUNKS:
                self._put(batch, sent)
                total, batch, size = total + size, [], 0
        if batch:
            self._put(batch, sent)
            total += size
        return total

    def _put(self, batch: list[tuple[str, memoryview]], sent: list[str] | None) -> None:
        if sent is not None:  # named before the call: a DoPut that fails half-way stored some of them
            sent.extend(h for h, _ in batch)
        self.session.put_chunks(self.job, batch)

    def abort(self, sent: Sequence[str]) -> None:
        """A save failed: ask the server to remove the chunks it sent (those no committed step names),
        so a full root is not left full by a save that did not commit. Best effort: a failure is
        logged (gc reclaims them later)."""
        try:
            for start in range(0, len(sent), MAX_PUT_CHUNKS):
                self.session.action("checkpoint.abort", {"job": self.job, "hashes": list(sent[start : start + MAX_PUT_CHUNKS])})
        except Exception as exc:  # noqa: BLE001 — the save's own error is the one the caller sees
            log.warning("checkpoint job %s: the failed save's chunks were not removed (gc reclaims them): %s", self.job, exc)

    def fetch(self, part: Mapping[str, Any], into: Any, where: str, verify: bool) -> dict[str, Any]:
        """name -> tensor of the part, its bytes fetched, verified and written in place."""
        out: dict[str, Any] = {}
        dest: dict[str, memoryview] = {}
        copies: list[tuple[Any, Any]] = []  # (into's tensor, loaded) for targets not loaded directly
        owners: dict[str, list[tuple[str, int, int]]] = {}  # chunk -> [(tensor, offset, size)]
        for name, t in part["tensors"].items():
            target = find(into, t["path"]) if into is not None else None
            view = writable_view(target, t["kind"], t["dtype"], t["shape"], t["path"]) if target is not None else None
            if view is not None:
                out[name], dest[name] = target, view
            else:
                out[name], dest[name] = new_array(t["kind"], t["dtype"], t["shape"])
                if target is not None:
                    copies.append((target, out[name]))
            offset = 0
            for h, size in t["chunks"]:
                owners.setdefault(h, []).append((name, offset, size))
                offset += size
        order = list(owners)
        paths = {name: t["path"] for name, t in part["tensors"].items()}

        def write(h: str, buf: Any) -> None:
            if h not in owners:
                raise UnavailableError(f"{where}: the server sent chunk {h[:16]} that was not asked for")
            data = memoryview(buf).cast("B")
            if verify and hashlib.sha256(data).hexdigest() != h:
                name = owners[h][0][0]
                raise DataLossError(f"{where}: tensor {paths[name]!r} chunk {h} is corrupt (its bytes hash differently)")
            for name, offset, size in owners[h]:
                dest[name][offset : offset + size] = data

        def fetch(batch: list[str]) -> None:
            try:
                self.session.get_chunks(self.job, batch, write)
            except DataLossError as exc:
                if str(exc).startswith(where):
                    raise
                h = next((h for h in batch if h in str(exc)), batch[0])
                name, _, _ = owners[h][0]
                raise DataLossError(f"{where}: tensor {paths[name]!r} chunk {h}: {exc}") from exc

        batches = chunk_batches(order)
        for future in [self.pool.submit(fetch, b) for b in batches]:
            future.result()
        for target, loaded in copies:  # a CUDA or strided tensor of `into`: one copy from host memory
            if hasattr(target, "copy_"):
                target.copy_(loaded)
            else:
                target[...] = loaded
        return out
