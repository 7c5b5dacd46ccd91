"""register / verify / tag / history, on a local root and on a real S3 server (SeaweedFS) alike."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from shardstream.cli import main
from shardstream.server.backends.roots import open_registry, open_storage

from .support.data import make_table, put_parquet


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "root")
    return request.getfixturevalue("s3_root")


def spark_like(root: str, tmp_path: Path, name: str = "bring") -> None:
    """Three files of several row groups under NAME/data/run1/, plus Spark's bookkeeping files."""
    for i in range(3):
        put_parquet(root, f"{name}/data/run1/part-{i:05d}.snappy.parquet", make_table(100, 100 * i), tmp_path)
    with open_storage(root) as st:
        st.put(f"{name}/data/run1/_SUCCESS", b"")
        st.put(f"{name}/data/run1/.part-00000.crc", b"x")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_register_verify_tag_history(root: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spark_like(root, tmp_path)
    code, out, err = run(capsys, "register", "bring", "--from", "data/run1", "--root", root, "-q")
    assert (code, out.strip()) == (0, "bring@1"), err
    with open_registry(root) as reg:
        m = reg.resolve("bring@1")
    assert m.num_rows == 300 and [s.uri for s in m.shards] == [
        f"data/run1/part-{i:05d}.snappy.parquet" for i in range(3)
    ]
    assert m.shards[0].row_groups == (40, 40, 20)

    # The same files named by a full URI / absolute path register as the same content.
    full = f"{root.rstrip('/')}/bring/data/run1/part-00001.snappy.parquet"
    code, out, _ = run(capsys, "register", "bring", "--from", full, "--root", root, "-q")
    assert (code, out.strip()) == (0, "bring@2")

    code, out, _ = run(capsys, "datasets", "verify", "bring@1", "--root", root, "-q")
    assert code == 0 and "all 3 shard(s) match" in out

    assert run(capsys, "datasets", "tag", "bring@1", "prod", "--root", root)[0] == 0
    assert run(capsys, "datasets", "tag", "bring@2", "prod", "--root", root)[0] == 0  # tags move
    with open_registry(root) as reg:
        assert reg.resolve("bring@prod").version == 2 and reg.tags("bring") == {"prod": 2}
    code, out, _ = run(capsys, "datasets", "history", "bring", "--root", root, "--json")
    hist = json.loads(out)
    assert [(h["version"], h["parent"], h["change"], h["tags"]) for h in hist] == [
        (1, None, "create", []),
        (2, 1, "replace", ["prod"]),
    ]
    code, _, err = run(capsys, "datasets", "tag", "bring@1", "7", "--root", root)
    assert code == 1 and "is a number" in err


def test_verify_reports_each_bad_shard(root: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spark_like(root, tmp_path)
    assert run(capsys, "register", "bring", "--from", "data/run1", "--root", root, "-q")[0] == 0
    with open_storage(root) as st:
        k0, k2 = "bring/data/run1/part-00000.snappy.parquet", "bring/data/run1/part-00002.snappy.parquet"
        data = bytearray(st.get(k0))
        data[len(data) // 2] ^= 0x01  # one bit flipped
        st.put(k0, bytes(data))
        st.put(k2, st.get(k2)[:-10])  # truncated
    code, out, err = run(capsys, "datasets", "verify", "bring", "--root", root, "-q")
    assert code == 1 and "2 of 3 shard(s) failed verification" in err and "Traceback" not in err
    assert "BAD  data/run1/part-00000.snappy.parquet: sha256" in out
    assert "BAD  data/run1/part-00002.snappy.parquet: size" in out
    assert "part-00001" not in out


def test_register_names_files_and_fields_that_differ(
    root: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    put_parquet(root, "mixed/in/a.parquet", make_table(50), tmp_path)
    other = make_table(50).set_column(0, "id", pa.array(range(50), type=pa.int32())).drop_columns(["text"])
    put_parquet(root, "mixed/in/b.parquet", other, tmp_path)
    code, _, err = run(capsys, "register", "mixed", "--from", "in", "--root", root, "-q")
    assert code == 1 and "Traceback" not in err
    assert "in/b.parquet: field 'id' is int32, in/a.parquet has int64" in err
    assert "in/b.parquet lacks field 'text'" in err
    with open_registry(root) as reg:
        assert reg.versions("mixed") == []
    code, _, err = run(capsys, "register", "mixed", "--from", "nothing-here", "--root", root, "-q")
    assert code == 1 and "no Parquet files" in err


def test_concurrent_registers_get_distinct_versions(root: str, tmp_path: Path) -> None:
    from shardstream.server.writing.registry_ops import register

    spark_like(root, tmp_path)
    made: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def one(i: int) -> None:
        try:
            with open_registry(root) as reg:
                barrier.wait()
                made.append(
                    register(
                        reg, "bring", [f"data/run1/part-{i % 3:05d}.snappy.parquet"], progress=False
                    ).version
                )
        except BaseException as exc:  # noqa: BLE001 — reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(made) == [1, 2, 3, 4]
    with open_registry(root) as reg:
        uris = {reg.resolve(f"bring@{v}").shards[0].uri for v in made}
    assert len(uris) == 3  # every writer's own manifest survived
