"""`shardstream materialize` (local engine): the output, read through a real server, is byte for byte
what the online transforms give; lineage; random transforms, bad samples and bad sources refused
with nothing registered. The Spark and Ray engines: tests/test_spark.py, tests/test_ray.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shardstream.cli import main
from shardstream.client import Loader
from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.manifest import Manifest
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.transforms.base import Transform
from shardstream.server.writing.drop_rows import drop_rows
from shardstream.server.writing.materialize import materialize, random_reason

from .support.flips import flip_byte
from .support.media import (
    blob_table,
    episodes_table,
    python_sources,
    real_audio,
    real_images,
    real_videos,
    write_table,
)
from .support.servers import Servers

IMAGE = {"op": "image.decode", "column": "image", "size": [24, 32]}
CASES: dict[str, tuple[str, list[dict[str, Any]], list[str] | None]] = {
    # case -> (source dataset, transforms, columns)
    "image": ("images", [IMAGE], None),
    "image-normalized-chw": (
        "images",
        [
            {
                **IMAGE,
                "crop": "none",
                "mode": "L",
                "normalize": {"mean": [0.5], "std": [0.25]},
                "layout": "CHW",
            }
        ],
        ["idx", "image"],
    ),
    "tokens": ("text", [{"op": "text.tokenize", "column": "text"}], None),
    "byte-tokens": (
        "text",
        [{"op": "text.tokenize", "column": "text", "tokenizer": "bytes", "output": "ids"}],
        None,
    ),
    "audio": (
        "audio",
        [{"op": "audio.decode", "column": "audio", "sample_rate": 8000, "seconds": 0.5, "crop": "center"}],
        None,
    ),
    "video": (
        "video",
        [{"op": "video.frames", "column": "video", "num_frames": 4, "stride": 3, "size": [16, 20]}],
        None,
    ),
    "rl-windows": (
        "episodes",
        [{"op": "rl.windows", "window": 8, "stride": 5, "n_step": 3, "gamma": 0.9}],
        None,
    ),
}


MASKED = {
    "text": [(0, 1), *((0, r) for r in range(4, 8)), (1, 11), (2, 0)],
    "episodes": [(0, 2), *((1, r) for r in range(4, 8)), (2, 0)],
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("materialize")
    root = base / "root"
    root.mkdir()
    write_table(root, "images", blob_table("image", real_images(), repeat=2), row_group_rows=5, shard_rows=17)
    texts = [t for _, t in python_sources(30)]
    write_table(
        root,
        "text",
        pa.table({"idx": list(range(len(texts))), "text": texts}),
        row_group_rows=4,
        shard_rows=12,
    )
    write_table(root, "audio", blob_table("audio", real_audio(), repeat=2))
    write_table(root, "video", blob_table("video", real_videos()))
    write_table(root, "episodes", episodes_table(25, seed=1), row_group_rows=4, shard_rows=10)
    # drop_rows versions: text@2 and episodes@2 mask a row, a whole row group, a shard's last/first row
    reg = Registry(root)
    for name, rows in MASKED.items():
        drop_rows(reg, name, rows=rows)
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[LocalServer]:
    with Servers(root) as servers:
        yield servers.start()


def read_all(server: LocalServer, ref: str, **kwargs: Any) -> pa.Table:
    with Loader([server.target], ref, batch_size=5, shuffle=False, output="arrow", **kwargs) as ld:
        return pa.Table.from_batches(list(ld))


@pytest.mark.parametrize("case", sorted(CASES))
def test_materialized_rows_are_the_online_transforms_bytes(
    root: Path, server: LocalServer, case: str
) -> None:
    source, transforms, columns = CASES[case]
    m = materialize(str(root), f"{source}@1", transforms, f"mat-{case}", columns=columns or ())
    assert m.derived_from is not None and m.derived_from.source == f"{source}@1"
    online = read_all(server, f"{source}@1", transforms=transforms, columns=columns)
    stored = read_all(server, m.ref)
    assert stored.num_rows == online.num_rows > 0
    assert stored.schema.names == online.schema.names
    for name in online.schema.names:
        assert stored.schema.field(name).type == online.schema.field(name).type, name
        assert stored.column(name).combine_chunks().equals(online.column(name).combine_chunks()), name
    # The field metadata the transforms set (text.tokenize's EOS id, which text.pack reads) is kept.
    for name in online.schema.names:
        assert stored.schema.field(name).metadata == online.schema.field(name).metadata, name


@pytest.mark.parametrize("case", ["tokens", "byte-tokens", "rl-windows"])
def test_a_drop_rows_source_materializes_exactly_the_rows_it_serves(
    root: Path, server: LocalServer, case: str
) -> None:
    """A masked source: the output leaves its masked rows out (none read back, none twice) and is byte
    for byte what reading the source online with the transforms gives — positions (rl.windows'
    episode ids) count the rows the version holds, as the server counts them."""
    source, transforms, columns = CASES[case]
    src = Registry(root).resolve(f"{source}@2")
    assert src.masked_rows == len(MASKED[source])
    m = materialize(str(root), f"{source}@2", transforms, f"mat-masked-{case}", columns=columns or ())
    assert m.derived_from is not None and m.derived_from.source == f"{source}@2"
    assert not any(s.masked for s in m.shards)  # no mask of its own: the rows are left out
    online = read_all(server, f"{source}@2", transforms=transforms, columns=columns)
    stored = read_all(server, m.ref)
    assert stored.num_rows == online.num_rows > 0
    for name in online.schema.names:
        assert stored.column(name).combine_chunks().equals(online.column(name).combine_chunks()), name
    if source == "text":  # one output row per held source row: exactly the held ids, once each
        starts = np.cumsum([0] + [s.rows for s in src.shards])
        masked_ids = {int(starts[s]) + r for s, r in MASKED[source]}
        assert stored.column("idx").to_pylist() == [i for i in range(30) if i not in masked_ids]


def test_serving_the_materialized_version_needs_no_transform(root: Path, server: LocalServer) -> None:
    m = materialize(str(root), "images@1", [IMAGE], "images-24x32")
    got = read_all(server, m.ref, columns=["idx", "image"])
    assert got.column("image").type == pa.fixed_shape_tensor(pa.uint8(), [24, 32, 3])
    # And a text.pack applied online on top of materialized tokens uses their EOS id.
    tok = materialize(str(root), "text@1", [{"op": "text.tokenize", "column": "text"}], "text-tokens")
    packed = read_all(
        server, tok.ref, columns=["text"], transforms=[{"op": "text.pack", "column": "text", "seq_len": 64}]
    )
    online = read_all(
        server,
        "text@1",
        columns=["text"],
        transforms=[
            {"op": "text.tokenize", "column": "text"},
            {"op": "text.pack", "column": "text", "seq_len": 64},
        ],
    )
    for name in ("input_ids", "labels", "position_ids", "document_ids"):
        assert packed.column(name).equals(online.column(name)), name


def test_lineage_is_recorded_and_shown(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transforms = [{"op": "image.decode", "column": "image", "size": [8, 8], "crop": "none"}]
    code = main(
        [
            "materialize",
            "images@1",
            "--name",
            "thumbs",
            "--columns",
            "idx,image",
            "--transforms",
            json.dumps(transforms),
            "--root",
            str(root),
            "-q",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.strip() == "thumbs@1"
    reg = Registry(root)
    m = reg.resolve("thumbs@1")
    src = reg.resolve("images@1")
    d = m.derived_from
    assert d is not None
    assert (d.source, d.fingerprint, d.columns, list(d.transforms)) == (
        "images@1",
        src.fingerprint,
        ("idx", "image"),
        transforms,
    )
    assert m.parent is None and m.change == "create"
    assert main(["datasets", "show", "thumbs@1", "--root", str(root)]) == 0
    shown = capsys.readouterr().out
    assert f"derived from images@1 (fingerprint {src.fingerprint[:16]}, columns idx, image)" in shown
    assert f"transforms   {json.dumps(transforms, sort_keys=True)}" in shown
    assert main(["datasets", "show", "thumbs@1", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["derived_from"]["source"] == "images@1"
    # Another materialization of the same source is the next version, its lineage checked as usual.
    code = main(
        [
            "materialize",
            "images@1",
            "--name",
            "thumbs",
            "--columns",
            "idx,image",
            "--transforms",
            json.dumps(transforms),
            "--root",
            str(root),
            "-q",
        ]
    )
    assert code == 0
    assert reg.resolve("thumbs@2").parent == 1


def test_derived_from_is_backward_compatible(root: Path) -> None:
    plain = Registry(root).resolve("images@1")
    assert "derived_from" not in plain.to_json()  # every other manifest's JSON stays as it was
    m = materialize(str(root), "images@1", [IMAGE], "compat")
    d = m.to_json()
    assert Manifest.from_json(d).derived_from == m.derived_from
    # A reader that predates the key ignores it: the fingerprint does not cover it.
    d.pop("derived_from")
    assert Manifest.from_json(d).fingerprint == m.fingerprint


@pytest.mark.parametrize(
    ("transforms", "why"),
    [
        ([{**IMAGE, "crop": "random"}], "crop 'random' is augmentation"),
        ([{**IMAGE, "hflip": True}], "hflip is augmentation"),
        (
            [{"op": "text.tokenize", "column": "text"}, {"op": "text.pack", "column": "text", "seq_len": 32}],
            "reader's batch size and world size",
        ),
        (
            [
                {
                    "op": "audio.decode",
                    "column": "audio",
                    "sample_rate": 8000,
                    "seconds": 0.1,
                    "crop": "random",
                }
            ],
            "crop 'random'",
        ),
        ([{"op": "image.decode", "column": "image"}], "parameter 'size' is required"),
        ([{"op": "image.blur", "column": "image"}], "unknown op 'image.blur'"),
        ([{"op": "image.decode", "column": "nope", "size": 8}], "no column 'nope'"),
        ([], "give at least one transform"),
    ],
)
def test_random_or_invalid_transforms_are_refused_and_nothing_is_written(
    root: Path, transforms: list[dict[str, Any]], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = "text@1" if transforms and transforms[0]["op"].startswith("text") else "images@1"
    if transforms and transforms[0]["op"] == "audio.decode":
        source = "audio@1"
    code = main(
        [
            "materialize",
            source,
            "--name",
            "refused",
            "--transforms",
            json.dumps(transforms),
            "--root",
            str(root),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert why in err and err.startswith("shardstream: error: ") and err.count("\n") == 1, err
    assert not (root / "refused").exists()


def test_usage_errors(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args, why in [
        (
            ["images@1", "--name", "images", "--transforms", json.dumps([IMAGE])],
            "another dataset than the source",
        ),
        (["images@1", "--name", "x", "--transforms", "[{"], "--transforms is not valid JSON"),
        (["images@1", "--name", "x", "--transforms", "@/nonexistent/t.json"], "cannot read the file"),
        (
            ["images@1", "--name", "x", "--transforms", json.dumps([IMAGE]), "--columns", "idx,nope"],
            "unknown column(s) ['nope']",
        ),
        (["images@9", "--name", "x", "--transforms", json.dumps([IMAGE])], "has no version 9"),
        (
            ["images@1", "--name", "x", "--transforms", json.dumps([IMAGE]), "--spark-master", "local[1]"],
            "--engine spark only",
        ),
    ]:
        assert main(["materialize", *args, "--root", str(root)]) == 1, args
        assert why in capsys.readouterr().err, args
    assert not (root / "x").exists()


def test_a_bad_sample_fails_the_run_naming_it_and_registers_nothing(root: Path) -> None:
    items = real_images()[:4] + [("broken.jpg", b"\xff\xd8\xff not really a jpeg")] + real_images()[4:6]
    write_table(root, "with-bad", blob_table("image", items), row_group_rows=3, shard_rows=6)
    with pytest.raises(
        DataLossError,
        match=r"image\.decode failed on with-bad@1 shard 0 \(data/[0-9a-f]+/part-00000\.parquet\) row 4",
    ):
        materialize(str(root), "with-bad@1", [IMAGE], "bad-out")
    assert Registry(root).versions("bad-out") == []
    assert not list((root / "bad-out").rglob("*.parquet")) if (root / "bad-out").exists() else True


def test_a_damaged_source_shard_is_data_loss(root: Path, tmp_path: Path) -> None:
    m = write_table(root, "damaged", blob_table("image", real_images()), row_group_rows=4, shard_rows=8)
    shard = m.shards[1]
    path = root / "damaged" / shard.uri
    flip_byte(path, 40, 0x10)  # inside the first column chunk of row group 0
    with pytest.raises(DataLossError, match=rf"damaged@1: shard {shard.uri}: row group 0: column chunk"):
        materialize(str(root), "damaged@1", [IMAGE], "damaged-out")
    assert Registry(root).versions("damaged-out") == []


def test_materialize_rejects_a_mapping_that_is_not_a_list(root: Path) -> None:
    m = materialize(str(root), "images", json.dumps(IMAGE), "single")  # one transform: accepted as is
    assert m.derived_from is not None and list(m.derived_from.transforms) == [IMAGE]
    with pytest.raises(InvalidArgumentError, match="transforms must be a list"):
        materialize(str(root), "images", "42", "single")


def test_the_client_imports_no_engine() -> None:
    """A GPU host never pulls Spark or Ray (nor the server code their adapters run)."""
    code = (
        "import sys\n"
        "from shardstream.client import Loader\n"
        "from shardstream.client.torch_dataset import ShardStreamDataset\n"
        "import shardstream.cli\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'ray')"
        " or m.startswith(('shardstream.engines.spark_io', 'shardstream.engines.ray_io')))\n"
        "print(','.join(bad))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported: {r.stdout.strip()}"


def test_ops_the_table_does_not_name_are_judged_by_their_deterministic_property() -> None:
    class Said(Transform):
        op = "x.said"
        deterministic = True

    class Silent(Transform):
        op = "x.silent"

    assert random_reason(Said()) is None
    assert "not known to be deterministic" in str(random_reason(Silent()))
