"""shardstream.engines.ray_io on a real local Ray (num_cpus=2): every modality written through the Datasink,
checksummed in Ray's tasks and registered, then read exactly once by a Loader through a real
server; `read` from the files and through the fleet; a damaged shard refused; materialize on Ray."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.materialize import materialize
from shardstream.server.writing.registry_ops import verify

from .support.engines import MODALITIES, modality_table, read_once, start_ray
from .support.flips import flip_byte
from .support.servers import Servers

pytestmark = [
    pytest.mark.ray,
    # Ray Data's own deprecation notices, raised inside ray (its DataContext setting its defaults)
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray"),
]

ray_module = pytest.importorskip("shardstream.engines.ray_io", reason="the ray extra is not installed")


@pytest.fixture(scope="module")
def ray() -> Iterator[Any]:
    ray = start_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-root")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[LocalServer]:
    with Servers(root) as servers:
        yield servers.start()


def dataset(ray: Any, table: pa.Table, blocks: int) -> Any:
    return ray.data.from_arrow(table).repartition(blocks)


def assert_same_rows(got: pa.Table, want: pa.Table) -> None:
    ids = got.column("id").to_pylist()
    assert sorted(ids) == want.column("id").to_pylist(), "not every row exactly once"
    got = got.sort_by("id")
    for name in want.schema.names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def write(ray: Any, table: pa.Table, root: Path, name: str, blocks: int = 3, **kwargs: Any) -> str:
    sink = ray_module.Datasink(root, name, quiet=True, **kwargs)
    dataset(ray, table, blocks).write_datasink(sink)
    assert sink.ref is not None
    return sink.ref


@pytest.mark.parametrize("kind", MODALITIES)
def test_datasink_registers_every_modality_read_exactly_once(
    ray: Any, root: Path, server: LocalServer, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table, meta = modality_table(kind)
    name = f"ray-{kind}"
    sink = ray_module.Datasink(root, name, target_row_group_bytes=4 << 10, metadata=meta)
    dataset(ray, table, 3).write_datasink(sink)
    assert sink.ref == f"{name}@1"
    assert f"{name}@1" in capsys.readouterr().out.split()  # printed by the driver
    m = sink.manifest
    assert m is not None and m.num_rows == table.num_rows
    assert len(m.shards) == 3 and all(s.checksums is not None for s in m.shards)
    assert any(len(s.row_groups) > 1 for s in m.shards)
    assert m.metadata["modality"] == meta["modality"] and m.metadata["source"] == "ray"
    assert m.schema.equals(table.schema)  # Arrow types kept: fixed-size observation vectors too
    assert verify(Registry(root), m) == []
    assert_same_rows(read_once(server.target, m.ref), table)


def test_read_from_the_files_and_through_the_fleet(ray: Any, root: Path, server: LocalServer) -> None:
    table, _ = modality_table("episodes")
    ref = write(ray, table, root, "ray-read", target_row_group_bytes=4 << 10)
    from_files = ray_module.read(root, ref, override_num_blocks=4)
    got = pa.concat_tables(ray.get(from_files.to_arrow_refs()))
    assert_same_rows(got, table)
    assert got.schema.equals(table.schema)
    cols = ray_module.read(str(root), ref, columns=["id", "length"]).to_arrow_refs()
    assert pa.concat_tables(ray.get(cols)).column_names == ["id", "length"]
    through = ray_module.read(
        server.target, ref, columns=["id", "reward"], override_num_blocks=2, batch_size=5
    )
    got = pa.concat_tables(ray.get(through.to_arrow_refs()))
    assert_same_rows(got, table.select(["id", "reward"]))
    with pytest.raises(InvalidArgumentError, match=r"unknown column\(s\) \['nope'\]"):
        ray_module.read(root, ref, columns=["nope"])


def test_read_refuses_a_damaged_shard(ray: Any, root: Path) -> None:
    table, _ = modality_table("text")
    ref = write(ray, table, root, "ray-flip", blocks=2)
    m = Registry(root).resolve(ref)
    flip_byte(root / "ray-flip" / m.shards[0].uri, 30, 0x02)
    with pytest.raises(Exception) as info:  # Ray wraps the task's error
        ray.get(ray_module.read(root, ref).to_arrow_refs())
    assert isinstance(info.value, DataLossError) or "DataLossError" in str(info.value)
    assert f"{m.shards[0].uri}" in str(info.value)


def test_append_and_refusals(ray: Any, root: Path) -> None:
    table, _ = modality_table("text")
    ref = write(ray, table, root, "ray-append", blocks=2)
    more = pa.table({"id": pa.array([500, 501], pa.int64()), "text": ["x", "y"]})
    ref2 = write(ray, more, root, "ray-append", blocks=1, change="append")
    m = Registry(root).resolve(ref2)
    assert (m.parent, m.change, m.num_rows) == (1, "append", table.num_rows + 2)
    assert ref == "ray-append@1"
    with pytest.raises(InvalidArgumentError, match="no dataset named 'ray-none'"):
        ray_module.Datasink(root, "ray-none", change="append")
    with pytest.raises(Exception, match="reserved for provenance"):
        dataset(ray, pa.table({"_shard": [1]}), 1).write_datasink(ray_module.Datasink(root, "ray-bad"))
    assert Registry(root).versions("ray-bad") == []
    assert not list((root / "ray-bad").rglob("*.parquet")) if (root / "ray-bad").exists() else True


def test_materialize_on_ray_equals_local(ray: Any, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardstream.cli import main

    table, meta = modality_table("episodes")
    src = write(ray, table, root, "eps-src", metadata=meta)
    transforms = [{"op": "rl.windows", "window": 6, "stride": 3, "n_step": 2, "gamma": 0.5}]
    on_ray = materialize(str(root), src, transforms, "eps-ray", run=ray_module.materialize_runner())
    local = materialize(str(root), src, transforms, "eps-local")
    assert on_ray.fingerprint == local.fingerprint and on_ray.num_rows > table.num_rows
    code = main(
        [
            "materialize",
            src,
            "--name",
            "eps-cli",
            "--transforms",
            json.dumps(transforms),
            "--engine",
            "ray",
            "--root",
            str(root),
            "-q",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.strip() == "eps-cli@1"
    assert Registry(root).resolve("eps-cli@1").fingerprint == local.fingerprint
