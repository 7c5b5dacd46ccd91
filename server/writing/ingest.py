"""`shardstream ingest`: JSON Lines, Parquet, image folders, WebDataset tars or RL episodes in,
Parquet shards + a new manifest version out.

Two passes: the first reads every input's schema (Parquet: the footer; JSON Lines: a parse, kept in
memory up to a budget) and unifies them, naming the files and fields that disagree; the second
writes shards of about `shard_bytes` with row groups of about `row_group_bytes` (uncompressed;
shard_writer.py), hashing each shard, and registers the version. Nothing is registered unless
everything succeeded; shards of a failed ingest are removed. Image folders, WebDataset tars and RL episodes
(`ingest_sources`) have a schema known up front: one pass, through the same writer and registration.

Lineage: the registry checks the claimed change against the parent (or infers it). `append` is
special: the new version is the parent's shards followed by the input's, which is written in the
parent's schema (missing fields become nulls; a field the parent lacks is refused). A dataset whose
latest manifest cannot be read gets no new version (DATA_LOSS naming it, before anything is written).

Durability: the registry fsyncs the new shards and their directories, then the manifest, before the
version is returned (server/transforms/ops.py, storage.py); a killed ingest leaves only its `data/<ingest id>/`
directory, which `datasets gc` removes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
from tqdm import tqdm

from shardstream.errors import InvalidArgumentError, NotFoundError, ShardstreamError
from shardstream.lineage import CLAIMS
from shardstream.manifest import Manifest, Shard, validate_name
from shardstream.provenance import PROVENANCE_COLUMNS
from shardstream.registry import Registry

from ..backends.roots import open_registry
from .ingest_sources import FORMATS, JSONL_SUFFIXES, PARQUET_SUFFIXES, Source, detect_format, open_source
from .shard_writer import ShardWriter

__all__ = ["IngestOptions", "ingest"]

DEFAULT_ROW_GROUP_BYTES = 4 << 20
DEFAULT_SHARD_BYTES = 256 << 20
_KEEP_PARSED_BYTES = 512 << 20  # JSON parsed in pass 1 is kept for pass 2 up to this much
_JSONL_SUFFIXES = JSONL_SUFFIXES
_PARQUET_SUFFIXES = PARQUET_SUFFIXES


@dataclass(frozen=True)
class IngestOptions:
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    row_group_rows: int | None = None  # fixed rows per row group (overrides row_group_bytes)
    shard_bytes: int = DEFAULT_SHARD_BYTES
    shard_rows: int | None = None  # fixed rows per shard (overrides shard_bytes)
    progress: bool | None = None  # None: a bar when stderr is a terminal

    def __post_init__(self) -> None:
        for name in ("row_group_bytes", "shard_bytes", "row_group_rows", "shard_rows"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidArgumentError(f"{name} must be >= 1, got {value}")


def _inputs(src: Path, suffixes: tuple[str, ...] = _JSONL_SUFFIXES + _PARQUET_SUFFIXES) -> list[Path]:
    if not src.exists():
        raise InvalidArgumentError(f"{src}: no such file or directory")
    files = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]
    files = [p for p in files if p.suffix.lower() in suffixes and not p.name.startswith(".")]
    if not files:
        expected = []
        if set(suffixes) & set(_JSONL_SUFFIXES):
            expected.append(f"JSON Lines: {', '.join(_JSONL_SUFFIXES)}")
        if set(suffixes) & set(_PARQUET_SUFFIXES):
            expected.append(f"Parquet: {', '.join(_PARQUET_SUFFIXES)}")
        raise InvalidArgumentError(
            f"{src}: no input files (expected {'; '.join(expected)}; "
            "or an image folder, WebDataset *.tar or *.npz episodes: see --format)"
        )
    return files


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in _PARQUET_SUFFIXES


def _kind(value: object) -> str | None:
    """A JSON value's kind as Arrow's JSON reader types a column (null: none; ints and floats: number)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "list" if isinstance(value, list) else "object"


def _type_change(kinds: dict[str, tuple[str, int]], value: object, lineno: int, where: str = "") -> str | None:
    """Record the kinds of `value`'s fields (nested objects and list items too) first seen at which
    line; the first field whose kind differs from an earlier line's, as 'line N: ...'."""
    items = value.items() if isinstance(value, dict) else ((f"{where}[]", v) for v in value) if isinstance(value, list) else ()
    for key, v in items:
        path = f"{where}.{key}" if isinstance(value, dict) and where else str(key)
        kind = _kind(v)
        if kind is None:
            continue
        seen = kinds.setdefault(path, (kind, lineno))
        if seen[0] != kind:
            shown = json.dumps(v)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return (
                f"line {lineno}: field {path!r} is a {kind} ({shown}) where line {seen[1]} has a {seen[0]}: a column "
                f"holds one type, make them agree (e.g. all {seen[0]}s, or quote them all)"
            )
        if kind in ("object", "list"):
            found = _type_change(kinds, v, lineno, path)
            if found:
                return found
    return None


