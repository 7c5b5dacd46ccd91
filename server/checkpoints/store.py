"""Checkpoints under one root: chunks, parts, and the commit that makes a step exist (DESIGN §13).

The layout and records are shardstream/checkpoint_format.py's. Every write goes through `Storage`
(a local directory or `s3://`), so both kinds of root behave the same. The store is the domain
boundary: each method checks the values it is given (job, step, rank, world size, save id, chunk
names, part records: checkpoint_format's check_*) once, whoever calls it — the data plane
(plane.py, which checks only what the wire alone knows: who may, and the bounds of one call), the
`shardstream checkpoint` commands, gc — since its keys are storage paths.

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
  checkpoint's job and the chunk; a missing one is DataLossError too (a committed step named it);
  an unreadable manifest is DataLossError naming its step.
- Deduplication verifies before it trusts: a stored chunk a save would reuse (`has_chunks`, or a
  `put_chunk` of bytes already there) is re-read and hashed unless this process verified it since
  it last changed (a mark per chunk: its storage etag when it hashed right, VERIFIED_MARKS of them).
  A corrupt one is removed and reported absent, so the save uploads it again — which repairs every
  older step that names it. The cost: one read of each reused chunk per server process, the first
  time a save reuses it.
- A damaged manifest is contained: `latest` skips it (logged once, counted in
  shardstream_checkpoint_damaged_manifests_total), `sort_steps` names them for `list` and `gc`.
- A full root is ResourceExhaustedError (Storage's), and nothing half-written stays: `forget`
  removes what an aborted save stored and no committed step names.

Reclaiming space is reclaim.py's.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import Counter

from shardstream.checkpoint_format import (
    FORMAT,
    MANIFEST_KIND,
    check_hash,
    check_job,
    check_part,
    check_rank,
    check_save_id,
    check_step,
    check_world_size,
    chunk_hash,
    chunk_key,
    chunks_of,
    manifest_key,
    manifest_prefix,
    part_key,
    part_prefix,
    step_of_manifest_key,
)
from shardstream.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    excerpt,
)
from shardstream.storage import Storage

__all__ = ["CheckpointStore", "dumps"]

log = logging.getLogger("shardstream.server.checkpoints")

_HEAD_THREADS = 16  # concurrent existence checks (one HEAD each on S3)
VERIFIED_MARKS = 1 << 18  # chunks whose verification a process remembers (~60 bytes each: 16 MiB)
WAITING_LISTED = 64  # ranks a commit's answer names of those it waits for (it counts them all)

DAMAGED = Counter(
    "shardstream_checkpoint_damaged_manifests_total",
    "Committed checkpoint manifests found unreadable (each counted once per process); the step is skipped",
)
CORRUPT = Counter(
    "shardstream_checkpoint_corrupt_chunks_total",
    "Stored checkpoint chunks found corrupt when a save would reuse them (removed; the save sends them again)",
)


def dumps(record: Any) -> bytes:
    """A record as canonical JSON (sorted keys, no spaces)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


