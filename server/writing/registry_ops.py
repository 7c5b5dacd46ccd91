"""Registry operations that read data: `register` (bring your own Parquet) and `verify`.

`register NAME --from URI...` turns Parquet files already under `<root>/<NAME>/` (written by Spark,
Ray Data, DuckDB, pandas, …) into a new version without rewriting them: it reads every footer
concurrently (one ranged read each), checks that all files share one schema — naming the files and
fields that differ when they do not — and only then reads each file once (concurrently) for the
manifest's content hash (sha256) and row-group checksums (crc32 of the footer and of every column
chunk, server/read/checksums.py), which `verify` and the server's read-path checks compare against.

Lineage: the registry checks the claimed change against the latest version (or infers it). Files the
latest version already holds keep its order and come first, then the new files in sorted order, so
registering a grown prefix is an `append`.

`verify NAME[@V]` recomputes every shard's size and sha256 — and, for shards that have them, the
crc32 of its footer and of every column chunk — and reports each shard that differs, naming the row
groups and columns. It only reads: a version registered before row-group checksums existed is
checked by size and sha256 and stays as it is (registering its files again makes a version with
them, of the same fingerprint).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from shardstream.errors import DataLossError, InvalidArgumentError, NotFoundError
from shardstream.lineage import CLAIMS
from shardstream.manifest import Manifest, Shard, ShardChecksums, validate_name
from shardstream.provenance import PROVENANCE_COLUMNS
from shardstream.registry import Registry
from shardstream.storage import LocalStorage, check_key

from ..read.checksums import check_footer, chunk_spans, footer_bytes_of, scan_shard
from ..read.shards import read_footer

__all__ = ["ShardProblem", "register", "verify"]

DEFAULT_THREADS = 32
PARQUET_SUFFIXES = (".parquet", ".pq")
T = TypeVar("T")
R = TypeVar("R")


def _bar(total: int, desc: str, progress: bool | None, unit: str = "B") -> tqdm:
    return tqdm(
        total=total,
        unit=unit,
        unit_scale=unit == "B",
        desc=desc,
        disable=None if progress is None else not progress,  # None: a bar only on a terminal
    )


def _pmap(
    fn: Callable[[T], R], items: Sequence[T], threads: int, bar: tqdm, weight: Callable[[T], int]
) -> list[R]:
    """`fn` over `items` on `threads` threads, in order; the first error is raised."""
    with ThreadPoolExecutor(max(1, min(threads, len(items)))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        out = []
        try:
            for item, fut in zip(items, futures, strict=True):
                out.append(fut.result())
                bar.update(weight(item))
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return out


# --- register ------------------------------------------------------------------------------------
def _source_key(registry: Registry, name: str, uri: str) -> str:
    """The storage key (`NAME/...`) of a `--from` location; InvalidArgumentError when it is unsafe."""
    root = registry.storage.url.rstrip("/")
    dataset = f"{root}/{name}"
    if uri.startswith("s3://"):
        if not (uri.rstrip("/") + "/").startswith(dataset + "/") or not uri.startswith(root + "/"):
            raise InvalidArgumentError(f"--from {uri}: outside the dataset's directory {dataset}/")
        rel = uri[len(root) + 1 :]
    elif "://" in uri or uri.lower().startswith("file:"):
        raise InvalidArgumentError(
            f"--from {uri!r}: only s3:// URIs and paths are accepted (for a local file give its path)"
        )
    elif os.path.isabs(uri):
        if not isinstance(registry.storage, LocalStorage):
            raise InvalidArgumentError(f"--from {uri}: a local path, but --root is {root}")
        if ".." in Path(uri).parts:
            raise InvalidArgumentError(f"--from {uri!r} has a '..' segment")
        try:
            rel = Path(os.path.abspath(uri)).relative_to(os.path.abspath(registry.storage.root)).as_posix()
        except ValueError:
            raise InvalidArgumentError(f"--from {uri}: outside the dataset's directory {dataset}/") from None
        if not (rel + "/").startswith(f"{name}/"):
            raise InvalidArgumentError(f"--from {uri}: outside the dataset's directory {dataset}/")
    else:  # relative to the dataset's directory
        rel = uri.strip("/")
        rel = name if rel in ("", ".") else f"{name}/{check_key(rel, '--from')}"
    rel = rel.rstrip("/")
    if rel != name:
        check_key(rel, "--from")
    return rel


def _expand(registry: Registry, key: str) -> list[str]:
    """The Parquet files a `--from` key names: itself, or the ones under that prefix."""
    storage = registry.storage
    if key.lower().endswith(PARQUET_SUFFIXES):
        try:
            storage.head(key)
            return [key]
        except NotFoundError:
            pass
    found = []
    for k in storage.list(key):
        rel = k[len(key) + 1 :]
        parts = rel.split("/")
        # Hidden and bookkeeping files (Spark's _SUCCESS, _committed_*, .crc) are not data.
        if any(p.startswith((".", "_")) for p in parts):
            continue
        if rel.lower().endswith(PARQUET_SUFFIXES):
            found.append(k)
    return found


@dataclass(frozen=True)
class _Footer:
    key: str
    size: int
    etag: str
    row_groups: tuple[int, ...]
    schema: pa.Schema
    metadata: pq.FileMetaData
    footer_bytes: int


def _footer(registry: Registry, key: str) -> _Footer:
    storage = registry.storage
    info = storage.head(key)
    try:
        (_, tail), md = read_footer(lambda s, n: storage.get_range(key, s, n, etag=info.etag), info.size)
        schema = md.schema.to_arrow_schema().remove_metadata()
        for g in range(md.num_row_groups):  # column chunks inside the file, or no checksums for them
            chunk_spans(md, g, info.size)
    except (DataLossError, OSError, pa.ArrowException) as exc:
        raise InvalidArgumentError(f"{storage.url_of(key)}: not a readable Parquet file ({exc})") from exc
    groups = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
    return _Footer(key, info.size, info.etag, groups, schema, md, footer_bytes_of(tail))


def _scan(registry: Registry, f: _Footer) -> tuple[int, str, ShardChecksums]:
    """(size, sha256, checksums) of a file whose footer was read: one pass over its bytes."""
    return scan_shard(registry.storage.iter_chunks(f.key, etag=f.etag), f.metadata, f.size, f.footer_bytes)


def _schema_differences(footers: Sequence[_Footer], base: str) -> list[str]:
    ref = footers[0]
    out = []
    for f in footers[1:]:
        if f.schema.equals(ref.schema):
            continue
        where, there = f.key[len(base) + 1 :], ref.key[len(base) + 1 :]
        for field in ref.schema:
            if field.name not in f.schema.names:
                out.append(f"{where} lacks field {field.name!r} (in {there})")
            elif not f.schema.field(field.name).type.equals(field.type):
                out.append(
                    f"{where}: field {field.name!r} is {f.schema.field(field.name).type}, {there} has {field.type}"
                )
        for field in f.schema:
            if field.name not in ref.schema.names:
                out.append(f"{where} has field {field.name!r} that {there} lacks")
        if not out or not out[-1].startswith(where):
            out.append(f"{where}: fields in another order ({f.schema.names} vs {ref.schema.names})")
    return out


def register(
    registry: Registry,
    name: str,
    sources: Iterable[str],
    *,
    threads: int = DEFAULT_THREADS,
    progress: bool | None = None,
    change: str | None = None,
) -> Manifest:
    """Register the Parquet files under `sources` (inside `<root>/<name>/`) as the next version of `name`.

    `change` is the claimed change from the latest version (`lineage.CLAIMS`; None: inferred), checked
    by the registry before anything is written.
    """
    validate_name(name)
    if change is not None and change not in CLAIMS:
        raise InvalidArgumentError(f"unknown change {change!r}: one of {', '.join(CLAIMS)}")
    keys: list[str] = []
    for uri in sources:
        key = _source_key(registry, name, uri)
        found = _expand(registry, key)
        if not found:
            raise InvalidArgumentError(
                f"--from {uri}: no Parquet files ({', '.join(PARQUET_SUFFIXES)}) there"
            )
        keys += found
    keys = sorted(dict.fromkeys(keys))
    if not keys:
        raise InvalidArgumentError("register: give at least one --from location")
    with _bar(len(keys), f"footers {name}", progress, unit="file") as bar:
        footers = _pmap(lambda k: _footer(registry, k), keys, threads, bar, lambda _: 1)
    diffs = _schema_differences(footers, name)
    if diffs:
        more = f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""
        raise InvalidArgumentError(f"schemas differ: {'; '.join(diffs[:8])}{more}")
    schema = footers[0].schema
    reserved = [n for n in schema.names if n in PROVENANCE_COLUMNS]
    if reserved:
        raise InvalidArgumentError(f"column name(s) {reserved} are reserved for provenance")
    if not schema.names:
        raise InvalidArgumentError("the files have no columns")

    with _bar(sum(f.size for f in footers), f"hash {name}", progress) as bar:
        digests = _pmap(lambda f: _scan(registry, f), footers, threads, bar, lambda f: f.size)
    shards = []
    for f, (size, sha, sums) in zip(footers, digests, strict=True):
        if size != f.size:
            raise DataLossError(f"{registry.storage.url_of(f.key)} changed while being registered")
        shards.append(Shard(f.key[len(name) + 1 :], sum(f.row_groups), size, f.row_groups, sha, sums))
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")

    def build(version: int, parent: int | None) -> Manifest:
        ordered = shards
        if parent is not None:  # the parent's files first, in its order
            place = {s.uri: i for i, s in enumerate(registry.resolve(f"{name}@{parent}").shards)}
            ordered = sorted(shards, key=lambda s: (0, place[s.uri]) if s.uri in place else (1, 0))
        return Manifest(
            name=name,
            version=version,
            schema=schema,
            shards=tuple(ordered),
            created_at=created,
            metadata={"modality": "table", "source": "register", "files": len(shards)},
        )

    return registry.create_version(name, build, change=change)


# --- verify --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardProblem:
    uri: str
    problem: str


def _check_shard(registry: Registry, m: Manifest, shard: Shard) -> ShardProblem | None:
    key = registry.shard_key(m, shard.uri)
    sums = shard.checksums
    storage = registry.storage
    problems: list[str] = []
    try:
        info = storage.head(key)
        if info.size != shard.bytes:
            return ShardProblem(shard.uri, f"size {info.size} bytes, manifest says {shard.bytes}")
        if sums is None:  # an older manifest: the whole file's sha256 is all there is
            size, sha = storage.digest(key, etag=info.etag)
        else:
            size, sha, problems = _check_chunks(registry, key, info.size, info.etag, sums)
    except NotFoundError:
        return ShardProblem(shard.uri, "missing")
    except DataLossError as exc:
        return ShardProblem(shard.uri, str(exc))
    if size != shard.bytes:
        return ShardProblem(shard.uri, f"size {size} bytes, manifest says {shard.bytes}")
    if sha != shard.sha256:
        problems.insert(0, f"sha256 {sha[:16]}… differs from the manifest's {shard.sha256[:16]}…")
    if not problems:
        return None
    more = f"; and {len(problems) - 6} more" if len(problems) > 6 else ""
    return ShardProblem(shard.uri, "; ".join(problems[:6]) + more)


def _check_chunks(
    registry: Registry, key: str, size: int, etag: str, sums: ShardChecksums
) -> tuple[int, str, list[str]]:
    """(size, sha256, problems): the footer's crc32, then every column chunk's, in one pass."""
    storage = registry.storage
    fb = min(sums.footer_bytes, size)
    footer = storage.get_range(key, size - fb, fb, etag=etag)
    try:
        check_footer(footer, sums)
        md = pq.read_metadata(pa.BufferReader(footer))
    except (DataLossError, OSError, pa.ArrowException) as exc:  # chunk ranges unknown: the sha256 alone
        size, sha = storage.digest(key, etag=etag)
        return size, sha, [str(exc) if isinstance(exc, DataLossError) else f"unreadable footer ({exc})"]
    if md.num_row_groups != len(sums.row_groups) or (md.num_row_groups and md.num_columns != sums.columns):
        size, sha = storage.digest(key, etag=etag)
        return size, sha, ["the footer's row groups or columns differ from the manifest's checksums"]
    size, sha, got = scan_shard(storage.iter_chunks(key, etag=etag), md, size, sums.footer_bytes)
    problems = []
    for g in range(len(sums.row_groups)):
        if got.row_groups[g] == sums.row_groups[g]:
            continue
        spans = chunk_spans(md, g, size)
        for span, have, want in zip(spans, got.chunks(g), sums.chunks(g), strict=True):
            if have != want:
                problems.append(
                    f"row group {g}: column chunk {span.column!r} crc32 {have:08x} differs from the "
                    f"manifest's {want:08x}"
                )
    return size, sha, problems


def verify(
    registry: Registry, m: Manifest, *, threads: int = DEFAULT_THREADS, progress: bool | None = None
) -> list[ShardProblem]:
    """Every shard of `m` whose size, sha256 or row-group checksums differ from the manifest (or that is
    missing). Reads only: nothing is written, whatever it finds."""
    if not m.shards:
        return []
    with _bar(m.num_bytes, f"verify {m.ref}", progress) as bar:
        results = _pmap(lambda s: _check_shard(registry, m, s), m.shards, threads, bar, lambda s: s.bytes)
    return [r for r in results if r is not None]
