"""`shardstream materialize`: run deterministic transforms over a version once, offline, and register
the output as a dataset of its own.

Every job that reads `images@3` with `image.decode` pays the decode on the servers, every epoch
(Pillow decode + resize: ~2.1 CPU-s per 1,000 images here, BENCHMARKING.md). A transform whose output
depends on a sample's bytes alone can be run once instead: the materialized version holds its
output, and serving it is a read (`loadtest/bulk_bench.py` measures the server CPU per image both
ways). Its manifest records the source version, its fingerprint, the columns read and the
transforms (`Manifest.derived_from`; `datasets show` prints it).

Only deterministic transforms: `DETERMINISTIC` names the ops that are and the parameters that would
make them random; anything else is refused before a byte is read, saying why:

    text.tokenize                  always
    image.decode                   unless crop "random" or hflip (augmentation: a new draw each epoch)
    audio.decode                   unless crop "random"
    video.frames                   always
    rl.windows                     always; episode_id falls back to the stored row index (online: the
                                   position in the epoch's order) when there is no episode column
    text.pack                      never: it packs each step's documents together, so its rows depend
                                   on the reader's batch and world size
    any other op                   accepted when its `deterministic` property says so, else refused

How: one task per source shard (`materialize_shard`), run here (`run_local`) or in Spark or Ray tasks
(`shardstream.engines.spark_io`, `shardstream.engines.ray_io`). A task reads its shard's row groups through the server's
checked reader (server/read/shards.py: footer and column-chunk checksums), applies the transforms with the very
pipeline a server runs (transforms/pipeline.py; positions are the stored row order, epoch 0, seed 0;
a sample a transform cannot process fails the run naming version, shard and row), and writes one
output shard with the writer `ingest` uses (bulk.py). The driver registers the shards as the next
version of the destination, reading nothing again. Reading that version with shuffle "none" gives
exactly the rows that reading the source with the transforms and shuffle "none" gives, byte for byte
(tests/test_materialize.py checks it through a real server).

A `drop_rows` source (rows masked in its manifest, drop_rows.py): its masked rows are left out before
the transforms — never read back into the output, never counted in positions — so the materialized
version holds exactly the rows a reader of the source is served, once each, and needs no mask of its
own (its lineage names the masked source version). Masking more rows of the source later does not
reach the materialized version: drop them from it too, or materialize the new source version.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from shardstream.errors import InvalidArgumentError, ShardstreamError
from shardstream.manifest import DatasetRef, Derivation, Manifest, validate_name
from shardstream.registry import Registry
from shardstream.transform_spec import to_wire

from ..backends.roots import open_registry
from ..transforms import Pipeline, build_pipeline
from ..transforms.base import Transform, fixed_bytes
from ..transforms.pipeline import PROVENANCE
from .bulk import (
    Part,
    WriteSpec,
    new_write_id,
    read_row_groups,
    register_parts,
    remove_write,
    task_root,
    write_part,
)
from .ingest import DEFAULT_ROW_GROUP_BYTES

__all__ = [
    "DETERMINISTIC",
    "MaterializeJob",
    "materialize",
    "materialize_shard",
    "plan_materialize",
    "random_reason",
    "run_local",
]

CHUNK_OUTPUT_BYTES = 64 << 20  # output rows transformed at once: bounds a task's memory, not its speed


def _image(t: Transform) -> str | None:
    if getattr(t, "crop", None) == "random":
        return "crop 'random' is augmentation (a new crop every epoch): use crop 'center' or 'none' here"
    if getattr(t, "hflip", False):
        return "hflip is augmentation (a new flip every epoch): leave it out here"
    return None


def _audio(t: Transform) -> str | None:
    if getattr(t, "crop", None) == "random":
        return "crop 'random' is augmentation (a new crop every epoch): use crop 'start' or 'center' here"
    return None


def _never_pack(t: Transform) -> str | None:
    return (
        "it packs each step's documents together, so its rows depend on the reader's batch size and "
        "world size: materialize text.tokenize and keep text.pack online"
    )


# op -> why this instance of it is not deterministic (None: it is)
DETERMINISTIC: dict[str, Callable[[Transform], str | None]] = {
    "text.tokenize": lambda t: None,
    "image.decode": _image,
    "audio.decode": _audio,
    "video.frames": lambda t: None,
    "rl.windows": lambda t: None,
    "text.pack": _never_pack,
}


def random_reason(t: Transform) -> str | None:
    """Why the built transform `t` cannot be materialized, or None when it can. An op this table does
    not name is accepted when it says its output depends on each row's values alone (a
    `deterministic` property that is true), else refused."""
    check = DETERMINISTIC.get(t.op)
    if check is not None:
        return check(t)
    if getattr(t, "deterministic", False) is True:
        return None
    return "it is not known to be deterministic (its output may depend on the seed, epoch, position or other rows)"


@dataclass(frozen=True)
class MaterializeJob:
    """What every task of one materialize run needs (small and picklable: engines ship it)."""

    root: str
    source: str  # NAME@VERSION, pinned
    transforms: tuple[Mapping[str, Any], ...]
    columns: tuple[str, ...]  # () = every column
    write: WriteSpec  # where the output shards go
    threads: int = 1  # per task, for per-sample work (Pillow, FFmpeg and the tokenizer release the GIL)
    s3_endpoint: str | None = None
    shards: int = 0  # the source's shard count: tasks 0 .. shards-1

    def derivation(self, fingerprint: str) -> Derivation:
        return Derivation(self.source, fingerprint, self.transforms, self.columns)


@dataclass
class _Built:
    manifest: Manifest
    pipeline: Pipeline
    columns: list[str]
    output_bytes_per_row: int = field(default=0)


def _build(
    registry: Registry, source: str, transforms: Sequence[Mapping[str, Any]], columns: Sequence[str]
) -> _Built:
    m = registry.resolve(source)
    names = m.schema.names
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise InvalidArgumentError(f"unknown column(s) {unknown} in {m.ref}; columns are: {', '.join(names)}")
    cols = list(columns) or list(names)
    schema = pa.schema([m.schema.field(c) for c in cols], metadata=m.schema.metadata)
    if not transforms:
        raise InvalidArgumentError("materialize: give at least one transform (--transforms)")

    def describe(src: int, shard: int, row: int) -> str:
        return f"{m.ref} shard {shard} ({m.shards[shard].uri}) row {row}"

    pipeline = build_pipeline(to_wire(transforms), "fail", schema, describe)
    for k, t in enumerate(pipeline.transforms):
        why = random_reason(t)
        if why is not None:
            raise InvalidArgumentError(
                f"materialize: transforms[{k}] {t.op} cannot be precomputed: {why}. Materialize only "
                "deterministic transforms and apply random ones online (Loader(..., transforms=...))"
            )
    out_schema = pipeline.transforms[-1].output_schema
    per_row = sum(fixed_bytes(f.type) or 0 for f in out_schema)
    return _Built(m, pipeline, cols, per_row)


def plan_materialize(
    registry: Registry,
    source: str,
    transforms: Sequence[Mapping[str, Any]],
    name: str,
    *,
    columns: Sequence[str] = (),
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
    threads: int = 1,
    s3_endpoint: str | None = None,
) -> MaterializeJob:
    """Check everything before any task runs: the source version, the columns, every transform
    (parameters, schema, determinism) and the destination's latest version; the job to run."""
    validate_name(name)
    ref = DatasetRef.parse(source)
    if ref.name == name:
        raise InvalidArgumentError(
            f"materialize: the destination must be another dataset than the source ({name!r})"
        )
    transforms = tuple(dict(t) for t in _check_list(transforms))
    built = _build(registry, source, transforms, columns)
    registry.check_parent(name)  # a destination whose latest version is unreadable: refused now
    m = built.manifest
    return MaterializeJob(
        root=task_root(registry.root),
        source=m.ref,
        transforms=transforms,
        columns=tuple(columns),
        write=WriteSpec(
            root=task_root(registry.root),
            name=name,
            write_id=new_write_id(),
            row_group_bytes=row_group_bytes,
            s3_endpoint=s3_endpoint,
        ),
        threads=threads,
        s3_endpoint=s3_endpoint,
        shards=len(m.shards),
    )


