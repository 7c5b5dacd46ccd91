from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.errors import InvalidArgumentError
from shardstream.registry import Registry
from shardstream.server.writing.ingest import IngestOptions, ingest

from .support.data import make_table
from .support.processes import run_cli


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_directory_ingest_writes_shards_and_manifest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", [{"id": i, "text": f"t{i}"} for i in range(300)])
    write_jsonl(src / "b.jsonl", [{"id": i, "text": f"t{i}", "extra": 1.5} for i in range(300, 450)])
    root = tmp_path / "root"
    m = ingest(src, "docs", root, IngestOptions(row_group_rows=40, shard_rows=200, progress=False))
    assert m.ref == "docs@1" and m.num_rows == 450
    assert m.schema.names == ["id", "text", "extra"]
    reg = Registry(root)
    ids = []
    for shard in m.shards:
        path = reg.shard_path(m, shard.uri)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shard.sha256
        meta = pq.read_metadata(path)
        assert tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) == shard.row_groups
        assert all(n <= 40 for n in shard.row_groups)
        ids += pq.read_table(path).column("id").to_pylist()
    assert ids == list(range(450))
    t = pq.read_table(reg.shard_path(m, m.shards[0].uri))
    assert t.column("extra").null_count == t.num_rows  # a missing field becomes nulls

    m2 = ingest(src, "docs", root, IngestOptions(progress=False))
    assert m2.ref == "docs@2" and m2.parent == 1
    assert m2.fingerprint != m.fingerprint  # other row groups, other content
    assert reg.resolve("docs@1") == m


def test_parquet_file_ingest_keeps_types(tmp_path: Path) -> None:
    src = tmp_path / "in.parquet"
    pq.write_table(make_table(100), src)
    m = ingest(src, "tbl", tmp_path / "root", IngestOptions(progress=False))
    assert m.schema.field("x").type == pa.list_(pa.float32(), 3)
    assert m.num_rows == 100 and len(m.shards) == 1


def test_malformed_jsonl_names_file_and_line_and_registers_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", [{"id": i} for i in range(10)])
    bad = src / "b.jsonl"
    bad.write_text('{"id": 1}\n{"id": 2}\n{"id": 3,,}\n{"id": 4}\n')
    root = tmp_path / "root"
    with pytest.raises(InvalidArgumentError, match=r"b\.jsonl: line 3"):
        ingest(src, "docs", root, IngestOptions(progress=False))
    assert Registry(root).versions("docs") == []
    data = root / "docs" / "data"
    assert not data.exists() or not any(data.iterdir())


def test_conflicting_schemas_name_the_files_and_fields(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), src / "a.parquet")
    pq.write_table(pa.table({"id": ["x", "y"]}), src / "b.parquet")
    with pytest.raises(InvalidArgumentError, match=r"b\.parquet: field 'id' is string"):
        ingest(src, "mixed", tmp_path / "root", IngestOptions(progress=False))


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "no such file"),
        (lambda d: (d.mkdir(), (d / "notes.txt").write_text("hi")), "no input files"),
        (lambda d: (d.mkdir(), pq.write_table(pa.table({"_row": [1]}), d / "r.parquet")), "reserved"),
    ],
)
def test_bad_inputs(tmp_path: Path, setup, message: str) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    setup(src)
    with pytest.raises(InvalidArgumentError, match=message):
        ingest(src, "x", tmp_path / "root", IngestOptions(progress=False))


def test_cli_ingest_list_show(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"id": i} for i in range(25)])
    r = run_cli("ingest", "a.jsonl", "--name", "cli", "--root", "root", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "cli@1"
    r = run_cli("ingest", "a.jsonl", "--name", "cli", "--root", "root", "-q", cwd=tmp_path)
    assert r.stdout.strip() == "cli@2" and r.stderr == ""
    r = run_cli("datasets", "list", "--root", "root", "--json", cwd=tmp_path)
    listed = json.loads(r.stdout)["datasets"]
    assert [(d["name"], d["latest"], d["versions"], d["rows"]) for d in listed] == [("cli", 2, [1, 2], 25)]
    r = run_cli("datasets", "show", "cli@1", "--root", "root", cwd=tmp_path)
    assert r.returncode == 0 and "cli@1" in r.stdout and "id: int64" in r.stdout


def test_cli_user_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    for args in (
        ("ingest", "bad.jsonl", "--name", "x", "--root", "root"),
        ("ingest", "missing.jsonl", "--name", "x", "--root", "root"),
        ("ingest", "bad.jsonl", "--name", "no spaces", "--root", "root"),
        ("datasets", "show", "nothing@3", "--root", "root"),
    ):
        r = run_cli(*args, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr
        assert r.stderr.startswith("shardstream: error: ") and r.stderr.count("\n") == 1, r.stderr
    r = run_cli("ingest", "--name", "x", cwd=tmp_path)
    assert r.returncode == 2 and "usage:" in r.stderr
