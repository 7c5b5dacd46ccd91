"""Versions written and registered by a distributed engine (Spark, Ray): the engine-neutral half.

An engine runs `write_part` or `describe_file` in its own tasks — one per partition or file, where
the data is — and each returns `Part`s as JSON: a manifest `Shard` entry whose sha256 and row-group
checksums (server/read/checksums.py) were computed there, from the bytes just written or read, plus the file's
Arrow schema. The driver makes the version from them with `register_parts`, reading no file again.
The engine adapters (`shardstream.engines.spark_io`, `shardstream.engines.ray_io`) only move batches and parts around.

Layout of a write: `<root>/<name>/data/<write id>/part-<PPPPP>-<token>.parquet`. The write id is 32
hex digits like an ingest's, so `datasets gc` removes what a failed job leaves behind; a file is
written under a temp name (the storage's `.NAME.<32 hex>.tmp` form, gc's too) and renamed once
complete; the token is new for every task attempt, so a retried or speculative attempt never
replaces the file another attempt described. Files are written as `ingest` writes shards
(shard_writer.py: row groups of about `row_group_bytes`, Parquet page checksums). Shards are listed
in partition order.

A task that finds a problem in the data (not Parquet, a Parquet page checksum that fails, a column
that cannot be cast) returns a Part with `error` set instead of raising, so the engine does not
retry a deterministic failure and the driver raises one ShardstreamError naming the file.

(About 460 lines: what a task does and what the driver does with its answer are two halves of one
contract — the Part's JSON — and are kept side by side so that they change together.)
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shardstream import errors
from shardstream.errors import DataLossError, InvalidArgumentError, ShardstreamError
from shardstream.lineage import CLAIMS
from shardstream.manifest import Derivation, Manifest, Shard, schema_from_b64, schema_to_b64, validate_name
from shardstream.provenance import PROVENANCE_COLUMNS
from shardstream.registry import Registry

from ..backends.roots import open_registry
from ..read.reader import DEFAULT_HASH_CHECK_MAX_BYTES
from ..read.shards import open_shard
from .ingest import DEFAULT_ROW_GROUP_BYTES
from .registry_ops import _expand, _footer, _scan, _source_key  # register's own per-file steps
from .shard_writer import ShardWriter

__all__ = [
    "DEFAULT_ROW_GROUP_BYTES",
    "FileSpec",
    "Part",
    "WriteSpec",
    "check_columns",
    "describe_file",
    "new_write_id",
    "prepare_write",
    "read_row_groups",
    "register_parts",
    "remove_write",
    "source_keys",
    "task_root",
    "write_part",
]

_ONE_FILE = 1 << 62  # ShardWriter's shard size limit when a task writes exactly one file
_MAX_LISTED = 6  # problems named in one error line


def new_write_id() -> str:
    return uuid.uuid4().hex


def task_root(root: str | os.PathLike[str]) -> str:
    """`root` as tasks must see it: an s3:// URL as given, a local directory made absolute (a task's
    working directory is the engine's, not the driver's)."""
    text = os.fspath(root)
    return text if text.startswith("s3://") else os.path.abspath(text)


@dataclass(frozen=True)
class Part:
    """One file a task wrote or described: its manifest entry and schema, or what went wrong."""

    part: int  # the partition / task index: the shard's place in the version
    shard: Shard | None
    schema: pa.Schema | None
    error: str = ""
    error_class: str = ""  # a shardstream.errors class name

    def to_json(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "shard": None if self.shard is None else self.shard.to_json(),
            "schema": None if self.schema is None else schema_to_b64(self.schema),
            "error": self.error,
            "error_class": self.error_class,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Part:
        return cls(
            part=int(d["part"]),
            shard=None if d.get("shard") is None else Shard.from_json(d["shard"]),
            schema=None if d.get("schema") is None else schema_from_b64(d["schema"]),
            error=str(d.get("error", "")),
            error_class=str(d.get("error_class", "")),
        )

    @classmethod
    def failed(cls, part: int, exc: ShardstreamError) -> Part:
        return cls(part, None, None, str(exc), type(exc).__name__)

    def raise_error(self) -> None:
        cls = getattr(errors, self.error_class, None)
        if not (isinstance(cls, type) and issubclass(cls, ShardstreamError)):
            cls = ShardstreamError
        raise cls(self.error)


def check_columns(names: Sequence[str]) -> None:
    """InvalidArgumentError for columns a version cannot have (checked on the driver, before writing)."""
    reserved = [n for n in names if n in PROVENANCE_COLUMNS]
    if reserved:
        raise InvalidArgumentError(f"column name(s) {reserved} are reserved for provenance; rename them")
    if not names:
        raise InvalidArgumentError("the data has no columns")


# --- write (in a task) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class WriteSpec:
    """What every write task of one job needs (small and picklable: engines ship it to the tasks)."""

    root: str
    name: str
    write_id: str
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    row_group_rows: int | None = None
    schema_b64: str | None = None  # cast every batch to this Arrow schema (None: keep the data's)
    s3_endpoint: str | None = None

    def __post_init__(self) -> None:
        validate_name(self.name)
        if self.row_group_bytes < 1 or (self.row_group_rows is not None and self.row_group_rows < 1):
            raise InvalidArgumentError(
                f"row groups must be >= 1 byte / row, got {self.row_group_bytes} bytes, {self.row_group_rows} rows"
            )

    @property
    def prefix(self) -> str:
        """The storage key of this write's directory."""
        return f"{self.name}/data/{self.write_id}"