def _bad_json_line(path: Path) -> str:
    """The first line of `path` that is not a JSON object, or whose field changes type, as 'line N: why'
    (line and column counted from 1 in the file, as an editor shows them)."""
    kinds: dict[str, tuple[str, int]] = {}
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                if isinstance(exc, json.JSONDecodeError):
                    cut = " — the line ends early: is the file truncated?" if not line.endswith(b"\n") else ""
                    why = exc.msg.removesuffix(" starting at").removesuffix(" at")
                    return f"line {lineno}, column {exc.colno}: {why}{cut}"
                return f"line {lineno}: not UTF-8 JSON ({exc})"
            if not isinstance(value, dict):
                return f"line {lineno}: expected a JSON object, got {type(value).__name__}"
            found = _type_change(kinds, value, lineno)
            if found:
                return found
    return ""


def _read_jsonl(path: Path) -> pa.Table:
    try:
        return pajson.read_json(path)
    except pa.ArrowInvalid as exc:
        where = _bad_json_line(path)
        if where:  # Arrow's own "in row N" counts rows of its current block: the line says it
            raise InvalidArgumentError(f"{path}: {where}") from exc
        raise InvalidArgumentError(f"{path}: {str(exc).splitlines()[0]}") from exc


def _schema_of(path: Path) -> pa.Schema:
    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise InvalidArgumentError(f"{path}: not a readable Parquet file ({exc})") from exc


def _unify(schemas: list[tuple[Path, pa.Schema]]) -> pa.Schema:
    try:
        schema = pa.unify_schemas([s for _, s in schemas], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        first_path, first = schemas[0]
        diffs = []
        for path, s in schemas[1:]:
            for f in s:
                if f.name in first.names and not first.field(f.name).type.equals(f.type):
                    diffs.append(
                        f"{path}: field {f.name!r} is {f.type}, {first_path} has {first.field(f.name).type}"
                    )
        detail = "; ".join(diffs[:5]) or str(exc)
        raise InvalidArgumentError(f"input schemas disagree: {detail}") from exc
    schema = schema.remove_metadata()
    reserved = [n for n in schema.names if n in PROVENANCE_COLUMNS]
    if reserved:
        raise InvalidArgumentError(f"column name(s) {reserved} are reserved for provenance; rename them")
    if not schema.names:
        raise InvalidArgumentError("the inputs have no columns")
    return schema


def _batches(path: Path, schema: pa.Schema, parsed: dict[Path, pa.Table]) -> Iterator[pa.RecordBatch]:
    if _is_parquet(path):
        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=64 * 1024):
                yield _conform(batch, schema, path)
        except (OSError, pa.ArrowException) as exc:
            if isinstance(exc, InvalidArgumentError):
                raise
            raise InvalidArgumentError(f"{path}: unreadable Parquet ({exc})") from exc
        return
    table = parsed.pop(path, None) or _read_jsonl(path)
    for batch in table.to_batches(max_chunksize=64 * 1024):
        yield _conform(batch, schema, path)