class CheckpointStore:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._heads = ThreadPoolExecutor(_HEAD_THREADS, thread_name_prefix="checkpoint-head")
        self._marks: OrderedDict[str, str] = OrderedDict()  # chunk key -> etag it was verified at
        self._damaged: set[tuple[str, int]] = set()  # manifests found unreadable (logged once)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._heads.shutdown(wait=False)

    # --- chunks ---------------------------------------------------------------------------------
    def _exists(self, key: str) -> bool:
        try:
            self.storage.head(key)
        except NotFoundError:
            return False
        return True

    def _mark(self, key: str, etag: str) -> None:
        with self._lock:
            self._marks[key] = etag
            self._marks.move_to_end(key)
            while len(self._marks) > VERIFIED_MARKS:
                self._marks.popitem(last=False)

    def _verified(self, job: str, h: str) -> bool:
        """Whether chunk `h` is stored and hashes to its name (read and hashed unless marked at its
        current etag). A corrupt one is removed, logged and counted: a save sends it again."""
        key = chunk_key(job, h)
        try:
            etag = self.storage.head(key).etag
        except NotFoundError:
            return False
        with self._lock:
            if self._marks.get(key) == etag:
                return True
        try:
            _, digest = self.storage.digest(key, etag=etag)  # streamed: a chunk is never held whole here
        except NotFoundError:
            return False
        except DataLossError:  # replaced while it was read: not trusted (the save sends it)
            return False
        if digest == h:
            self._mark(key, etag)
            return True
        CORRUPT.inc()
        log.warning("checkpoint job %s: stored chunk %s is corrupt: removed, the next save sends it again", job, h)
        self.storage.delete(key)
        with self._lock:
            self._marks.pop(key, None)
        return False

    def has_chunks(self, job: str, hashes: Iterable[str]) -> list[str]:
        """Those of `hashes` stored under `job` and intact (in the order given): a save sends the others."""
        wanted = [check_hash(h) for h in dict.fromkeys(hashes)]
        found = self._heads.map(lambda h: self._verified(job, h), wanted)
        return [h for h, ok in zip(wanted, found, strict=True) if ok]

    def put_chunk(self, job: str, h: str, data: bytes | memoryview) -> bool:
        """Store a chunk under its sha256 `h`; False when an intact copy was there already (one that
        is not is replaced). Bytes that do not hash to `h` are refused (DataLossError: they were
        damaged on the way). The bytes go to storage as they are (no copy here)."""
        key = chunk_key(job, h)
        if chunk_hash(data) != h:
            raise DataLossError(f"checkpoint job {job}: chunk {h[:16]} arrived damaged (its bytes hash differently)")
        for _ in range(2):
            if self.storage.put_if_absent(key, data):
                try:
                    self._mark(key, self.storage.head(key).etag)
                except NotFoundError:
                    pass
                return True
            if self._verified(job, h):  # there already: reused only once it checks out
                return False
        raise DataLossError(f"checkpoint job {job}: chunk {h[:16]} could not be stored intact")

    def forget(self, job: str, hashes: Iterable[str]) -> int:
        """Remove chunks an aborted save stored, except those a committed step names (another save
        may have reused them since); the bytes freed. A save racing this one finds a chunk gone at
        its commit and sends it again."""
        wanted = {check_hash(h) for h in hashes}
        if not wanted:
            return 0
        for step in self.steps(job):
            try:
                wanted -= chunks_of(self.manifest(job, step))
            except (DataLossError, NotFoundError):  # damaged (it names nothing that loads) or gone
                continue
        freed = 0
        for h in sorted(wanted):
            key = chunk_key(job, h)
            try:
                freed += self.storage.head(key).size
            except NotFoundError:
                continue
            self.storage.delete(key)
            with self._lock:
                self._marks.pop(key, None)
        return freed

    def read_chunk(self, job: str, h: str) -> bytes:
        """The chunk's bytes, verified against its name; DataLossError when it is missing or corrupt."""
        try:
            data = self.storage.get(chunk_key(job, h))
        except NotFoundError:
            raise DataLossError(f"checkpoint job {job}: chunk {h} is missing from storage") from None
        if chunk_hash(data) != h:
            raise DataLossError(f"checkpoint job {job}: chunk {h} is corrupt (its bytes hash differently)")
        return data

    # --- parts and commits ------------------------------------------------------------------------
    def is_committed(self, job: str, step: int) -> bool:
        return self._exists(manifest_key(job, step))

    def put_part(self, job: str, step: int, rank: int, part: dict[str, Any]) -> None:
        """Write `rank`'s part of `job@step` (replacing an earlier attempt's) unless the step is committed."""
        record = check_part(part, job=check_job(job), step=check_step(step), rank=check_rank(rank))
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
        {"committed": False, "waiting_for": [ranks], "missing": [chunk names]}.

        Every chunk the parts name is looked for again here, though `has` or a DoPut saw it moments
        ago: a gc (reclaim.py: a chunk only a removed step named goes at once) or another save's
        abort (`forget` spares only what committed steps name) may have removed it since, and a
        commit never names a chunk that is not stored. One HEAD per chunk where this process
        verified it (has_chunks' marks); it is re-read and hashed only where it did not."""
        check_job(job)
        check_step(step)
        check_world_size(world_size)
        check_save_id(save_id)
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
            return {"committed": False, "waiting_for": waiting[:WAITING_LISTED], "waiting": len(waiting), "missing": []}
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
        """The newest committed step whose manifest reads (a damaged one is skipped: see sort_steps)."""
        for step in reversed(self.steps(job)):
            try:
                self.manifest(job, step)
            except DataLossError:
                continue
            except NotFoundError:  # removed meanwhile
                continue
            return step
        return None

    def sort_steps(self, job: str) -> tuple[list[int], list[int]]:
        """(intact, damaged) committed steps, oldest first: every manifest read once (a damaged one is
        logged and counted once per process)."""
        intact, damaged = [], []
        for step in self.steps(job):
            try:
                self.manifest(job, step)
            except DataLossError:
                damaged.append(step)
            except NotFoundError:  # removed meanwhile
                continue
            else:
                intact.append(step)
        return intact, damaged

    def known_damaged(self, job: str) -> set[int]:
        """Steps of `job` this process found damaged (until gc removes them: see steps())."""
        with self._lock:
            return {s for j, s in self._damaged if j == job}

    def _note_damaged(self, job: str, step: int, exc: BaseException) -> None:
        with self._lock:
            if (job, step) in self._damaged:
                return
            self._damaged.add((job, step))
        DAMAGED.inc()
        log.error("checkpoint %s@%d: its manifest is unreadable (%s): skipped; `checkpoint gc` removes it", job, step, exc)

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
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            self._note_damaged(job, step, exc)
            raise DataLossError(f"checkpoint {job}@{step}: its manifest is unreadable ({excerpt(str(exc))})") from exc
        if self._damaged:
            with self._lock:
                self._damaged.discard((job, step))  # written again since (gc removed the damaged one)
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
