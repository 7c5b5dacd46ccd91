"""shardstream.engines.spark_io on a real local Spark (local[2]): every modality written, checksummed in Spark's
tasks and registered, then read exactly once by a Loader through a real server; files Spark wrote
itself registered in place; a damaged file caught by the task-side checks; materialize on Spark."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.read.checksums import chunk_spans
from shardstream.server.writing.materialize import materialize
from shardstream.server.writing.registry_ops import verify

from .support.engines import MODALITIES, episodes_for_spark, modality_table, read_once, spark_session
from .support.flips import flip_byte, read_dataset
from .support.servers import Servers

pytestmark = [
    pytest.mark.spark,
    # py4j leaves its gateway socket to the garbage collector; Spark's own shutdown closes it.
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

spark_module = pytest.importorskip("shardstream.engines.spark_io", reason="the spark extra is not installed")


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    session = spark_session(tmp_path_factory.mktemp("spark-work"))
    yield session
    session.stop()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark-root")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[LocalServer]:
    with Servers(root) as servers:
        yield servers.start()


def frame(spark: Any, table: pa.Table, partitions: int) -> Any:
    return spark.createDataFrame(table).repartition(partitions)


def assert_same_rows(got: pa.Table, want: pa.Table) -> None:
    """`got` holds every row of `want` exactly once (by id), with equal values."""
    ids = got.column("id").to_pylist()
    assert sorted(ids) == want.column("id").to_pylist(), "not every row exactly once"
    got = got.sort_by("id")
    for name in want.schema.names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


@pytest.mark.parametrize("kind", MODALITIES)
def test_write_dataset_registers_every_modality_read_exactly_once(
    spark: Any, root: Path, server: LocalServer, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table, meta = modality_table(kind)
    name = f"spark-{kind}"
    df = frame(spark, episodes_for_spark(table) if kind == "episodes" else table, 3)
    ref = spark_module.write_dataset(
        df,
        root,
        name,
        target_row_group_bytes=4 << 10,
        metadata=meta,
        schema=table.schema if kind == "episodes" else None,  # fixed-size observation vectors again
    )
    assert ref == f"{name}@1"
    assert capsys.readouterr().out.strip() == ref  # printed, too
    m = Registry(root).resolve(ref)
    assert m.num_rows == table.num_rows
    assert len(m.shards) == 3  # one file per partition, written in its task
    assert all(s.checksums is not None for s in m.shards)
    assert any(len(s.row_groups) > 1 for s in m.shards)  # row groups sized for ranged reads
    assert m.metadata["modality"] == meta["modality"] and m.metadata["source"] == "spark"
    assert verify(Registry(root), m) == []  # the task-side checksums are the files' own
    for s in m.shards:  # written as ingest writes shards: Parquet page checksums on
        pf = pq.ParquetFile(root / name / s.uri, page_checksum_verification=True)
        pf.read()
    assert_same_rows(read_once(server.target, ref), table)
    if kind == "episodes":  # the cast schema serves rl.windows as an ingested episodes dataset would
        with Registry(root) as reg:
            assert reg.resolve(ref).schema.field("obs").type == table.schema.field("obs").type


def test_sort_by_and_append(spark: Any, root: Path, server: LocalServer) -> None:
    table, _ = modality_table("text")
    df = frame(spark, table.select(["id", "text"]), 2)
    ref = spark_module.write_dataset(df, root, "sorted", sort_by="id", quiet=True)
    got = read_dataset(server.target, ref)
    assert isinstance(got, pa.Table)
    assert got.column("id").to_pylist() == sorted(got.column("id").to_pylist())  # files are ranges
    more = pa.table({"id": pa.array([1000, 1001], pa.int64()), "text": ["x", "y"]})
    ref2 = spark_module.write_dataset(frame(spark, more, 1), root, "sorted", change="append", quiet=True)
    m2 = Registry(root).resolve(ref2)
    assert (m2.parent, m2.change, m2.num_rows) == (1, "append", table.num_rows + 2)
    got2 = read_dataset(server.target, ref2)
    assert isinstance(got2, pa.Table)
    assert got2.column("id").to_pylist() == got.column("id").to_pylist() + [1000, 1001]


def test_register_files_spark_wrote(spark: Any, root: Path, server: LocalServer) -> None:
    table, _ = modality_table("images")
    out = root / "native" / "data" / "job-1"
    frame(spark, table, 3).write.parquet(str(out))
    ref = spark_module.register_files(spark, root, "native", ["data/job-1"], quiet=True)
    m = Registry(root).resolve(ref)
    assert len(m.shards) == 3 and m.metadata["source"] == "spark"
    assert all(s.uri.startswith("data/job-1/part-") for s in m.shards)  # _SUCCESS and .crc files skipped
    assert verify(Registry(root), m) == []
    assert_same_rows(read_once(server.target, ref), table)


def first_data_page_byte(path: Path) -> int:
    """A byte inside the values of the first column chunk's data page (not its header, not the footer)."""
    md = pq.read_metadata(path)
    span = chunk_spans(md, 0, path.stat().st_size)[0]
    return span.start + span.length - 2


