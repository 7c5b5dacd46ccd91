"""Checkpoints under one root: chunks, parts, and the commit that makes a step exist (DESIGN §13).

The layout and records are shardstream/checkpoint_format.py's. Every write goes through `Storage`
(a local directory or `s3://`), so both kinds of root behave the same:

- `put_chunk` checks the bytes against their name (sha256) and writes them create-if-absent: a
  chunk is never rewritten, and one already there is not written again (incremental saves).
- `put_part` writes one rank's part record (replacing an earlier attempt's) unless the step is
  committed already.
- `commit` writes the manifest **create-if-absent and last**: only when every rank 0..W-1 has a part
  of the same save (`save_id`) and every chunk they name is stored. It answers what is still missing
  instead, so the last rank to finish commits, and a chunk reclaimed meanwhile is sent again.
  Parts are durable before the manifest is written (Storage writes return once durable), so a
  committed step always loads; a save killed anywhere before it leaves the previous step `latest`.
- Reads verify: a chunk whose bytes do not hash to its name is DataLossError naming the
  checkpoint's job and the chunk; an unreadable manifest is DataLossError naming its step.

Reclaiming space is reclaim.py's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shardstream.checkpoint_format import (
    FORMAT,
    MANIFEST_KIND,
    check_hash,
    check_job,
    check_part,
    check_step,
    chunk_hash,
    chunk_key,
    chunks_of,
    manifest_key,
    manifest_prefix,
    part_key,
    part_prefix,
    step_of_manifest_key,
)
from shardstream.errors import DataLossError, FailedPreconditionError, InvalidArgumentError, NotFoundError
from shardstream.storage import Storage

__all__ = ["CheckpointStore", "dumps"]

_HEAD_THREADS = 16  # concurrent existence checks (one HEAD each on S3)


def dumps(record: Any) -> bytes:
    """A record as canonical JSON (sorted keys, no spaces)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


