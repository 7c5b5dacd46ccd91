"""The dataset-version manifest (DESIGN §3): a pure value object, JSON in and out, no I/O.

A manifest names one immutable version of a dataset: its Arrow schema, its shards (relative
URI, rows, bytes, row-group row counts, content hash and, since they exist, the checksums of each
row group's byte ranges), its lineage (parent version, change and, for a rename, the old → new field
names; see `lineage.py`) and a fingerprint. The fingerprint is the sha256 of the canonical *content*
— schema fields and the shards' hashes and sizes — so two versions with identical content share it
(and therefore share their read order), and any change of content changes it.

Row-group checksums (`ShardChecksums`, DESIGN §3 "Integrity at every size") are optional in the
JSON: a shard entry written before they existed has no `checksums` key, still loads, keeps its
fingerprint, and is served as it was — checked on open by size, row-group row counts and, for
shards up to the server's whole-file hash limit (64 MiB by default), the sha256 of the whole file.

A version made by `drop_rows` (DESIGN §3 migration; server/writing/drop_rows.py) masks rows of its parent's
shards without rewriting them: each shard entry may carry `masked`, the sorted, merged [start, end)
ranges of its rows (row numbers in the shard) that the version does not hold. The key is absent
when nothing is masked, and the fingerprint covers a shard's ranges only when it has some, so every
manifest written before masks existed keeps its JSON and its fingerprint. `Shard.rows` stays the
file's rows (what opening it checks); `Manifest.num_rows` counts the rows the version holds, and
the read plan orders those alone (plan.RowLocator).

A version made by `shardstream materialize` records where it comes from (`Derivation`: the source
version, its fingerprint, the columns read and the transforms applied) under `derived_from`, a key
only such manifests have: every other manifest's JSON stays as it was, and readers that predate the
key ignore it. Like `renamed`, it stays out of the fingerprint (which names content only).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa

from shardstream.errors import InvalidArgumentError
from shardstream.names import MAX_VERSION, DatasetRef, validate_name
from shardstream.storage import check_key

__all__ = ["CHANGES", "CHECKSUM_ALGORITHM", "FORMAT_VERSION", "DatasetRef", "Derivation", "Manifest", "Shard", "ShardChecksums", "validate_name"]

FORMAT_VERSION = 1
# How a version relates to its parent (DESIGN §3, checked by `lineage.check_change`): `create` has no
# parent; `replace` is anything else; the others are claims the registry checks before writing.
CHANGES = ("create", "append", "add_columns", "rename_columns", "drop_columns", "drop_rows", "replace")
# The one checksum a shard's byte ranges carry (why crc32: server/read/checksums.py, with its measured cost).
CHECKSUM_ALGORITHM = "crc32"
_CRCS_RE = re.compile(r"(?:[0-9a-f]{8})+")


@dataclass(frozen=True)
class ShardChecksums:
    """crc32 of a Parquet shard's footer and of each column chunk's byte range, per row group.

    `footer_bytes` is the length of the file's tail that holds its metadata (Thrift footer, its
    length and the magic); `footer` its crc32. `row_groups[g]` is the crc32 of every column chunk of
    row group g, in the footer's column order, each as 8 lowercase hex digits — kept as that string
    (decoded per row group when one is read: a manifest of many shards loads without parsing
    millions of numbers). Which bytes a column chunk covers is what Arrow reads for it
    (server/read/checksums.py); the footer is checked first, so those ranges come from checked bytes.
    """

    footer_bytes: int
    footer: int
    row_groups: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.footer_bytes < 12 or not 0 <= self.footer < 1 << 32:
            raise InvalidArgumentError(f"checksums: bad footer entry ({self.footer_bytes} bytes, {self.footer})")
        widths = {len(rg) for rg in self.row_groups}
        if len(widths) > 1 or not all(_CRCS_RE.fullmatch(rg) for rg in self.row_groups):
            raise InvalidArgumentError(
                "checksums: every row group needs one 8-hex-digit crc32 per column chunk, as many for each"
            )

    @property
    def columns(self) -> int:
        """Column chunks per row group."""
        return len(self.row_groups[0]) // 8 if self.row_groups else 0

    def chunks(self, group: int) -> tuple[int, ...]:
        """The crc32 of each column chunk of row group `group`."""
        text = self.row_groups[group]
        return tuple(int(text[i : i + 8], 16) for i in range(0, len(text), 8))

    @classmethod
    def of(cls, footer_bytes: int, footer: int, row_groups: Sequence[Sequence[int]]) -> ShardChecksums:
        return cls(footer_bytes, footer, tuple("".join(f"{c:08x}" for c in rg) for rg in row_groups))

    def to_json(self) -> dict[str, Any]:
        return {
            "algorithm": CHECKSUM_ALGORITHM,
            "footer_bytes": self.footer_bytes,
            "footer": f"{self.footer:08x}",
            "row_groups": list(self.row_groups),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ShardChecksums:
        if d.get("algorithm") != CHECKSUM_ALGORITHM:  # never ignored: that would drop the checks
            raise InvalidArgumentError(f"checksums: unsupported algorithm {d.get('algorithm')!r}")
        return cls(int(d["footer_bytes"]), int(str(d["footer"]), 16), tuple(str(r) for r in d["row_groups"]))


@dataclass(frozen=True)
class Shard:
    """One data file of a version. `uri` is relative to the dataset's directory.

    `checksums` is None for a shard registered before row-group checksums existed (see the module
    docstring for how such a shard is checked).
    """

    uri: str
    rows: int
    bytes: int
    row_groups: tuple[int, ...]
    sha256: str
    checksums: ShardChecksums | None = None
    masked: tuple[tuple[int, int], ...] = ()  # rows [start, end) of the file this version does not hold

    def __post_init__(self) -> None:
        check_key(self.uri, "shard uri")  # never a path outside the dataset's directory
        last = 0
        for a, b in self.masked:
            if not last <= a < b <= self.rows or (a == last and last > 0):
                raise InvalidArgumentError(
                    f"shard {self.uri}: masked rows must be sorted, merged, non-empty ranges within its "
                    f"{self.rows} rows, got {[list(r) for r in self.masked]}"
                )
            last = b
        if sum(self.row_groups) != self.rows:
            raise InvalidArgumentError(
                f"shard {self.uri}: row groups sum to {sum(self.row_groups)} rows, manifest says {self.rows}"
            )
        if self.checksums is not None and len(self.checksums.row_groups) != len(self.row_groups):
            raise InvalidArgumentError(
                f"shard {self.uri}: checksums for {len(self.checksums.row_groups)} row groups, "
                f"manifest lists {len(self.row_groups)}"
            )

    @property
    def live_rows(self) -> int:
        """Rows of the file the version holds (all but the masked ones)."""
        return self.rows - sum(b - a for a, b in self.masked)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "uri": self.uri,
            "rows": self.rows,
            "bytes": self.bytes,
            "row_groups": list(self.row_groups),
            "sha256": self.sha256,
        }
        if self.checksums is not None:  # absent, not null: an older entry's JSON stays as it was
            out["checksums"] = self.checksums.to_json()
        if self.masked:  # likewise
            out["masked"] = [list(r) for r in self.masked]
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Shard:
        sums = d.get("checksums")
        return cls(
            uri=str(d["uri"]),
            rows=int(d["rows"]),
            bytes=int(d["bytes"]),
            row_groups=tuple(int(n) for n in d["row_groups"]),
            sha256=str(d["sha256"]),
            checksums=None if sums is None else ShardChecksums.from_json(sums),
            masked=tuple((int(a), int(b)) for a, b in d.get("masked") or ()),
        )


@dataclass(frozen=True)
class Derivation:
    """Where a materialized version comes from: `source` (NAME@VERSION) and its `fingerprint`, the
    `columns` read from it (empty: all) and the `transforms` applied to them, in order, in the form a
    Loader takes them (`{"op": ..., parameters...}`)."""

    source: str
    fingerprint: str
    transforms: tuple[Mapping[str, Any], ...]
    columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ref = DatasetRef.parse(self.source)
        if ref.version is None:
            raise InvalidArgumentError(f"derived_from: source must be NAME@VERSION, got {self.source!r}")
        if not all(isinstance(t, Mapping) and isinstance(t.get("op"), str) for t in self.transforms):
            raise InvalidArgumentError("derived_from: every transform needs an 'op' name")

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "fingerprint": self.fingerprint,
            "columns": list(self.columns),
            "transforms": [dict(t) for t in self.transforms],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Derivation:
        return cls(
            source=str(d["source"]),
            fingerprint=str(d["fingerprint"]),
            transforms=tuple(dict(t) for t in d["transforms"]),
            columns=tuple(str(c) for c in d.get("columns", ())),
        )


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass(frozen=True)
class Manifest:
    name: str
    version: int
    schema: pa.Schema
    shards: tuple[Shard, ...]
    parent: int | None = None
    change: str = "create"
    created_at: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    renamed: Mapping[str, str] = field(default_factory=dict)  # rename_columns: parent's name -> new name
    derived_from: Derivation | None = None  # a materialized version: its source and transforms

    def __post_init__(self) -> None:
        validate_name(self.name)
        if isinstance(self.version, bool) or not isinstance(self.version, int) or not 1 <= self.version <= MAX_VERSION:
            raise InvalidArgumentError(
                f"manifest {self.name}: version must be an integer from 1 to {MAX_VERSION}, got {self.version!r}"
            )
        if self.change not in CHANGES:
            raise InvalidArgumentError(
                f"manifest {self.name}@{self.version}: unknown change {self.change!r} (one of {', '.join(CHANGES)})"
            )

    # --- derived -------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """Rows the version holds: its shards' rows but the masked ones (drop_rows)."""
        return sum(s.live_rows for s in self.shards)

    @property
    def masked_rows(self) -> int:
        """Rows of its shards the version masks (drop_rows); 0 for every other version."""
        return sum(s.rows - s.live_rows for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def fields(self) -> list[tuple[str, str]]:
        return [(f.name, str(f.type)) for f in self.schema]

    @cached_property
    def fingerprint(self) -> str:  # cached: servers use it in per-row-group cache keys
        # Row-group checksums stay out: they are derived from the very bytes the sha256 names, so they
        # add nothing to the content's identity — and leaving them out keeps every manifest written
        # before they existed on its fingerprint (its read order, its cursors, its cache entries),
        # and gives a version registered again with checksums the fingerprint of the one without.
        # A wrong checksum cannot pass unseen for that: it fails the read (DATA_LOSS), never serves.
        content = {
            "format": FORMAT_VERSION,
            "fields": self.fields,
            # a shard's masked rows only when it has some: every other entry is as it always was
            "shards": [
                [s.sha256, s.rows, s.bytes, list(s.row_groups)]
                + ([[list(r) for r in s.masked]] if s.masked else [])
                for s in self.shards
            ],
        }
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    # --- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "name": self.name,
            "version": self.version,
            "parent": self.parent,
            "change": self.change,
            "created_at": self.created_at,
            "fields": [{"name": n, "type": t} for n, t in self.fields],
            "arrow_schema": schema_to_b64(self.schema),
            "shards": [s.to_json() for s in self.shards],
            "num_rows": self.num_rows,
            "num_bytes": self.num_bytes,
            "metadata": dict(self.metadata),
            "fingerprint": self.fingerprint,
        }
        if self.renamed:  # only renames carry it: every other manifest's JSON stays as it was
            out["renamed"] = dict(self.renamed)
        if self.derived_from is not None:  # likewise, only materialized versions
            out["derived_from"] = self.derived_from.to_json()
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, source: str = "manifest") -> Manifest:
        try:
            fmt = int(d.get("format", 0))
            if fmt != FORMAT_VERSION:
                raise InvalidArgumentError(f"{source}: unsupported manifest format {fmt}")
            m = cls(
                name=str(d["name"]),
                version=int(d["version"]),
                schema=schema_from_b64(d["arrow_schema"]),
                shards=tuple(Shard.from_json(s) for s in d["shards"]),
                parent=None if d.get("parent") is None else int(d["parent"]),
                change=str(d.get("change", "create")),
                created_at=str(d.get("created_at", "")),
                metadata=dict(d.get("metadata", {})),
                renamed={str(k): str(v) for k, v in dict(d.get("renamed", {})).items()},
                derived_from=None if d.get("derived_from") is None else Derivation.from_json(d["derived_from"]),
            )
        except (KeyError, TypeError, ValueError, pa.ArrowInvalid) as exc:
            if isinstance(exc, InvalidArgumentError):
                raise
            raise InvalidArgumentError(f"{source}: malformed manifest ({type(exc).__name__}: {exc})") from exc
        stored = d.get("fingerprint")
        if stored is not None and stored != m.fingerprint:
            raise InvalidArgumentError(
                f"{source}: stored fingerprint {stored[:12]}… does not match its content ({m.fingerprint[:12]}…)"
            )
        return m

    @classmethod
    def loads(cls, text: str | bytes, *, source: str = "manifest") -> Manifest:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{source}: not valid JSON ({exc})") from exc
        if not isinstance(d, dict):
            raise InvalidArgumentError(f"{source}: expected a JSON object")
        return cls.from_json(d, source=source)