def test_a_file_damaged_before_registration_is_refused(spark: Any, root: Path) -> None:
    table, _ = modality_table("text")
    out = root / "damaged" / "data" / "job-1"
    frame(spark, table, 3).write.parquet(str(out))
    victim = sorted(out.glob("part-*.parquet"))[1]
    flip_byte(victim, first_data_page_byte(victim), 0x04)
    with pytest.raises(DataLossError, match=rf"{victim.name}: row group 0: a Parquet page checksum differs"):
        spark_module.register_files(spark, root, "damaged", ["data/job-1"], quiet=True)
    assert Registry(root).versions("damaged") == []
    # Without the page check the damage would be sealed into the manifest: that is what it is for.
    ref = spark_module.register_files(spark, root, "damaged", ["data/job-1"], verify_pages=False, quiet=True)
    assert ref == "damaged@1"


def test_a_file_damaged_after_registration_fails_reads_and_verify(
    spark: Any, root: Path, server: LocalServer
) -> None:
    table, _ = modality_table("text")
    ref = spark_module.write_dataset(
        frame(spark, table, 2), root, "flipped", target_row_group_bytes=16 << 10, quiet=True
    )
    reg = Registry(root)
    m = reg.resolve(ref)
    shard = m.shards[1]
    path = root / "flipped" / shard.uri
    flip_byte(path, first_data_page_byte(path), 0x01)
    got = read_dataset(server.target, ref)
    assert isinstance(got, DataLossError)
    assert f"{ref}: shard {shard.uri}: row group 0: column chunk 'id'" in str(got)  # the task's crc32
    (problem,) = verify(reg, m)
    assert problem.uri == shard.uri and "row group 0: column chunk 'id'" in problem.problem


def test_bad_input_is_refused_before_anything_is_written(spark: Any, root: Path) -> None:
    bad = pa.table({"id": [1], "_row": [2]})
    with pytest.raises(InvalidArgumentError, match=r"reserved for provenance"):
        spark_module.write_dataset(frame(spark, bad, 1), root, "bad-cols")
    with pytest.raises(InvalidArgumentError, match=r"no dataset named 'nothing-yet'"):
        spark_module.write_dataset(
            frame(spark, pa.table({"id": [1]}), 1), root, "nothing-yet", change="append"
        )
    with pytest.raises(InvalidArgumentError, match=r"nothing to register as empty: no rows were written"):
        spark_module.write_dataset(frame(spark, pa.table({"id": pa.array([], pa.int64())}), 1), root, "empty")
    wrong = pa.schema([pa.field("id", pa.int64()), pa.field("text", pa.int32())])
    with pytest.raises(InvalidArgumentError, match=r"column 'text' \(string\) cannot become int32"):
        spark_module.write_dataset(
            frame(spark, pa.table({"id": [1], "text": ["x"]}), 1), root, "uncastable", schema=wrong
        )
    for name in ("bad-cols", "nothing-yet", "empty", "uncastable"):
        assert not list((root / name).rglob("*.parquet")) if (root / name).exists() else True, name
        assert Registry(root).versions(name) == []


def test_materialize_on_spark_equals_local(spark: Any, root: Path, tmp_path: Path) -> None:
    table, meta = modality_table("images")
    src = spark_module.write_dataset(frame(spark, table, 2), root, "imgs-src", metadata=meta, quiet=True)
    transforms = [{"op": "image.decode", "column": "image", "size": [16, 16]}]
    on_spark = materialize(
        str(root), src, transforms, "imgs-spark", run=spark_module.materialize_runner(spark)
    )
    local = materialize(str(root), src, transforms, "imgs-local")
    assert on_spark.fingerprint == local.fingerprint  # the same bytes, wherever the tasks ran
    assert on_spark.derived_from == local.derived_from
    assert [s.rows for s in on_spark.shards] == [s.rows for s in Registry(root).resolve(src).shards]


def test_materialize_command_on_spark(spark: Any, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardstream.cli import main

    table, _ = modality_table("text")
    spark_module.write_dataset(frame(spark, table, 2), root, "words", quiet=True)
    transforms = json.dumps([{"op": "text.tokenize", "column": "text", "tokenizer": "bytes"}])
    code = main(
        [
            "materialize",
            "words@1",
            "--name",
            "words-tok",
            "--transforms",
            transforms,
            "--engine",
            "spark",
            "--root",
            str(root),
            "-q",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.strip() == "words-tok@1"