def prepare_write(
    root: str,
    name: str,
    *,
    change: str | None = None,
    schema: pa.Schema | None = None,
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
    row_group_rows: int | None = None,
    s3_endpoint: str | None = None,
) -> WriteSpec:
    """The spec of a new write of `name` (on the driver, before any task runs): the claimed change is
    known, the latest version is readable (else DataLossError, nothing written) and, for an append,
    batches are cast to the parent's schema (as `ingest --append` writes them)."""
    validate_name(name)
    if change is not None and change not in CLAIMS:
        raise InvalidArgumentError(f"unknown change {change!r}: one of {', '.join(CLAIMS)}")
    with open_registry(root, s3_endpoint=s3_endpoint) as registry:
        parent = registry.check_parent(name)
    if change == "append" and schema is None:
        if parent is None:
            raise InvalidArgumentError(
                f"change 'append': no dataset named {name!r} under {root} to append to"
            )
        schema = parent.schema
    if schema is not None:
        check_columns(schema.names)
    return WriteSpec(
        root=task_root(root),
        name=name,
        write_id=new_write_id(),
        row_group_bytes=row_group_bytes,
        row_group_rows=row_group_rows,
        schema_b64=None if schema is None else schema_to_b64(schema),
        s3_endpoint=s3_endpoint,
    )


def _cast(batch: pa.RecordBatch, schema: pa.Schema | None, part: int) -> pa.RecordBatch:
    if schema is None or batch.schema.equals(schema):
        return batch
    if sorted(batch.schema.names) != sorted(schema.names):
        raise InvalidArgumentError(
            f"part {part}: columns {batch.schema.names} differ from the schema's {schema.names}"
        )
    arrays = []
    for field in schema:
        col = batch.column(field.name)
        try:
            arrays.append(col if col.type.equals(field.type) else col.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidArgumentError(
                f"part {part}: column {field.name!r} ({col.type}) cannot become {field.type} ({exc})"
            ) from exc
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def write_part(spec: WriteSpec, part: int, batches: Iterable[pa.RecordBatch]) -> list[dict[str, Any]]:
    """Write one task's batches as one Parquet file of the version; its Part (as JSON), or none for
    a task without rows. Runs inside an engine's task."""
    schema = None if spec.schema_b64 is None else schema_from_b64(spec.schema_b64)
    token = uuid.uuid4().hex[:12]
    final = f"part-{part:05d}-{token}.parquet"
    with open_registry(spec.root, s3_endpoint=spec.s3_endpoint) as registry:
        storage = registry.storage
        local = storage.local_path(spec.prefix)
        # A private directory beside the final file (local roots: the rename stays on one file
        # system), or a local staging directory that is uploaded from (object stores).
        staging = Path(tempfile.mkdtemp(prefix=f".{final}.", suffix=".tmp", dir=_mkdir(local)))
        try:
            writer: ShardWriter | None = None
            written_schema: pa.Schema | None = None
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                try:
                    batch = _cast(batch, schema, part)
                except InvalidArgumentError as exc:
                    return [Part.failed(part, exc).to_json()]
                if writer is None:
                    written_schema = batch.schema
                    writer = ShardWriter(
                        staging,
                        batch.schema,
                        row_group_rows=spec.row_group_rows,
                        row_group_bytes=spec.row_group_bytes,
                        shard_rows=None,
                        shard_bytes=_ONE_FILE,
                    )
                writer.write(batch)
            if writer is None:
                return []
            (shard,) = writer.finish()
            written = staging / Path(shard.uri).name
            key = f"{spec.prefix}/{final}"
            if local is not None:
                os.replace(written, local / final)
            else:
                storage.put_file(key, written)
            out = Part(part, replace(shard, uri=key[len(spec.name) + 1 :]), written_schema)
            return [out.to_json()]
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _mkdir(local: Path | None) -> str | None:
    if local is None:
        return None  # the system's temp directory
    local.mkdir(parents=True, exist_ok=True)
    return str(local)


def remove_write(root: str, name: str, write_id: str, *, s3_endpoint: str | None = None) -> None:
    """Best effort: remove what a failed write left (gc would, after its grace period)."""
    prefix = f"{name}/data/{write_id}"
    try:
        with open_registry(root, s3_endpoint=s3_endpoint) as registry:
            local = registry.storage.local_path(prefix)
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)
                return
            for key in registry.storage.list(prefix):
                registry.storage.delete(key)
    except (ShardstreamError, OSError):
        pass


