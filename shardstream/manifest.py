"""The dataset-version manifest (DESIGN §3): a pure value object, JSON in and out, no I/O.

A manifest names one immutable version of a dataset: its Arrow schema, its shards (relative
URI, rows, bytes, row-group row counts, content hash), its lineage (parent version, change
and, for a rename, the old → new field names; see `lineage.py`) and a fingerprint. The fingerprint is the sha256 of the canonical *content* — schema fields and the
shards' hashes and sizes — so two versions with identical content share it (and therefore share
their read order), and any change of content changes it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa

from shardstream.errors import InvalidArgumentError
from shardstream.storage import check_key

__all__ = ["CHANGES", "FORMAT_VERSION", "DatasetRef", "Manifest", "Shard", "validate_name"]

FORMAT_VERSION = 1
# How a version relates to its parent (DESIGN §3, checked by `lineage.check_change`): `create` has no
# parent; `replace` is anything else; the others are claims the registry checks before writing.
CHANGES = ("create", "append", "add_columns", "rename_columns", "drop_columns", "replace")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_name(name: str, what: str = "dataset name") -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidArgumentError(
            f"invalid {what} {name!r}: use letters, digits, '.', '_' or '-' (at most 128, not starting "
            "with a punctuation mark)"
        )
    return name


@dataclass(frozen=True)
class DatasetRef:
    """`name`, `name@N` (a version) or `name@tag`."""

    name: str
    version: int | None = None
    tag: str | None = None

    @classmethod
    def parse(cls, text: str) -> DatasetRef:
        if not isinstance(text, str) or not text:
            raise InvalidArgumentError(f"dataset must be 'NAME', 'NAME@VERSION' or 'NAME@TAG', got {text!r}")
        name, sep, rest = text.partition("@")
        validate_name(name)
        if not sep:
            return cls(name)
        if rest.isdigit():
            if int(rest) < 1:
                raise InvalidArgumentError(f"dataset versions start at 1, got {text!r}")
            return cls(name, version=int(rest))
        validate_name(rest, "tag")
        return cls(name, tag=rest)

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}@{self.version}"
        if self.tag is not None:
            return f"{self.name}@{self.tag}"
        return self.name


@dataclass(frozen=True)
class Shard:
    """One data file of a version. `uri` is relative to the dataset's directory."""

    uri: str
    rows: int
    bytes: int
    row_groups: tuple[int, ...]
    sha256: str

    def __post_init__(self) -> None:
        check_key(self.uri, "shard uri")  # never a path outside the dataset's directory
        if sum(self.row_groups) != self.rows:
            raise InvalidArgumentError(
                f"shard {self.uri}: row groups sum to {sum(self.row_groups)} rows, manifest says {self.rows}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "rows": self.rows,
            "bytes": self.bytes,
            "row_groups": list(self.row_groups),
            "sha256": self.sha256,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Shard:
        return cls(
            uri=str(d["uri"]),
            rows=int(d["rows"]),
            bytes=int(d["bytes"]),
            row_groups=tuple(int(n) for n in d["row_groups"]),
            sha256=str(d["sha256"]),
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

    def __post_init__(self) -> None:
        validate_name(self.name)
        if self.version < 1:
            raise InvalidArgumentError(f"manifest {self.name}: version must be >= 1, got {self.version}")
        if self.change not in CHANGES:
            raise InvalidArgumentError(
                f"manifest {self.name}@{self.version}: unknown change {self.change!r} (one of {', '.join(CHANGES)})"
            )

    # --- derived -------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self.shards)

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
        content = {
            "format": FORMAT_VERSION,
            "fields": self.fields,
            "shards": [[s.sha256, s.rows, s.bytes, list(s.row_groups)] for s in self.shards],
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
