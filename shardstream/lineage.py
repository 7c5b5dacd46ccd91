"""How a dataset version relates to its parent (DESIGN §3, migration): pure functions, no I/O.

A new version names its parent and one change kind (`manifest.CHANGES`):

    create          no parent
    append          the parent's shards, unchanged and in order, then at least one new shard; same schema
    add_columns     same shards' row counts, in order; every parent field kept (same type); >= 1 new field
    rename_columns  same shards' row counts; same field types in the same order; >= 1 name differs
                    (the mapping, by position, is recorded in `Manifest.renamed`)
    drop_columns    same shards' row counts; the fields are the parent's, in order, minus >= 1
    drop_rows       the parent's shards, unchanged and in order, masking >= 1 more row (Shard.masked:
                    the files are not rewritten); same schema
    replace         anything else

The column changes keep the parent's masked rows masked (same ranges per shard): a version whose
shards were rewritten must not bring back rows a drop_rows took out.

Only what a manifest holds can be checked: for the column changes that is the per-shard row counts
(the rows themselves are in the shards). Field identity is name and Arrow type, as in the fingerprint.

`check_change` raises InvalidArgumentError naming every field and shard that contradicts a claim;
`infer_change` returns the most specific kind that holds; `diff` describes any two versions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from shardstream.errors import InvalidArgumentError
from shardstream.manifest import CHANGES, Manifest

__all__ = ["CLAIMS", "VersionDiff", "check_change", "diff", "infer_change", "renamed_fields"]

# The kinds a user may claim for a version that has a parent (`create` is only for the first version).
CLAIMS = ("append", "add_columns", "rename_columns", "drop_columns", "drop_rows", "replace")
_MAX_LISTED = 6  # problems named in one error line


def _fields(m: Manifest) -> list[pa.Field]:
    return list(m.schema)


def _typed(f: pa.Field) -> str:
    return f"{f.name!r} ({f.type})"


def _same_rows(parent: Manifest, child: Manifest) -> list[str]:
    """Problems with `child` holding the same rows as `parent`: shard count and rows per shard."""
    if len(child.shards) != len(parent.shards):
        return [f"it has {len(child.shards)} shard(s), the parent has {len(parent.shards)}"]
    out = []
    for i, (p, c) in enumerate(zip(parent.shards, child.shards, strict=True)):
        if p.rows != c.rows:
            out.append(f"shard {i} ({c.uri}) has {c.rows} rows, the parent's ({p.uri}) has {p.rows}")
        elif p.masked != c.masked:
            out.append(
                f"shard {i} ({c.uri}) masks rows {_ranges(c.masked)}, the parent's {_ranges(p.masked)}"
            )
    return out


def _ranges(masked: tuple[tuple[int, int], ...]) -> str:
    return (
        ", ".join(f"{a}:{b}" for a, b in masked[:_MAX_LISTED]) + (" ..." if len(masked) > _MAX_LISTED else "")
        or "none"
    )


def _schema_changes(parent: Manifest, child: Manifest) -> tuple[list[str], list[str], list[str]]:
    """(added, removed, retyped) as phrases, matching fields by name."""
    old = {f.name: f for f in _fields(parent)}
    new = {f.name: f for f in _fields(child)}
    added = [f"field {_typed(f)} added" for n, f in new.items() if n not in old]
    removed = [f"field {_typed(f)} removed" for n, f in old.items() if n not in new]
    retyped = [
        f"field {n!r} is {new[n].type}, the parent's is {f.type}"
        for n, f in old.items()
        if n in new and not new[n].type.equals(f.type)
    ]
    return added, removed, retyped


def _same_schema(parent: Manifest, child: Manifest) -> list[str]:
    added, removed, retyped = _schema_changes(parent, child)
    out = added + removed + retyped
    if not out and [f.name for f in _fields(child)] != [f.name for f in _fields(parent)]:
        out.append(f"fields reordered ({child.schema.names}, the parent's {parent.schema.names})")
    return out


def _append(parent: Manifest, child: Manifest) -> list[str]:
    out = _same_schema(parent, child)
    for i, p in enumerate(parent.shards):
        if i >= len(child.shards):
            out.append(f"the parent's shard {i} ({p.uri}) is missing")
            break
        c = child.shards[i]
        if c != p:
            what = "its size, rows or content hash differ" if c.uri == p.uri else f"the parent's is {p.uri}"
            out.append(f"shard {i} is {c.uri} ({what}): the parent's shards must come first, unchanged")
            break
    else:
        if len(child.shards) == len(parent.shards):
            out.append("it adds no shards")
    return out


def _add_columns(parent: Manifest, child: Manifest) -> list[str]:
    added, removed, retyped = _schema_changes(parent, child)
    out = removed + retyped
    if not added:
        out.append("it adds no fields")
    return out + _same_rows(parent, child)


def _rename_columns(parent: Manifest, child: Manifest) -> list[str]:
    old, new = _fields(parent), _fields(child)
    out = []
    if len(old) != len(new):
        out.append(f"it has {len(new)} field(s), the parent has {len(old)}")
    else:
        for i, (o, n) in enumerate(zip(old, new, strict=True)):
            if not o.type.equals(n.type):
                out.append(f"field {i} {_typed(n)} has another type than the parent's {_typed(o)}")
        if not out and not renamed_fields(parent, child):
            out.append("it renames no fields")
    return out + _same_rows(parent, child)


def _drop_columns(parent: Manifest, child: Manifest) -> list[str]:
    added, removed, retyped = _schema_changes(parent, child)
    out = added + retyped
    if not out:
        kept = [n for n in parent.schema.names if n in set(child.schema.names)]
        if kept != child.schema.names:
            out.append(f"fields reordered ({child.schema.names}, the parent's order {kept})")
        if not removed:
            out.append("it drops no fields")
    return out + _same_rows(parent, child)


def _drop_rows(parent: Manifest, child: Manifest) -> list[str]:
    out = _same_schema(parent, child)
    if len(child.shards) != len(parent.shards):
        return [*out, f"it has {len(child.shards)} shard(s), the parent has {len(parent.shards)}"]
    for i, (p, c) in enumerate(zip(parent.shards, child.shards, strict=True)):
        if replace(c, masked=()) != replace(p, masked=()):
            out.append(f"shard {i} is {c.uri}, not the parent's {p.uri} unchanged")
        elif _uncovered(p.masked, c.masked):
            out.append(f"shard {i} ({c.uri}) no longer masks rows {_ranges(_uncovered(p.masked, c.masked))}")
    if not out and child.num_rows >= parent.num_rows:
        out.append("it masks no more rows")
    return out


def _uncovered(
    old: tuple[tuple[int, int], ...], new: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    """The ranges of `old` not inside one range of `new` (both merged)."""
    return tuple((a, b) for a, b in old if not any(x <= a and b <= y for x, y in new))


_CHECKS: dict[str, Callable[[Manifest, Manifest], list[str]]] = {
    "append": _append,
    "add_columns": _add_columns,
    "rename_columns": _rename_columns,
    "drop_columns": _drop_columns,
    "drop_rows": _drop_rows,
    "replace": lambda parent, child: [],
}


def renamed_fields(parent: Manifest, child: Manifest) -> dict[str, str]:
    """Parent name -> child name for each position whose name differs (same field count assumed)."""
    return {o.name: n.name for o, n in zip(_fields(parent), _fields(child), strict=False) if o.name != n.name}


def check_change(parent: Manifest, child: Manifest, change: str) -> None:
    """Raise InvalidArgumentError unless `child` is a `change` of `parent`, naming what contradicts it."""
    if change not in CHANGES:
        raise InvalidArgumentError(f"unknown change {change!r}: one of {', '.join(CLAIMS)}")
    if change == "create":
        raise InvalidArgumentError(
            f"{child.ref} has a parent ({parent.ref}), so it cannot be a 'create': one of {', '.join(CLAIMS)}"
        )
    problems = _CHECKS[change](parent, child)
    if problems:
        more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise InvalidArgumentError(
            f"change {change!r} does not hold from {parent.ref} to {child.ref}: "
            f"{'; '.join(problems[:_MAX_LISTED])}{more}"
        )


def infer_change(parent: Manifest, child: Manifest) -> str:
    """The most specific change kind that holds between `parent` and `child`, else 'replace'."""
    for kind in ("append", "add_columns", "drop_columns", "rename_columns", "drop_rows"):
        if not _CHECKS[kind](parent, child):
            return kind
    return "replace"


@dataclass(frozen=True)
class VersionDiff:
    """What differs between two versions, `old` → `new` (`datasets diff`)."""

    old: str
    new: str
    change: str  # inferred
    recorded: str | None  # new's recorded change when old is its parent
    fields_added: tuple[tuple[str, str], ...]  # (name, type)
    fields_removed: tuple[tuple[str, str], ...]
    fields_renamed: tuple[tuple[str, str], ...]  # (old name, new name)
    fields_retyped: tuple[tuple[str, str, str], ...]  # (name, old type, new type)
    shards_added: tuple[str, ...]  # uris, in new's order
    shards_removed: tuple[str, ...]  # uris, in old's order
    shards_before: int
    shards_after: int
    rows_before: int
    rows_after: int

    def to_json(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "change": self.change,
            "recorded_change": self.recorded,
            "fields_added": [{"name": n, "type": t} for n, t in self.fields_added],
            "fields_removed": [{"name": n, "type": t} for n, t in self.fields_removed],
            "fields_renamed": [{"old": o, "new": n} for o, n in self.fields_renamed],
            "fields_retyped": [{"name": n, "old": o, "new": t} for n, o, t in self.fields_retyped],
            "shards_added": list(self.shards_added),
            "shards_removed": list(self.shards_removed),
            "shards_before": self.shards_before,
            "shards_after": self.shards_after,
            "rows_before": self.rows_before,
            "rows_after": self.rows_after,
        }


def diff(old: Manifest, new: Manifest) -> VersionDiff:
    """The difference from `old` to `new` (any two manifests; usually two versions of one dataset)."""
    change = infer_change(old, new)
    if change == "rename_columns":
        renamed = tuple(renamed_fields(old, new).items())
        added: tuple[tuple[str, str], ...] = ()
        removed: tuple[tuple[str, str], ...] = ()
        retyped: tuple[tuple[str, str, str], ...] = ()
    else:
        o = {f.name: f for f in _fields(old)}
        n = {f.name: f for f in _fields(new)}
        renamed = ()
        added = tuple((k, str(f.type)) for k, f in n.items() if k not in o)
        removed = tuple((k, str(f.type)) for k, f in o.items() if k not in n)
        retyped = tuple(
            (k, str(f.type), str(n[k].type)) for k, f in o.items() if k in n and not n[k].type.equals(f.type)
        )
    old_shards, new_shards = set(old.shards), set(new.shards)
    same_dataset = old.name == new.name and new.parent == old.version
    return VersionDiff(
        old=old.ref,
        new=new.ref,
        change=change,
        recorded=new.change if same_dataset else None,
        fields_added=added,
        fields_removed=removed,
        fields_renamed=renamed,
        fields_retyped=retyped,
        shards_added=tuple(s.uri for s in new.shards if s not in old_shards),
        shards_removed=tuple(s.uri for s in old.shards if s not in new_shards),
        shards_before=len(old.shards),
        shards_after=len(new.shards),
        rows_before=old.num_rows,
        rows_after=new.num_rows,
    )
