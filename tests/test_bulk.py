"""server/writing/bulk.py without an engine: the task side (write_part, describe_file) and the driver side
(register_parts) called directly, on a local root and on a real S3 server (SeaweedFS)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.registry import Registry
from shardstream.server.backends.roots import open_registry
from shardstream.server.writing import bulk
from shardstream.server.writing.orphan_files import remove_orphans
from shardstream.server.writing.registry_ops import register, verify
from shardstream.storage import LocalStorage

from .support.data import make_table


def batches(start: int, n: int, chunk: int = 50) -> list[pa.RecordBatch]:
    return make_table(n, start=start).to_batches(max_chunksize=chunk)


def test_parts_register_in_part_order_reading_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = bulk.prepare_write(tmp_path, "toy", row_group_rows=40)
    parts = bulk.write_part(spec, 2, batches(200, 100)) + bulk.write_part(spec, 0, batches(0, 120))
    empty = make_table(1).to_batches()[0].slice(0, 0)
    parts += bulk.write_part(spec, 1, []) + bulk.write_part(spec, 3, [empty])
    assert [p["part"] for p in parts] == [2, 0]  # a task without rows writes no file

    def no_reads(*args: object, **kwargs: object) -> None:
        raise AssertionError("the driver read a data file")

    with monkeypatch.context() as mp:  # the driver never reads the files the tasks described
        for method in ("get_range", "iter_chunks", "digest"):
            mp.setattr(LocalStorage, method, no_reads)
        m = bulk.register_parts(Registry(tmp_path), "toy", parts, metadata={"source": "test"})
    assert [s.uri.split("/")[-1][:10] for s in m.shards] == ["part-00000", "part-00002"]
    assert [s.row_groups for s in m.shards] == [(40, 40, 40), (40, 40, 20)]
    assert m.metadata == {"modality": "table", "source": "test", "files": 2}
    assert verify(Registry(tmp_path), m) == []
    # The task-side entries are what `register` computes from the same files, checksums included.
    again = register(Registry(tmp_path), "toy", [f"data/{spec.write_id}"], progress=False)
    assert again.shards == m.shards


def test_a_retried_attempt_never_replaces_the_file_another_described(tmp_path: Path) -> None:
    spec = bulk.prepare_write(tmp_path, "toy")
    (first,) = bulk.write_part(spec, 0, batches(0, 30))
    (second,) = bulk.write_part(spec, 0, batches(1000, 30))  # e.g. a speculative attempt
    assert first["shard"]["uri"] != second["shard"]["uri"]
    reg = Registry(tmp_path)
    m = bulk.register_parts(reg, "toy", [second])
    assert verify(reg, m) == []
    report = remove_orphans(reg, "toy", min_age_s=0)  # the other attempt's file is garbage for gc
    assert [f.key for f in report.removed] == [f"toy/{first['shard']['uri']}"]
    assert verify(reg, m) == []


def test_failed_parts_and_disagreeing_schemas_register_nothing(tmp_path: Path) -> None:
    spec = bulk.prepare_write(tmp_path, "toy")
    good = bulk.write_part(spec, 0, batches(0, 10))
    other = bulk.write_part(spec, 1, [pa.record_batch({"id": pa.array([1, 2], pa.int32())})])
    reg = Registry(tmp_path)
    with pytest.raises(
        InvalidArgumentError,
        match=r"schemas differ: data/\w+/part-00001-\w+\.parquet: field 'id' is int32, data/\w+/part-00000-\w+\.parquet has int64; .* lacks field 'x'",
    ):
        bulk.register_parts(reg, "toy", good + other)
    bad = bulk.Part.failed(2, DataLossError("part 2: boom")).to_json()
    with pytest.raises(DataLossError, match="^part 2: boom$"):
        bulk.register_parts(reg, "toy", good + [bad])
    worse = bulk.Part.failed(3, InvalidArgumentError("part 3: bad")).to_json()
    with pytest.raises(DataLossError, match=r"^2 files failed: part 2: boom; part 3: bad$"):
        bulk.register_parts(reg, "toy", good + [bad, worse])
    with pytest.raises(InvalidArgumentError, match="nothing to register as toy"):
        bulk.register_parts(reg, "toy", [])
    assert reg.versions("toy") == []


def test_describe_file_names_what_is_wrong(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    spec = bulk.prepare_write(tmp_path, "toy")
    bulk.write_part(spec, 0, batches(0, 10))
    junk = tmp_path / "toy" / "data" / "junk.parquet"
    junk.write_bytes(b"PAR1 not really")
    (key,) = [k for k in bulk.source_keys(reg, "toy", ["data"]) if k.endswith("junk.parquet")]
    part = bulk.Part.from_json(bulk.describe_file(bulk.FileSpec(str(tmp_path), "toy"), 0, key))
    assert (
        part.error_class == "InvalidArgumentError"
        and "junk.parquet: not a readable Parquet file" in part.error
    )
    with pytest.raises(InvalidArgumentError, match=r"nope: no Parquet files"):
        bulk.source_keys(reg, "toy", ["nope"])
    with pytest.raises(InvalidArgumentError, match="outside the dataset's directory"):
        bulk.source_keys(reg, "toy", [str(tmp_path)])


def test_an_s3_root_gets_the_same_treatment(tmp_path: Path, s3_root: str) -> None:
    spec = bulk.prepare_write(s3_root, "toy", row_group_rows=25)
    assert spec.root == s3_root
    parts = bulk.write_part(spec, 0, batches(0, 60)) + bulk.write_part(spec, 1, batches(60, 40))
    with open_registry(s3_root) as reg:
        m = bulk.register_parts(reg, "toy", parts)
        assert m.num_rows == 100 and verify(reg, m) == []
        keys = bulk.source_keys(reg, "toy", [f"data/{spec.write_id}"])
        files = bulk.FileSpec(s3_root, "toy")  # page checksums verified from S3 too
        described = [bulk.describe_file(files, i, k) for i, k in enumerate(keys)]
        again = bulk.register_parts(reg, "toy", described)
        assert again.shards == m.shards and again.version == 2
        assert all(k.startswith(f"toy/data/{spec.write_id}/part-") for k in reg.storage.list("toy/data"))
