"""Arrow extension types from shard files and manifests are never turned into Python objects
(pyarrow CVE-2023-47248 class; shardstream/extension_types.py).

The shard written here carries what the CVE's exploit carried — a field named as pyarrow's old
`arrow.py_extension_type`, whose metadata is a pickle — plus a column of pickled values tagged with
a Ray-Data-like name. Unpickling either one creates a marker directory. The installed pyarrow has
no such type (it keeps the field as plain binary with its metadata), so the server reads it safely;
this test process then registers types under both names that unpickle — what pyarrow < 14.0.1 did,
and what a library in a trainer's process (Ray Data) does — and proves that neither GetDataset's
schema nor a Loader's batches (numpy or Arrow) let them run, while the same bytes read by pyarrow
directly do.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.client import Loader
from shardstream.client.transport.channel import Connection
from shardstream.extension_types import CANONICAL, plain_batch, plain_schema
from shardstream.registry import Registry
from shardstream.server.writing.registry_ops import register
from shardstream.storage import open_local_storage

from .support.servers import Servers

PY_EXTENSION = "arrow.py_extension_type"  # pyarrow < 14.0.1: its metadata was unpickled on read
PICKLED_VALUES = "test.pickled_object"  # values unpickled on conversion, as ray.data.arrow_pickled_object
ROWS = 40


class _Payload:
    """Unpickling this creates `path` (a directory): the proof that something unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


class _UnpicklingType(pa.ExtensionType):
    """Rebuilt by unpickling its metadata, as pyarrow's PyExtensionType was before 14.0.1."""

    def __init__(self) -> None:
        super().__init__(pa.binary(), PY_EXTENSION)

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> _UnpicklingType:
        if serialized:
            pickle.loads(serialized)  # noqa: S301 — the vulnerability being tested for
        return cls()


class _PickledArray(pa.ExtensionArray):
    def to_numpy(self, zero_copy_only: bool = False, writable: bool = False) -> np.ndarray:  # type: ignore[override]
        return np.array([pickle.loads(v) for v in self.storage.to_pylist()], dtype=object)  # noqa: S301


class _PickledValuesType(pa.ExtensionType):
    """Values that are pickles, unpickled when converted (Ray Data's ArrowPythonObjectType does this)."""

    def __init__(self) -> None:
        super().__init__(pa.binary(), PICKLED_VALUES)

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> _PickledValuesType:
        return cls()

    def __arrow_ext_class__(self) -> type:
        return _PickledArray


def _field(name: str, ext: str, metadata: bytes = b"") -> pa.Field:
    return pa.field(
        name,
        pa.binary(),
        metadata={b"ARROW:extension:name": ext.encode(), b"ARROW:extension:metadata": metadata},
    )


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ext") / "unpickled"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, marker: Path) -> Path:
    """A registered dataset `evil` whose Parquet shard carries both extension names with pickles."""
    payload = pickle.dumps(_Payload(marker))
    schema = pa.schema(
        [("id", pa.int64()), _field("blob", PY_EXTENSION, payload), _field("obj", PICKLED_VALUES)]
    )
    table = pa.table(
        {"id": np.arange(ROWS), "blob": [payload] * ROWS, "obj": [payload] * ROWS}, schema=schema
    )
    root = tmp_path_factory.mktemp("ext-root") / "root"
    (root / "evil" / "data").mkdir(parents=True)
    pq.write_table(table, root / "evil" / "data" / "part-0.parquet", row_group_size=10)
    with Registry(open_local_storage(str(root))) as reg:
        manifest = register(reg, "evil", ["data"], progress=False)
    # what pyarrow itself makes of it, with no such type registered: plain binary, metadata kept
    assert manifest.schema.field("blob").type == pa.binary()
    assert manifest.schema.field("blob").metadata[b"ARROW:extension:name"] == PY_EXTENSION.encode()
    assert pq.read_table(root / "evil" / "data" / "part-0.parquet").schema.field("obj").type == pa.binary()
    assert not marker.exists()
    return root


@pytest.fixture
def hostile_types() -> Iterator[None]:
    """This process as a trainer's with a library that registered unpickling extension types."""
    pa.register_extension_type(_UnpicklingType())
    pa.register_extension_type(_PickledValuesType())
    try:
        yield
    finally:
        pa.unregister_extension_type(PY_EXTENSION)
        pa.unregister_extension_type(PICKLED_VALUES)


def test_neither_server_nor_client_unpickles_what_a_shard_carries(
    root: Path, marker: Path, hostile_types: None
) -> None:
    # the control: the same schema, read by pyarrow directly in this process, runs the payload
    (manifest,) = (root / "evil" / "manifests").glob("*.json")
    schema_bytes = base64.b64decode(json.loads(manifest.read_text())["arrow_schema"])
    assert not marker.exists()
    pa.ipc.read_schema(pa.py_buffer(schema_bytes))
    assert marker.exists(), "the control failed: the payload did not run"
    marker.rmdir()

    with Servers(root) as servers:
        server = servers.start()
        conn = Connection(server.target)
        info = conn.get_dataset("evil@1", 10)
        schema = pa.ipc.read_schema(pa.py_buffer(info.arrow_schema))
        assert [schema.field(n).type for n in ("blob", "obj")] == [pa.binary(), pa.binary()]
        assert all(b"ARROW:extension:name" not in (schema.field(n).metadata or {}) for n in ("blob", "obj"))
        conn.close()
        for output in ("numpy", "arrow"):
            with Loader([server.target], "evil@1", batch_size=16, output=output, shuffle=False) as ld:
                batches = list(ld)
            blobs = [
                bytes(v) for b in batches for v in (b["blob"].to_pylist() if output == "arrow" else b["blob"])
            ]
            assert len(blobs) == ROWS and blobs[0].startswith(b"\x80")  # the pickles, as bytes
            if output == "arrow":
                assert all(b.schema.field("obj").type == pa.binary() for b in batches)
        assert server.proc is not None and server.proc.poll() is None
    assert not marker.exists(), "something unpickled a shard's payload"


def test_plain_batch_keeps_canonical_types_and_strips_the_others(hostile_types: None) -> None:
    tensor = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((2, 2, 3), dtype=np.float32))
    hostile = pa.ExtensionArray.from_storage(_PickledValuesType(), pa.array([b"a", b"b"]))
    nested = pa.ListArray.from_arrays(pa.array([0, 1, 2], pa.int32()), hostile)
    tagged = pa.field("m", pa.int64(), metadata={b"ARROW:extension:name": b"evil", b"keep": b"1"})
    batch = pa.RecordBatch.from_arrays(
        [tensor, hostile, nested, pa.array([1, 2])],
        schema=pa.schema([("t", tensor.type), ("h", hostile.type), ("n", nested.type), tagged]),
    )
    plain = plain_batch(batch)
    assert plain.schema.field("t").type == tensor.type and tensor.type.extension_name in CANONICAL
    assert plain.schema.field("h").type == pa.binary()
    assert plain.schema.field("n").type == pa.list_(pa.binary())
    assert plain.schema.field("m").metadata == {b"keep": b"1"}
    assert plain.column(1).to_pylist() == [b"a", b"b"]  # storage values, zero-copy views
    clean = pa.RecordBatch.from_arrays([pa.array([1])], names=["x"])
    assert plain_batch(clean) is clean and plain_schema(clean.schema) is clean.schema
    assert plain_schema(batch.schema).equals(plain.schema, check_metadata=True)