def _conform(batch: pa.RecordBatch, schema: pa.Schema, path: Path) -> pa.RecordBatch:
    """`batch` with the unified schema: missing columns become nulls, types are promoted."""
    arrays = []
    for field in schema:
        if field.name in batch.schema.names:
            col = batch.column(field.name)
            try:
                arrays.append(col if col.type.equals(field.type) else col.cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidArgumentError(
                    f"{path}: field {field.name!r} cannot become {field.type} ({exc})"
                ) from exc
        else:
            arrays.append(pa.nulls(batch.num_rows, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _append_schema(registry: Registry, name: str, schema: pa.Schema) -> tuple[Manifest, pa.Schema]:
    """The version to append to and the schema the input is written in (the parent's)."""
    try:
        parent = registry.resolve(name)
    except NotFoundError:
        raise InvalidArgumentError(
            f"ingest --append: no dataset named {name!r} under {registry.root} to append to"
        ) from None
    extra = [f.name for f in schema if f.name not in parent.schema.names]
    if extra:
        raise InvalidArgumentError(
            f"ingest --append: input field(s) {extra} are not in {parent.ref}'s schema {parent.schema.names} "
            "(an append keeps the schema; add fields with a new version, e.g. --change add_columns)"
        )
    return parent, parent.schema


def _table_source(src: Path, fmt: str, bar: tqdm) -> tuple[Source, pa.Schema]:
    """JSON Lines / Parquet: pass 1 (schemas) here, on the first half of the progress bar."""
    suffixes = {"jsonl": _JSONL_SUFFIXES, "parquet": _PARQUET_SUFFIXES}.get(
        fmt, _JSONL_SUFFIXES + _PARQUET_SUFFIXES
    )
    files = _inputs(src, suffixes)
    total = sum(p.stat().st_size for p in files)
    bar.total = 2 * total  # both passes
    bar.refresh()
    parsed: dict[Path, pa.Table] = {}
    kept = 0
    schemas = []
    for path in files:
        if _is_parquet(path):
            schemas.append((path, _schema_of(path)))
        else:
            table = _read_jsonl(path)
            schemas.append((path, table.schema))
            if kept + table.nbytes <= _KEEP_PARSED_BYTES:
                parsed[path] = table
                kept += table.nbytes
        bar.update(path.stat().st_size)
    schema = _unify(schemas)

    def batches(progress: Callable[[int], None]) -> Iterator[pa.RecordBatch]:
        for path in files:
            yield from _batches(path, schema, parsed)
            progress(path.stat().st_size)

    return Source(
        schema=schema, total_bytes=total, files=len(files), metadata={"modality": "table"}, batches=batches
    ), schema


def ingest(
    src: str | os.PathLike[str],
    name: str,
    root: str | os.PathLike[str] | Registry,
    opts: IngestOptions | None = None,
    *,
    change: str | None = None,
    format: str | None = None,
) -> Manifest:
    """Ingest `src` (a local file or a directory of them) as the next version of dataset `name`.

    `root` is a registry, a local directory or `s3://bucket/prefix` (shards are then written to a
    local staging directory and uploaded before the version is created). `change` is the claimed
    change from the latest version (`lineage.CLAIMS`; None: inferred); `append` makes the new version
    the latest's shards followed by the input's. `format` is one of `ingest_sources.FORMATS`
    (None: detected from the files under `src`).
    """
    opts = opts or IngestOptions()
    validate_name(name)
    if not isinstance(root, Registry):
        with open_registry(root) as registry:
            return ingest(src, name, registry, opts, change=change, format=format)
    registry = root
    if change is not None and change not in CLAIMS:
        raise InvalidArgumentError(f"unknown change {change!r}: one of {', '.join(CLAIMS)}")
    if format is not None and format not in FORMATS:
        raise InvalidArgumentError(f"unknown format {format!r}: one of {', '.join(FORMATS)}")
    registry.check_parent(name)  # a latest version that cannot be read: refused before any shard is written
    src_path = Path(src)
    fmt = format or detect_format(src_path)
    bar = tqdm(
        total=0,
        unit="B",
        unit_scale=True,
        desc=f"ingest {name}",
        disable=None if opts.progress is None else not opts.progress,  # None: only on a terminal
    )
    try:
        if fmt in ("table", "jsonl", "parquet"):
            source, schema = _table_source(src_path, fmt, bar)
        else:
            source = open_source(fmt, src_path)
            schema = source.schema
            bar.total = source.total_bytes
            bar.refresh()
        base: Manifest | None = None
        if change == "append":
            base, schema = _append_schema(registry, name, schema)
    except BaseException:
        bar.close()
        raise

    # Shards, in a directory of this ingest's own (staged locally when the root is remote).
    ingest_id = uuid.uuid4().hex
    local_dataset_dir = registry.storage.local_path(name)
    staging = (
        None if local_dataset_dir is not None else tempfile.TemporaryDirectory(prefix="shardstream-ingest-")
    )
    dataset_dir = local_dataset_dir if local_dataset_dir is not None else Path(staging.name) / name  # type: ignore[union-attr]
    out_dir = dataset_dir / "data" / ingest_id
    out_dir.mkdir(parents=True)
    uploaded: list[str] = []
    try:
        writer = ShardWriter(
            out_dir,
            schema,
            row_group_rows=opts.row_group_rows,
            row_group_bytes=opts.row_group_bytes,
            shard_rows=opts.shard_rows,
            shard_bytes=opts.shard_bytes,
        )
        for batch in source.batches(bar.update):
            writer.write(batch if batch.schema.equals(schema) else _conform(batch, schema, src_path))
        shards = tuple(writer.finish())
        if staging is not None:
            with tqdm(
                total=sum(s.bytes for s in shards),
                unit="B",
                unit_scale=True,
                desc=f"upload {name}",
                disable=None if opts.progress is None else not opts.progress,
            ) as up:
                for shard in shards:
                    key = f"{name}/{shard.uri}"
                    registry.storage.put_file(key, dataset_dir / shard.uri)
                    uploaded.append(key)
                    up.update(shard.bytes)
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        meta = {**source.metadata, "source": str(src_path.resolve()), "files": source.files}

        def build(version: int, parent: int | None) -> Manifest:
            before: tuple[Shard, ...] = ()
            if base is not None and parent is not None:  # a racing writer may have moved latest on
                before = (base if parent == base.version else registry.resolve(f"{name}@{parent}")).shards
            return Manifest(
                name=name,
                version=version,
                schema=schema,
                shards=before + shards,
                created_at=created,
                metadata=meta,
            )

        manifest = registry.create_version(name, build, change=change)
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)
        for key in uploaded:
            try:
                registry.storage.delete(key)
            except ShardstreamError:  # best effort: unreferenced shards are harmless
                pass
        raise
    finally:
        bar.close()
        if staging is not None:
            staging.cleanup()
    return manifest