# --- describe existing files (in a task) ---------------------------------------------------------
@dataclass(frozen=True)
class FileSpec:
    """What every describe task of one registration needs."""

    root: str
    name: str
    verify_pages: bool = True  # decode every page once, checking the Parquet page checksums it has
    s3_endpoint: str | None = None


def source_keys(registry: Registry, name: str, paths: Iterable[str]) -> list[str]:
    """The Parquet files (storage keys) that `paths` name, as `register --from` resolves them: files,
    directories or prefixes inside `<root>/<name>/`; hidden and `_*` files skipped; sorted."""
    validate_name(name)
    keys: list[str] = []
    for uri in paths:
        found = _expand(registry, _source_key(registry, name, str(uri)))
        if not found:
            raise InvalidArgumentError(f"{uri}: no Parquet files (.parquet, .pq) there")
        keys += found
    if not keys:
        raise InvalidArgumentError("register: give at least one file or directory")
    return sorted(dict.fromkeys(keys))


def _verify_pages(registry: Registry, key: str, size: int, etag: str) -> None:
    """Decode every row group once with Parquet page checksum verification (pages that have one)."""
    local = registry.storage.local_path(key)
    source: Any = (
        str(local)
        if local is not None
        else pa.BufferReader(registry.storage.get_range(key, 0, size, etag=etag))
    )
    pf = pq.ParquetFile(source, page_checksum_verification=True)
    for g in range(pf.num_row_groups):
        try:
            pf.read_row_group(g)
        except (OSError, pa.ArrowException) as exc:
            what = (
                "a Parquet page checksum differs" if "checksum" in str(exc).lower() else f"unreadable ({exc})"
            )
            raise DataLossError(
                f"{registry.storage.url_of(key)}: row group {g}: {what} — the file changed after it was "
                "written; nothing was registered"
            ) from exc


def describe_file(spec: FileSpec, part: int, key: str) -> dict[str, Any]:
    """The Part (as JSON) of an existing Parquet file: its footer, sha256 and row-group checksums in
    one read and, with `verify_pages`, its page checksums. Runs inside an engine's task."""
    with open_registry(spec.root, s3_endpoint=spec.s3_endpoint) as registry:
        try:
            f = _footer(registry, key)
            size, sha, sums = _scan(registry, f)
            if size != f.size:
                raise DataLossError(f"{registry.storage.url_of(key)} changed while being registered")
            if spec.verify_pages:
                _verify_pages(registry, key, f.size, f.etag)
        except ShardstreamError as exc:
            return Part.failed(part, exc).to_json()
        shard = Shard(key[len(spec.name) + 1 :], sum(f.row_groups), size, f.row_groups, sha, sums)
        return Part(part, shard, f.schema).to_json()


