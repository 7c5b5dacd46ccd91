"""`shardstream ingest` of image folders, WebDataset tars and RL episodes (server/writing/ingest_sources.py)."""

from __future__ import annotations

import io
import struct
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.client import Loader
from shardstream.errors import InvalidArgumentError
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

from .support.processes import run_cli

OPTS = IngestOptions(row_group_rows=3, shard_rows=5, progress=False)


def png(width: int, height: int, seed: int) -> bytes:
    """A valid RGB PNG, written by hand (Pillow is not installed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rng = np.random.default_rng(seed)
    raw = b"".join(b"\x00" + rng.integers(0, 256, width * 3, dtype=np.uint8).tobytes() for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


def make_images(src: Path, layout: dict[str, int]) -> dict[str, bytes]:
    files = {}
    for ci, (cls, n) in enumerate(layout.items()):
        (src / cls).mkdir(parents=True)
        for i in range(n):
            rel = f"{cls}/img{i}.png"
            files[rel] = png(2 + i, 3, seed=100 * ci + i)
            (src / rel).write_bytes(files[rel])
    return files


def rows_of(root: Path, name: str) -> pa.Table:
    reg = Registry(root)
    m = reg.resolve(name)
    return pa.concat_tables([pq.read_table(reg.shard_path(m, s.uri)) for s in m.shards])


def nothing_registered(root: Path, name: str) -> bool:
    data = root / name / "data"
    return Registry(root).versions(name) == [] and (not data.exists() or not any(data.iterdir()))


# --- images ------------------------------------------------------------------------------------
def test_image_folder_labels_classes_and_exact_bytes(tmp_path: Path) -> None:
    src = tmp_path / "imgs"
    files = make_images(src, {"zebra": 3, "cat": 4, "dog": 2})
    (src / ".DS_Store").write_bytes(b"junk")  # hidden: never read
    m = ingest(src, "pics", tmp_path / "root", OPTS)
    assert m.metadata["modality"] == "image"
    assert m.metadata["classes"] == ["cat", "dog", "zebra"]
    assert m.num_rows == 9 and len(m.shards) == 2
    assert m.schema.field("image").type == pa.binary() and m.schema.field("label").type == pa.int32()
    t = rows_of(tmp_path / "root", "pics")
    for row in t.to_pylist():
        assert row["image"] == files[row["path"]]  # stored undecoded, byte for byte
        assert row["class"] == row["path"].split("/")[0]
        assert row["label"] == ["cat", "dog", "zebra"].index(row["class"])
    assert sorted(t.column("path").to_pylist()) == sorted(files)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: d.mkdir(), "no input files"),
        (lambda d: (d / "cat").mkdir(parents=True), "no class folders|no input files"),
        (
            lambda d: (make_images(d, {"cat": 1}), (d / "cat" / "notes.txt").write_text("x")),
            "1 file.* not images",
        ),
        (
            lambda d: (make_images(d, {"cat": 1}), (d / "top.png").write_bytes(png(1, 1, 0))),
            "outside a class",
        ),
        (lambda d: (make_images(d, {"cat": 1}), (d / "dog").mkdir()), "without images: dog"),
        (
            lambda d: (make_images(d, {"cat": 1}), (d / "cat" / "fake.jpg").write_text("hi")),
            "fake.jpg: not a JPEG",
        ),
    ],
)
def test_bad_image_folders_register_nothing(
    tmp_path: Path, setup: Callable[[Path], object], message: str
) -> None:
    src = tmp_path / "imgs"
    setup(src)
    with pytest.raises(InvalidArgumentError, match=message):
        ingest(src, "pics", tmp_path / "root", OPTS, format="images" if "fake" in message else None)
    assert nothing_registered(tmp_path / "root", "pics")


def test_forced_images_format_on_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    with pytest.raises(InvalidArgumentError, match="no class folders"):
        ingest(tmp_path / "e", "pics", tmp_path / "root", OPTS, format="images")


# --- WebDataset --------------------------------------------------------------------------------
def make_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_webdataset_tars_group_members_by_key(tmp_path: Path) -> None:
    src = tmp_path / "wds"
    src.mkdir()
    make_tar(
        src / "shard-000.tar",
        [("s0.jpg", b"J0"), ("s0.cls", b"3"), ("s1.jpg", b"J1"), ("s1.cls", b"5"), ("s1.seg.png", b"P1")],
    )
    make_tar(src / "shard-001.tar", [("dir/s2.cls", b"7"), ("dir/s2.jpg", b"J2")])
    m = ingest(src, "wds", tmp_path / "root", OPTS)
    assert m.metadata["modality"] == "webdataset"
    assert m.metadata["extensions"] == ["cls", "jpg", "seg.png"]
    assert m.schema.names == ["__key__", "cls", "jpg", "seg.png"]
    assert all(m.schema.field(e).type == pa.binary() for e in ("cls", "jpg", "seg.png"))
    assert rows_of(tmp_path / "root", "wds").to_pylist() == [
        {"__key__": "s0", "cls": b"3", "jpg": b"J0", "seg.png": None},
        {"__key__": "s1", "cls": b"5", "jpg": b"J1", "seg.png": b"P1"},
        {"__key__": "dir/s2", "cls": b"7", "jpg": b"J2", "seg.png": None},
    ]


def test_unreadable_tar_names_the_file_and_registers_nothing(tmp_path: Path) -> None:
    src = tmp_path / "wds"
    src.mkdir()
    make_tar(src / "a.tar", [("s0.txt", b"ok")])
    (src / "b.tar").write_bytes(b"this is not a tar archive at all" * 40)
    with pytest.raises(InvalidArgumentError, match=r"b\.tar: not a readable tar file"):
        ingest(src, "wds", tmp_path / "root", OPTS)
    assert nothing_registered(tmp_path / "root", "wds")


def test_tar_member_without_extension_is_refused(tmp_path: Path) -> None:
    make_tar(tmp_path / "a.tar", [("README", b"hi")])
    with pytest.raises(InvalidArgumentError, match="no key.extension"):
        ingest(tmp_path / "a.tar", "wds", tmp_path / "root", OPTS)


# --- RL episodes -------------------------------------------------------------------------------
def make_episode(
    path: Path, t: int, seed: int, obs_dim: int = 4, **override: np.ndarray
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "obs": rng.standard_normal((t, obs_dim)).astype(np.float32),
        "action": rng.integers(0, 3, t).astype(np.int64),
        "reward": rng.standard_normal(t).astype(np.float32),
        "done": np.arange(t) == t - 1,
    }
    arrays.update(override)
    np.savez(path, **arrays)
    return arrays


def test_episodes_one_row_each_with_fixed_size_steps(tmp_path: Path) -> None:
    src = tmp_path / "eps"
    src.mkdir()
    eps = [make_episode(src / f"ep{i:03d}.npz", t, seed=i) for i, t in enumerate([5, 1, 8, 3])]
    m = ingest(src, "rl", tmp_path / "root", IngestOptions(row_group_rows=2, shard_rows=3, progress=False))
    assert m.num_rows == 4
    assert m.schema.field("obs").type == pa.list_(pa.list_(pa.float32(), 4))
    assert m.schema.field("reward").type == pa.list_(pa.float32())
    assert m.schema.field("done").type == pa.list_(pa.bool_())
    assert m.schema.field("episode").type == pa.int64() and m.schema.field("length").type == pa.int32()
    assert m.metadata["modality"] == "rl_episodes" and m.metadata["obs_shape"] == [4]
    assert m.metadata["action_dtype"] == "int64"
    t = rows_of(tmp_path / "root", "rl")
    assert t.column("episode").to_pylist() == [0, 1, 2, 3]
    assert t.column("length").to_pylist() == [5, 1, 8, 3]
    for i, ep in enumerate(eps):
        for k, a in ep.items():
            np.testing.assert_array_equal(np.array(t.column(k)[i].as_py(), dtype=a.dtype), a)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"reward": np.zeros(4, np.float32)}, r"ep1\.npz: arrays differ in length"),
        ({"obs": np.zeros((5, 2), np.float32)}, r"ep1\.npz: obs has per-step shape \[2\]"),
        ({"done": np.array(["a"] * 5)}, r"ep1\.npz: array 'done' has dtype"),
    ],
)
def test_bad_episode_names_the_file(tmp_path: Path, override: dict[str, np.ndarray], message: str) -> None:
    src = tmp_path / "eps"
    src.mkdir()
    make_episode(src / "ep0.npz", 5, seed=0)
    make_episode(src / "ep1.npz", 5, seed=1, **override)
    with pytest.raises(InvalidArgumentError, match=message):
        ingest(src, "rl", tmp_path / "root", OPTS)
    assert nothing_registered(tmp_path / "root", "rl")


def test_episode_missing_an_array_names_the_file(tmp_path: Path) -> None:
    src = tmp_path / "eps"
    src.mkdir()
    make_episode(src / "ep0.npz", 5, seed=0)
    np.savez(src / "ep1.npz", obs=np.zeros((5, 4), np.float32), action=np.zeros(5), reward=np.zeros(5))
    with pytest.raises(InvalidArgumentError, match=r"ep1\.npz: missing array\(s\) \['done'\]"):
        ingest(src, "rl", tmp_path / "root", OPTS)
    assert nothing_registered(tmp_path / "root", "rl")


# --- detection, CLI, end to end ------------------------------------------------------------------
def test_mixed_inputs_need_format(tmp_path: Path) -> None:
    src = tmp_path / "mix"
    src.mkdir()
    make_episode(src / "ep0.npz", 2, seed=0)
    make_tar(src / "a.tar", [("s0.txt", b"ok")])
    with pytest.raises(InvalidArgumentError, match="mixed inputs.*--format"):
        ingest(src, "mix", tmp_path / "root", OPTS)
    m = ingest(src, "mix", tmp_path / "root", OPTS, format="episodes")  # the tar is ignored
    assert m.num_rows == 1 and m.metadata["modality"] == "rl_episodes"


def test_cli_format_flag_and_one_line_errors(tmp_path: Path) -> None:
    make_images(tmp_path / "imgs", {"a": 2, "b": 1})
    r = run_cli("ingest", "imgs", "--name", "pics", "--root", "root", "-q", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "pics@1", r.stderr
    (tmp_path / "imgs" / "a" / "notes.txt").write_text("x")
    r = run_cli("ingest", "imgs", "--name", "pics", "--root", "root", "--format", "images", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("shardstream: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "not images" in r.stderr
    assert Registry(tmp_path / "root").versions("pics") == [1]
    r = run_cli("ingest", "imgs", "--name", "pics", "--format", "nope", cwd=tmp_path)
    assert r.returncode == 2


def test_images_end_to_end_through_loader(tmp_path: Path, server_factory: Callable[..., LocalServer]) -> None:
    files = make_images(tmp_path / "imgs", {"cat": 4, "dog": 3})
    root = tmp_path / "root"
    ingest(tmp_path / "imgs", "pics", root, OPTS)
    server = server_factory(root)
    got: dict[str, tuple[bytes, int]] = {}
    with Loader([server.target], "pics@1", batch_size=3) as ld:
        for batch in ld:
            for img, label, path in zip(batch["image"], batch["label"], batch["path"], strict=True):
                got[str(path)] = (bytes(img), int(label))
    assert got == {rel: (data, 0 if rel.startswith("cat/") else 1) for rel, data in files.items()}
