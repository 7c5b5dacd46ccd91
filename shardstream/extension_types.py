"""Arrow extension types from untrusted files are plain storage here (pyarrow CVE-2023-47248 class).

An Arrow field may carry `ARROW:extension:name` / `ARROW:extension:metadata`; a reader that has a
Python class registered under that name rebuilds the type by calling the class's
`__arrow_ext_deserialize__` on the metadata, and its values may become Python objects. pyarrow <
14.0.1 registered `arrow.py_extension_type`, whose metadata is a pickle: a shard file could run code
in whatever process read it. pyarrow ≥ 14.0.1 refuses it and 21 removed it; but any library in a
trainer's process may register its own (Ray Data registers `ray.data.arrow_pickled_object`, whose
values are pickles).

So what shardstream reads from a shard file or a manifest and hands on crosses the wire without any
extension type other than Arrow's own canonical ones (`CANONICAL`: implemented in C++, never Python):
`plain_schema` drops the extension keys of any other name from the fields' metadata and turns a
Python-defined extension type into its storage type; `plain_batch` does the same to a batch (its
columns become their storage arrays: zero-copy). The server applies it to every schema and batch it
sends (framing.py, GetDataset's schema), the client to every batch it decodes. Canonical tensor
columns — what server-side transforms produce — pass unchanged.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["CANONICAL", "plain_batch", "plain_schema"]

# Arrow's canonical extension types (C++; rebuilt from their metadata as JSON or not at all).
CANONICAL = frozenset(
    {
        "arrow.fixed_shape_tensor",
        "arrow.variable_shape_tensor",
        "arrow.json",
        "arrow.uuid",
        "arrow.opaque",
        "arrow.bool8",
    }
)
_NAME_KEY = b"ARROW:extension:name"
_EXTENSION_KEYS = (_NAME_KEY, b"ARROW:extension:metadata")


def _plain_type(t: pa.DataType) -> pa.DataType:
    """`t` without non-canonical extension types (the same object when there is none)."""
    if isinstance(t, pa.BaseExtensionType):
        if t.extension_name in CANONICAL and not isinstance(t, pa.ExtensionType):
            return t
        return _plain_type(t.storage_type)
    if pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        plain = [_plain_field(f) for f in fields]
        return t if all(a is b for a, b in zip(plain, fields, strict=True)) else pa.struct(plain)
    if pa.types.is_map(t):
        key_field, item_field = t.key_field, t.item_field
        key, item = _plain_field(key_field), _plain_field(item_field)
        return t if key is key_field and item is item_field else pa.map_(key, item, t.keys_sorted)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        value_field = t.value_field
        value = _plain_field(value_field)
        if value is value_field:
            return t
        if pa.types.is_fixed_size_list(t):
            return pa.list_(value, t.list_size)
        return pa.large_list(value) if pa.types.is_large_list(t) else pa.list_(value)
    return t


def _plain_field(f: pa.Field) -> pa.Field:
    t = _plain_type(f.type)
    metadata = f.metadata
    if metadata and _NAME_KEY in metadata and metadata[_NAME_KEY].decode("utf-8", "replace") not in CANONICAL:
        metadata = {k: v for k, v in metadata.items() if k not in _EXTENSION_KEYS} or None
    elif t is f.type:
        return f
    return pa.field(f.name, t, f.nullable, metadata)


def _plain_schema(schema: pa.Schema) -> pa.Schema | None:
    fields = [schema.field(i) for i in range(len(schema))]
    plain = [_plain_field(f) for f in fields]
    if all(a is b for a, b in zip(plain, fields, strict=True)):
        return None
    return pa.schema(plain, schema.metadata)


# The last schemas seen and their plain versions (None: already plain), newest first. Every message of
# a stream has the same schema: one C++ comparison (~0.1 us) instead of a walk over its fields (~2 us
# a field). Replaced whole, never mutated: threads read it without a lock.
_RECENT: tuple[tuple[pa.Schema, pa.Schema | None], ...] = ()
_RECENT_MAX = 16


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` without non-canonical extension types (the same object when there is none)."""
    global _RECENT
    recent = _RECENT
    for seen, plain in recent:
        if schema.equals(seen, check_metadata=True):
            return schema if plain is None else plain
    plain = _plain_schema(schema)
    _RECENT = ((schema, plain), *recent[: _RECENT_MAX - 1])
    return schema if plain is None else plain


def plain_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` without non-canonical extension types: the same batch, or its columns viewed as their
    storage (no copy, and no value ever turned into a Python object)."""
    schema = plain_schema(batch.schema)
    if schema is batch.schema:
        return batch
    columns = [
        col if col.type == f.type else col.view(f.type) for col, f in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
