"""drop_rows (DESIGN §3 migration): a new version of a dataset without some known-bad rows, its shards
untouched — the rows are masked in the manifest (`Shard.masked`, manifest.py), not rewritten.

    drop_rows(registry, "web", rows=[(0, 17), ("data/part-00003.parquet", 4)])
    drop_rows(registry, "web@7", key="id", values=["a1f3", "77c0"])

Rows are named by (shard, row in shard) — a shard by its index in the manifest or its URI, as
`inspect --json` and provenance (`_shard`, `_row`) give them — or by the values of a key column
(every row holding one is dropped; read through the checked reader, a bounded chunk at a time).
The new version's parent is the dataset's latest version, which the reference must name if it
names one; it masks the parent's rows and these, so a masked row stays masked in every later
drop_rows. The registry checks the claim (lineage.py: same files, same schema, more rows masked)
before anything is written. A job reading the parent keeps reading it; moving a job is
`shardstream cursor migrate`, at an epoch boundary, as for any new version (its order differs:
the plan orders the rows a version holds, plan.RowLocator).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstream.errors import FailedPreconditionError, InvalidArgumentError
from shardstream.manifest import DatasetRef, Manifest
from shardstream.order.schedule import merge_ranges
from shardstream.registry import Registry

from ..read.reader import DatasetReader, new_row_group_cache

__all__ = ["DropResult", "drop_rows"]

KEY_SCAN_ROWS = 1 << 20  # rows of the key column read at a time
KEY_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class DropResult:
    manifest: Manifest  # the new version
    dropped: int  # rows it masks that its parent held
    already: int  # rows named by (shard, row) that the parent masked already
    missing: tuple[str, ...]  # key values no row of the parent holds (as given)


def drop_rows(
    registry: Registry,
    dataset: str,
    *,
    rows: Iterable[tuple[int | str, int]] = (),
    key: str | None = None,
    values: Iterable[object] = (),
    reason: str = "",
) -> DropResult:
    """Write the version of `dataset` that masks `rows` and the rows whose `key` is one of `values`."""
    ref = DatasetRef.parse(dataset)
    base = registry.check_parent(ref.name)
    if base is None:
        raise InvalidArgumentError(f"no dataset named {ref.name!r} under {registry.root}")
    if ref.version is not None or ref.tag is not None:
        named = registry.resolve(ref)
        if named.version != base.version:
            raise InvalidArgumentError(
                f"drop_rows makes a new version of {ref.name}'s latest version {base.ref}, not of {named.ref}: "
                f"name {base.ref} (or just {ref.name})"
            )
    wanted: dict[int, set[int]] = {}
    for shard, row in rows:
        s = _shard_index(base, shard)
        if not 0 <= row < base.shards[s].rows:
            raise InvalidArgumentError(f"{base.ref} shard {s} ({base.shards[s].uri}) has no row {row}")
        wanted.setdefault(s, set()).add(int(row))
    missing: tuple[str, ...] = ()
    if key is not None:
        found, missing = _rows_with(registry, base, key, list(values))
        for s, row in found:
            wanted.setdefault(s, set()).add(row)
    if not wanted:
        raise InvalidArgumentError(
            f"nothing to drop from {base.ref}: no rows named" + (" and no key value found" if key else "")
        )
    shards = list(base.shards)
    dropped = already = 0
    for s, picked in wanted.items():
        shard = shards[s]
        held = [r for r in sorted(picked) if not any(a <= r < b for a, b in shard.masked)]
        already += len(picked) - len(held)
        dropped += len(held)
        shards[s] = dataclasses.replace(
            shard, masked=merge_ranges([*shard.masked, *((r, r + 1) for r in held)])
        )
    if not dropped:
        raise InvalidArgumentError(
            f"nothing to drop from {base.ref}: the {already} row(s) named are masked already"
        )
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    metadata = dict(base.metadata)
    if reason:
        metadata["drop_rows_reason"] = reason

    def build(version: int, parent: int | None) -> Manifest:
        if parent != base.version:
            raise FailedPreconditionError(
                f"{ref.name} has a new latest version v{parent} since {base.ref} was read: run drop_rows again"
            )
        return dataclasses.replace(
            base, version=version, shards=tuple(shards), created_at=created, metadata=metadata
        )

    manifest = registry.create_version(ref.name, build, change="drop_rows")
    return DropResult(manifest, dropped, already, missing)


def _shard_index(m: Manifest, shard: int | str) -> int:
    if isinstance(shard, str) and not shard.isdigit():
        for i, s in enumerate(m.shards):
            if s.uri == shard:
                return i
        raise InvalidArgumentError(f"{m.ref} has no shard {shard!r}")
    i = int(shard)
    if not 0 <= i < len(m.shards):
        raise InvalidArgumentError(f"{m.ref} has {len(m.shards)} shards, not shard {i}")
    return i


def _rows_with(
    registry: Registry, m: Manifest, key: str, values: list[object]
) -> tuple[list[tuple[int, int]], tuple[str, ...]]:
    """(shard, row in shard) of every row held whose `key` is one of `values`; the values not found."""
    if key not in m.schema.names:
        raise InvalidArgumentError(f"{m.ref} has no column {key!r}; columns are: {', '.join(m.schema.names)}")
    if not values:
        raise InvalidArgumentError(f"give the values of {key!r} whose rows to drop")
    typ = m.schema.field(key).type
    try:
        wanted = (
            pa.array(values).cast(typ) if not pa.types.is_string(typ) else pa.array([str(v) for v in values])
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidArgumentError(f"values of {key!r} must be {typ}: {exc}") from None
    reader = DatasetReader(
        m, [registry.shard_path(m, s.uri) for s in m.shards], new_row_group_cache(KEY_CACHE_BYTES)
    )
    found: list[tuple[int, int]] = []
    seen: set[object] = set()
    for start in range(0, m.num_rows, KEY_SCAN_ROWS):
        batch = reader.take(np.arange(start, min(start + KEY_SCAN_ROWS, m.num_rows), dtype=np.int64), [key])
        hit = pc.is_in(batch.column(key), value_set=wanted).to_numpy(zero_copy_only=False)
        if hit.any():
            idx = np.flatnonzero(hit)
            shards = batch.column("_shard").to_numpy()[idx]
            rows = batch.column("_row").to_numpy()[idx]
            found += list(zip(shards.tolist(), rows.tolist(), strict=True))
            seen.update(batch.column(key).take(pa.array(idx)).to_pylist())
    missing = tuple(str(v) for v in wanted.to_pylist() if v not in seen)
    return found, missing
