"""`datasets gc`: remove the files of a dataset that no manifest references.

An ingest writes its shards into a directory of its own, `<name>/data/<ingest id>/` (32 hex digits),
and creates the manifest last; one that is killed in between (kill -9, a lost node, a full disk)
leaves that directory behind with no manifest referencing it. A writer of the storage killed
mid-write leaves its private temp file (`.<file>.<32 hex>.tmp`). Those are what gc removes:

- files in ingest directories that no version's manifest references (the version's own shards,
  written by ingest, are in such a directory too, and are referenced);
- temp files of the storage's writes, anywhere under the dataset;
- (local roots) ingest directories left empty.

Never removed:

- a file any manifest references, of any version;
- a file outside an ingest directory (Parquet waiting for `register`, another tool's output): it is
  reported as kept;
- anything younger than `min_age_s` (default one hour). An ingest directory is young while any file
  in it is: a running ingest keeps writing the newest shard, so gc never races it as long as the grace
  is longer than the longest pause between two shard writes. The versions are also listed again just
  before deleting, and what a manifest created meanwhile references is spared;
- anything of a dataset one of whose manifests cannot be read (what it references is unknown) or
  whose directory is a symbolic link: the dataset is skipped and reported.

Works on any Storage (a local directory or S3). Blocking. Beside ingest.py and bulk.py, whose leftovers
it removes (their ingest directories: `_INGEST_DIR`); the command is cli/datasets_gc.py. Named apart
from the checkpoint store's gc (server/checkpoints/reclaim.py, `GcReport`/`collect`): `OrphanReport`,
`remove_orphans`. Imports the core only (as does the writing package's `__init__`), so `datasets gc` on
a local root runs on a client-only install.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from shardstream.errors import NotFoundError, ShardstreamError
from shardstream.manifest import validate_name
from shardstream.registry import LINKED_DIRECTORY, BadEntry, Registry
from shardstream.storage import ObjectInfo

__all__ = ["DEFAULT_MIN_AGE_S", "OrphanFile", "OrphanReport", "remove_orphans"]

DEFAULT_MIN_AGE_S = 3600.0
_INGEST_DIR = re.compile(r"^[0-9a-f]{32}\Z")  # ingest.py: uuid4().hex
_TEMP_FILE = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp\Z")  # storage.py: LocalStorage._tmp


@dataclass(frozen=True)
class OrphanFile:
    key: str
    bytes: int
    age_s: float


@dataclass
class OrphanReport:
    """What gc did (or, with dry_run, would do) to one dataset."""

    name: str
    dry_run: bool
    removed: list[OrphanFile] = field(default_factory=list)  # removed, or to be removed with dry_run
    young: list[OrphanFile] = field(default_factory=list)  # unreferenced, younger than the grace: kept
    foreign: list[OrphanFile] = field(default_factory=list)  # unreferenced, outside ingest dirs: kept
    dirs: list[str] = field(default_factory=list)  # empty ingest directories removed
    failed: list[tuple[str, str]] = field(default_factory=list)  # (key, why) not removed
    skipped: str = ""  # why the dataset was left alone, when it was

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.removed)

    def to_json(self) -> dict[str, object]:
        def files(fs: list[OrphanFile]) -> list[dict[str, object]]:
            return [{"key": f.key, "bytes": f.bytes, "age_s": round(f.age_s, 1)} for f in fs]

        return {
            "name": self.name,
            "removed": files(self.removed),  # with dry_run: what would be
            "bytes": self.bytes,
            "dirs": self.dirs,
            "kept_young": files(self.young),
            "kept_outside_ingest_dirs": files(self.foreign),
            "failed": [{"key": k, "error": why} for k, why in self.failed],
            "skipped": self.skipped or None,
        }


def _references(registry: Registry, name: str, versions: list[int]) -> set[str] | BadEntry:
    """The keys the manifests `versions` of `name` reference, or the first one that cannot be read."""
    keys: set[str] = set()
    for v in versions:
        try:
            loaded = registry.load(name, v)
        except NotFoundError:
            continue
        if isinstance(loaded, BadEntry):
            return loaded
        keys.update(registry.shard_key(loaded, s.uri) for s in loaded.shards)
    return keys


def _skip(report: OrphanReport, bad: BadEntry) -> OrphanReport:
    report.skipped = f"{bad.ref}: {bad.reason}; nothing removed"
    return report


def remove_orphans(
    registry: Registry,
    name: str,
    *,
    min_age_s: float = DEFAULT_MIN_AGE_S,
    dry_run: bool = False,
    now: float | None = None,
) -> OrphanReport:
    """Remove (or with `dry_run`, list) what no manifest of `name` references; see the module docstring."""
    validate_name(name)
    report = OrphanReport(name, dry_run)
    storage = registry.storage
    if storage.is_link(name):
        return _skip(report, BadEntry(name, None, LINKED_DIRECTORY, name))
    try:
        versions = registry.versions(name)
    except ShardstreamError as exc:
        report.skipped = f"{name}: {exc}; nothing removed"
        return report
    referenced = _references(registry, name, versions)
    if isinstance(referenced, BadEntry):
        return _skip(report, referenced)
    listed: list[tuple[str, ObjectInfo]] = storage.list_info(f"{name}/")
    now = time.time() if now is None else now

    newest: dict[str, float] = {}  # ingest directory -> its newest file's time
    for key, info in listed:
        d = _ingest_dir(key)
        if d:
            newest[d] = max(newest.get(d, 0.0), info.modified_s)

    candidates: list[OrphanFile] = []
    for key, info in listed:
        if key in referenced:
            continue
        parts = key.split("/")
        ingest_dir = _ingest_dir(key)
        if not ingest_dir and not _TEMP_FILE.match(parts[-1]):
            if len(parts) > 2 and parts[1] in ("manifests", "tags"):
                continue  # the registry's own files
            report.foreign.append(OrphanFile(key, info.size, now - info.modified_s))
            continue
        touched = newest[ingest_dir] if ingest_dir else info.modified_s
        f = OrphanFile(key, info.size, now - info.modified_s)
        (candidates if now - touched >= min_age_s else report.young).append(f)

    # A manifest created since the first look (an ingest finishing now) keeps what it references.
    again = _references(registry, name, [v for v in registry.versions(name) if v not in versions])
    if isinstance(again, BadEntry):
        return _skip(report, again)
    for f in candidates:
        if f.key in again:
            continue
        if not dry_run:
            try:
                storage.delete(f.key)
            except (ShardstreamError, OSError) as exc:
                report.failed.append((f.key, str(exc)))
                continue
        report.removed.append(f)
    # Ingest directories left empty: the ones emptied just now (their mtime is now), and old empty ones.
    held: dict[str, int] = {}
    for key, _ in listed:
        held[_ingest_dir(key)] = held.get(_ingest_dir(key), 0) + 1
    for f in report.removed:
        held[_ingest_dir(f.key)] -= 1
    for d in storage.children(f"{name}/data"):
        key = f"{name}/data/{d}"
        if not _INGEST_DIR.match(d):
            continue
        if dry_run and key in newest and held[key] == 0:
            if storage.local_path(key) is not None:  # only a local root has directories to remove
                report.dirs.append(key)
            continue
        grace = 0.0 if key in newest and held[key] == 0 else min_age_s
        report.dirs += storage.remove_empty_dirs(key, min_age_s=grace, dry_run=dry_run)
    return report


def _ingest_dir(key: str) -> str:
    """`name/data/<ingest id>` for a key in an ingest directory, else ''."""
    parts = key.split("/")
    return (
        "/".join(parts[:3]) if len(parts) > 3 and parts[1] == "data" and _INGEST_DIR.match(parts[2]) else ""
    )