class CheckpointStore:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._heads = ThreadPoolExecutor(_HEAD_THREADS, thread_name_prefix="checkpoint-head")

    def close(self) -> None:
        self._heads.shutdown(wait=False)

    # --- chunks ---------------------------------------------------------------------------------
    def _exists(self, key: str) -> bool:
        try:
            self.storage.head(key)
        except NotFoundError:
            return False
        return True

    def has_chunks(self, job: str, hashes: Iterable[str]) -> list[str]:
        """Those of `hashes` stored under `job` (in the order given)."""
        wanted = [check_hash(h) for h in dict.fromkeys(hashes)]
        found = self._heads.map(lambda h: self._exists(chunk_key(job, h)), wanted)
        return [h for h, ok in zip(wanted, found, strict=True) if ok]

    def put_chunk(self, job: str, h: str, data: bytes | memoryview) -> bool:
        """Store a chunk under its sha256 `h`; False when it was there already. Bytes that do not
        hash to `h` are refused (DataLossError: they were damaged on the way)."""
        key = chunk_key(job, h)
        if chunk_hash(data) != h:
            raise DataLossError(f"checkpoint job {job}: chunk {h[:16]} arrived damaged (its bytes hash differently)")
        return self.storage.put_if_absent(key, bytes(data))

    def read_chunk(self, job: str, h: str) -> bytes:
        """The chunk's bytes, verified against its name."""
        data = self.storage.get(chunk_key(job, h))
        if chunk_hash(data) != h:
            raise DataLossError(f"checkpoint job {job}: chunk {h} is corrupt (its bytes hash differently)")
        return data

    # --- parts and commits ------------------------------------------------------------------------
    def is_committed(self, job: str, step: int) -> bool:
        return self._exists(manifest_key(job, step))

    def put_part(self, job: str, step: int, rank: int, part: dict[str, Any]) -> None:
        check_job(job)
        check_step(step)
        record = check_part(part, job=job, step=step, rank=rank)
        if self.is_committed(job, step):
            raise FailedPreconditionError(f"checkpoint {job}@{step} is committed already: a step is saved once")
        self.storage.put(part_key(job, step, rank), dumps(record))

    def _parts(self, job: str, step: int) -> dict[int, dict[str, Any]]:
        out = {}
        for key in self.storage.list(part_prefix(job, step)):
            name = key.rpartition("/")[2]
            if not (name.endswith(".json") and name[:-5].isdigit()):
                continue  # a writer's temp file
            try:
                record = check_part(json.loads(self.storage.get(key)), job=job, step=step)
            except (NotFoundError, ValueError):
                continue  # replaced or removed meanwhile; or unreadable: not a part
            out[record["rank"]] = record
        return out

    def commit(self, job: str, step: int, world_size: int, save_id: str) -> dict[str, Any]:
        """Commit `job@step` if every part of save `save_id` and their chunks are stored:
        {"committed": True, "manifest": ..., "new": whether this call wrote it} or
        {"committed": False, "waiting_for": [ranks], "missing": [chunk names]}."""
        check_job(job)
        check_step(step)
        key = manifest_key(job, step)
        existing = self._manifest_or_none(job, step)
        if existing is not None:
            if existing["parts"] and existing["parts"][0].get("save_id") != save_id:
                raise FailedPreconditionError(f"checkpoint {job}@{step} was committed by another save")
            return {"committed": True, "manifest": existing, "new": False}
        parts = self._parts(job, step)
        waiting = [
            r
            for r in range(world_size)
            if r not in parts or parts[r]["save_id"] != save_id or parts[r]["world_size"] != world_size
        ]
        if waiting:
            return {"committed": False, "waiting_for": waiting, "missing": []}
        ordered = [parts[r] for r in range(world_size)]
        names = sorted({h for p in ordered for h in chunks_of(p)})
        present = set(self.has_chunks(job, names))
        missing = [h for h in names if h not in present]
        if missing:
            return {"committed": False, "waiting_for": [], "missing": missing}
        manifest = {
            "kind": MANIFEST_KIND,
            "format": FORMAT,
            "job": job,
            "step": step,
            "world_size": world_size,
            "committed_s": time.time(),
            "bytes": sum(t["nbytes"] for p in ordered for t in p["tensors"].values()),
            "chunks": len(names),
            "parts": ordered,
        }
        if not self.storage.put_if_absent(key, dumps(manifest)):  # another rank committed it first
            return {"committed": True, "manifest": self.manifest(job, step), "new": False}
        for r in range(world_size):  # the manifest holds them now (gc removes any left behind)
            self.storage.delete(part_key(job, step, r))
        return {"committed": True, "manifest": manifest, "new": True}

    # --- committed checkpoints --------------------------------------------------------------------
    def jobs(self) -> list[str]:
        return [j for j in self.storage.children("") if self._valid_job(j)]

    @staticmethod
    def _valid_job(name: str) -> bool:
        try:
            check_job(name)
        except InvalidArgumentError:
            return False
        return True

    def steps(self, job: str) -> list[int]:
        """Committed steps of `job`, oldest first."""
        found = (step_of_manifest_key(k) for k in self.storage.list(manifest_prefix(job)))
        return sorted(s for s in found if s is not None)

    def latest(self, job: str) -> int | None:
        steps = self.steps(job)
        return steps[-1] if steps else None

    def _manifest_or_none(self, job: str, step: int) -> dict[str, Any] | None:
        try:
            return self.manifest(job, step)
        except NotFoundError:
            return None

    def manifest(self, job: str, step: int) -> dict[str, Any]:
        """The committed manifest of `job@step`: NotFoundError when there is none."""
        try:
            raw = self.storage.get(manifest_key(job, step))
        except NotFoundError:
            raise NotFoundError(f"checkpoint {job}@{step} does not exist (or is not committed)") from None
        try:
            record = json.loads(raw)
            if record.get("kind") != MANIFEST_KIND or record.get("step") != step or record.get("job") != job:
                raise ValueError("not this checkpoint's manifest")
            for p in record["parts"]:
                check_part(p, job=job, step=step)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataLossError(f"checkpoint {job}@{step}: its manifest is unreadable ({exc})") from exc
        return record  # type: ignore[no-any-return]

    def verify(self, job: str, step: int) -> list[str]:
        """Problems of a committed checkpoint (empty: every chunk is there and hashes to its name)."""
        manifest = self.manifest(job, step)
        problems = []
        for part in manifest["parts"]:
            for _, t in sorted(part["tensors"].items(), key=lambda kv: int(kv[0])):
                for i, (h, size) in enumerate(t["chunks"]):
                    where = f"rank {part['rank']} tensor {t['path']!r} chunk {i} ({h[:16]})"
                    try:
                        data = self.storage.get(chunk_key(job, h))
                    except NotFoundError:
                        problems.append(f"{where}: missing")
                        continue
                    if len(data) != size or chunk_hash(data) != h:
                        problems.append(f"{where}: corrupt (its bytes hash differently)")
        return problems