# --- read (in a task) ----------------------------------------------------------------------------
def read_row_groups(
    registry: Registry, m: Manifest, shard: int, columns: Sequence[str], groups: Iterable[int] | None = None
) -> Iterator[tuple[int, pa.Table]]:
    """(group, table) of row groups `groups` (default: all) of shard `shard` of `m`, each opened and
    checked as a server reads it (server/read/shards.py: size, footer crc32, column-chunk crc32s); a failed check
    is DataLossError naming version, shard and row group."""
    info = m.shards[shard]
    where = f"{m.ref}: shard {info.uri}"
    try:
        f = open_shard(
            registry.shard_path(m, info.uri), info, hash_check_max_bytes=DEFAULT_HASH_CHECK_MAX_BYTES
        )
    except ShardstreamError as exc:
        raise type(exc)(f"{where}: {exc}") from exc
    for group in range(len(info.row_groups)) if groups is None else groups:
        try:
            yield group, f.read_row_group(group, list(columns))
        except ShardstreamError as exc:
            raise type(exc)(f"{where}: row group {group}: {exc}") from exc
        except (OSError, pa.ArrowException) as exc:  # a Parquet page checksum (pyarrow: OSError)
            what = "a Parquet page checksum differs" if "checksum" in str(exc).lower() else "unreadable"
            raise DataLossError(f"{where}: row group {group}: {what}") from exc


# --- register (on the driver) --------------------------------------------------------------------
def _schema_problems(parts: Sequence[Part]) -> list[str]:
    ref = parts[0]
    assert ref.schema is not None and ref.shard is not None
    out = []
    for p in parts[1:]:
        assert p.schema is not None and p.shard is not None
        if p.schema.equals(ref.schema):
            continue
        there, here = ref.shard.uri, p.shard.uri
        for f in ref.schema:
            if f.name not in p.schema.names:
                out.append(f"{here} lacks field {f.name!r} (in {there})")
            elif not p.schema.field(f.name).type.equals(f.type):
                out.append(f"{here}: field {f.name!r} is {p.schema.field(f.name).type}, {there} has {f.type}")
        out += [
            f"{here} has field {f.name!r} that {there} lacks"
            for f in p.schema
            if f.name not in ref.schema.names
        ]
        if not out or not out[-1].startswith(here):
            out.append(f"{here}: fields in another order ({p.schema.names} vs {ref.schema.names})")
    return out


def register_parts(
    registry: Registry,
    name: str,
    parts: Iterable[Mapping[str, Any] | Part],
    *,
    change: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    derived_from: Derivation | None = None,
    keep_parent: bool = False,
) -> Manifest:
    """The next version of `name` from the parts the tasks returned, reading no file.

    Any failed part raises its error (naming the file). Shards are in part order. `keep_parent`
    (a write): with `change="append"` the version is the parent's shards followed by the new ones,
    as `ingest --append` makes it. Otherwise (files registered in place) files the parent holds keep
    its order and come first, as `register` orders them. The registry checks `change` (None:
    inferred) against the parent before writing.
    """
    validate_name(name)
    if change is not None and change not in CLAIMS:
        raise InvalidArgumentError(f"unknown change {change!r}: one of {', '.join(CLAIMS)}")
    got = [p if isinstance(p, Part) else Part.from_json(p) for p in parts]
    failed = [p for p in got if p.error]
    if failed:
        if len(failed) == 1:
            failed[0].raise_error()
        more = f"; and {len(failed) - _MAX_LISTED} more" if len(failed) > _MAX_LISTED else ""
        first = getattr(errors, failed[0].error_class, ShardstreamError)
        raise first(f"{len(failed)} files failed: " + "; ".join(p.error for p in failed[:_MAX_LISTED]) + more)
    if not got:
        raise InvalidArgumentError(f"nothing to register as {name}: no rows were written")
    got.sort(key=lambda p: (p.part, p.shard.uri if p.shard else ""))
    problems = _schema_problems(got)
    if problems:
        more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
        raise InvalidArgumentError(f"schemas differ: {'; '.join(problems[:_MAX_LISTED])}{more}")
    schema = got[0].schema
    assert schema is not None
    check_columns(schema.names)
    shards = tuple(p.shard for p in got if p.shard is not None)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    meta = {"modality": "table", **dict(metadata or {}), "files": len(shards)}

    def build(version: int, parent: int | None) -> Manifest:
        ordered = shards
        if parent is not None:
            before = registry.resolve(f"{name}@{parent}").shards
            if keep_parent and change == "append":
                ordered = before + shards
            elif not keep_parent:  # the parent's files first, in its order
                place = {s.uri: i for i, s in enumerate(before)}
                ordered = tuple(sorted(shards, key=lambda s: (0, place[s.uri]) if s.uri in place else (1, 0)))
        return Manifest(
            name=name,
            version=version,
            schema=schema,
            shards=ordered,
            created_at=created,
            metadata=meta,
            derived_from=derived_from,
        )

    return registry.create_version(name, build, change=change)