def _check_list(transforms: Any) -> list[Mapping[str, Any]]:
    if isinstance(transforms, str):
        try:
            transforms = json.loads(transforms)
        except ValueError as exc:
            raise InvalidArgumentError(f"--transforms is not valid JSON ({exc})") from exc
    if isinstance(transforms, Mapping):
        transforms = [transforms]
    to_wire(transforms)  # the shape a Loader accepts, checked the same way
    return list(transforms)


def _held(masked: Sequence[tuple[int, int]], stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of the shard's rows `stored` (rows of its file), those a drop_rows version holds, and each
    one's index among the rows the shard holds (its file's rows less the masked ones before it)."""
    if not masked:
        return stored, stored
    starts = np.asarray([a for a, _ in masked], dtype=np.int64)
    ends = np.asarray([b for _, b in masked], dtype=np.int64)
    i = np.searchsorted(starts, stored, side="right") - 1  # the last masked range starting at or before
    inside = (i >= 0) & (stored < ends[np.maximum(i, 0)])
    before = np.concatenate([[0], np.cumsum(ends - starts)])  # masked rows before range i
    kept = stored[~inside]
    j = np.searchsorted(starts, kept, side="right")  # ranges wholly before each kept row
    return kept, kept - before[j]


def _chunks(
    job: MaterializeJob, built: _Built, registry: Registry, index: int, pool: ThreadPoolExecutor | None
) -> Iterator[pa.RecordBatch]:
    m = built.manifest
    # Positions count the rows the version holds, as an online read of it does (a drop_rows version's
    # masked rows are neither read back nor counted: the output holds exactly what a reader is served)
    first_row = sum(s.live_rows for s in m.shards[:index])
    masked = m.shards[index].masked
    per_row = max(1, built.output_bytes_per_row)
    rows_at_once = max(1, CHUNK_OUTPUT_BYTES // per_row)
    at = 0
    for _, table in read_row_groups(registry, m, index, built.columns):
        rows = table.num_rows
        stored, held = _held(masked, np.arange(at, at + rows, dtype=np.int64))
        if len(stored) < rows:
            table = table.take(pa.array(stored - at))
        for start in range(0, len(stored), rows_at_once):
            part = table.slice(start, rows_at_once).combine_chunks().to_batches()
            batch = part[0] if part else pa.RecordBatch.from_pylist([], schema=table.schema)
            n = batch.num_rows
            local = stored[start : start + n]  # rows of the shard's file (provenance, as a server gives it)
            batch = pa.RecordBatch.from_arrays(
                list(batch.columns) + [pa.array(np.full(n, index, np.int32)), pa.array(local)],
                names=batch.schema.names + ["_shard", "_row"],
            )
            out, _ = built.pipeline.apply(
                batch,
                seed=0,
                epoch=0,
                positions=held[start : start + n] + first_row,  # the stored order: shuffle "none", epoch 0
                steps=np.zeros(n, np.int64),
                step_ids=[0],
                pool=pool,
                threads=job.threads,
            )
            keep = [c for c in out.schema.names if c not in PROVENANCE]
            yield out.select(keep)
        at += rows


def materialize_shard(job: MaterializeJob, index: int) -> list[dict[str, Any]]:
    """Transform source shard `index` into one output shard: its Part (as JSON). Runs in a task."""
    try:
        with open_registry(job.root, s3_endpoint=job.s3_endpoint) as registry:
            built = _build(registry, job.source, job.transforms, job.columns)
            pool = ThreadPoolExecutor(job.threads) if job.threads > 1 else None
            try:
                return write_part(job.write, index, _chunks(job, built, registry, index, pool))
            finally:
                if pool is not None:
                    pool.shutdown()
    except ShardstreamError as exc:
        return [Part.failed(index, exc).to_json()]


Runner = Callable[[MaterializeJob], list[dict[str, Any]]]


def run_local(job: MaterializeJob) -> list[dict[str, Any]]:
    """The `local` engine: the tasks one after another in this process, each on `job.threads` threads."""
    out: list[dict[str, Any]] = []
    for i in range(job.shards):
        out += materialize_shard(job, i)
    return out


def materialize(
    root: str | Registry,
    source: str,
    transforms: Sequence[Mapping[str, Any]] | str,
    name: str,
    *,
    columns: Sequence[str] = (),
    run: Runner = run_local,
    threads: int | None = None,
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
    change: str | None = None,
    s3_endpoint: str | None = None,
) -> Manifest:
    """Materialize `transforms` over `source` (NAME@VERSION, NAME or NAME@TAG, pinned when it starts)
    as the next version of `name`; `run` executes the tasks (run_local, or an engine's runner)."""
    if not isinstance(root, Registry):
        with open_registry(root, s3_endpoint=s3_endpoint) as registry:
            return materialize(
                registry,
                source,
                transforms,
                name,
                columns=columns,
                run=run,
                threads=threads,
                row_group_bytes=row_group_bytes,
                change=change,
                s3_endpoint=s3_endpoint,
            )
    registry = root
    job = plan_materialize(
        registry,
        source,
        _check_list(transforms),
        name,
        columns=columns,
        row_group_bytes=row_group_bytes,
        threads=threads if threads is not None else (os.cpu_count() or 1) if run is run_local else 1,
        s3_endpoint=s3_endpoint,
    )
    src = registry.resolve(job.source)
    try:
        parts = run(job)
        meta = {"source": "materialize", "source_modality": src.metadata.get("modality", "table")}
        return register_parts(
            registry, name, parts, change=change, metadata=meta, derived_from=job.derivation(src.fingerprint)
        )
    except BaseException:
        remove_write(job.write.root, name, job.write.write_id, s3_endpoint=s3_endpoint)
        raise
