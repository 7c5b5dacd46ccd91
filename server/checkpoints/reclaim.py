"""Reclaim a job's checkpoint space: `shardstream checkpoint gc --keep N` (DESIGN §13).

What goes, in this order (each step leaves a state that loads):

1. manifests of committed steps older than the newest `keep` intact ones — the manifest first, so a
   step is uncommitted (never listed) before anything it names is removed — and damaged manifests
   (unreadable: that step can never load; reported as `damaged_steps`);
2. part records: those of committed steps (the manifest holds a copy), those of uncommitted steps
   older than the latest commit (saves that died), and those of newer uncommitted steps untouched
   for `min_age_s` (a save still running keeps its parts);
3. chunks that no remaining manifest or part names: those a removed step named, and the others
   once older than `min_age_s` (a save uploads its chunks before its part names them: a younger
   chunk named by nothing may be one of those).

A save that raced gc and lost a chunk is told so by its commit (the chunk is missing) and sends it
again; a commit never names a chunk that is not stored.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from shardstream.checkpoint_format import (
    check_job,
    chunks_of,
    manifest_key,
    parts_prefix,
)
from shardstream.errors import InvalidArgumentError, NotFoundError

from .store import CheckpointStore

__all__ = ["DEFAULT_MIN_AGE_S", "GcReport", "collect"]

# Parts and chunks younger than this may belong to a save in progress: an hour is far longer than
# any save's upload (a 100 GB state at 1 GB/s takes under two minutes).
DEFAULT_MIN_AGE_S = 3600.0


@dataclass
class GcReport:
    job: str
    kept_steps: list[int] = field(default_factory=list)
    removed_steps: list[int] = field(default_factory=list)
    damaged_steps: list[int] = field(default_factory=list)  # unreadable manifests (removed unless a dry run)
    removed_parts: int = 0
    removed_chunks: int = 0
    freed_bytes: int = 0


def collect(
    store: CheckpointStore, job: str, *, keep: int, min_age_s: float = DEFAULT_MIN_AGE_S, dry_run: bool = False
) -> GcReport:
    check_job(job)
    if keep < 1:
        raise InvalidArgumentError(f"--keep must be at least 1 (the latest checkpoint stays), got {keep}")
    storage = store.storage
    now = time.time()
    report = GcReport(job)
    steps, damaged = store.sort_steps(job)
    report.kept_steps, dropped = steps[-keep:], steps[:-keep]
    released: set[str] = set()  # chunks the dropped steps named: no save is uploading those
    for step in sorted([*dropped, *damaged]):
        key = manifest_key(job, step)
        try:
            if step not in damaged:
                released |= chunks_of(store.manifest(job, step))
            report.freed_bytes += storage.head(key).size
        except NotFoundError:
            continue
        if not dry_run:
            storage.delete(key)
        (report.damaged_steps if step in damaged else report.removed_steps).append(step)
    every = sorted([*steps, *damaged])
    latest = every[-1] if every else -1
    committed = set(every)
    referenced: set[str] = set()
    for step in report.kept_steps:
        try:
            referenced |= chunks_of(store.manifest(job, step))
        except NotFoundError:  # removed by another gc meanwhile
            continue
    for key, info in storage.list_info(parts_prefix(job)):
        step_text = key[len(parts_prefix(job)) :].partition("/")[0]
        step = int(step_text) if step_text.isdigit() else -1
        abandoned = step in committed or step < latest or now - info.modified_s >= min_age_s
        if not abandoned:
            try:
                referenced |= chunks_of(json.loads(storage.get(key)))
            except (NotFoundError, ValueError):
                pass
            continue
        report.removed_parts += 1
        report.freed_bytes += info.size
        if not dry_run:
            storage.delete(key)
    for key, info in storage.list_info(f"{job}/chunks/"):
        h = key.rpartition("/")[2]
        if h in referenced or (h not in released and now - info.modified_s < min_age_s):
            continue
        report.removed_chunks += 1
        report.freed_bytes += info.size
        if not dry_run:
            storage.delete(key)
    if not dry_run:
        # (a minute old at least: a save may have just made one, about to write into it)
        storage.remove_empty_dirs(parts_prefix(job).rstrip("/"), min_age_s=60)
    return report
