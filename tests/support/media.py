"""Real media files for the transform tests, and datasets made of them.

Real files no one here wrote: CPython's own sources (text), the images and sounds CPython ships in
its test package (Lib/test/imghdrdata, Lib/test/audiodata) and the PNG baselines that networkx and
sympy (installed with torch) ship. Where a format has no shipped file, it is made from a real one
(a JPEG re-encoded from a shipped PNG, FLAC/MP3 from a shipped WAV, videos encoded from shipped
images) and the test says so by the file's name.
"""

from __future__ import annotations

import io
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.manifest import Manifest
from shardstream.server.writing.ingest import IngestOptions, ingest

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def python_sources(n: int = 80) -> list[tuple[str, str]]:
    """(name, text) of n CPython standard-library modules, smallest first above 1 kB."""
    files = sorted(p for p in STDLIB.glob("*.py") if p.stat().st_size > 1000)
    files.sort(key=lambda p: (p.stat().st_size, p.name))
    return [(p.name, p.read_text(encoding="utf-8", errors="replace")) for p in files[:n]]


def _shipped_pngs() -> list[Path]:
    import networkx
    import sympy

    found = []
    for pkg in (networkx, sympy):
        found += sorted(Path(pkg.__file__).parent.rglob("*.png"))[:6]
    return found


def real_images() -> list[tuple[str, bytes]]:
    """(name, encoded bytes): JPEG, PNG and WebP, mostly as shipped."""
    from PIL import Image

    out: list[tuple[str, bytes]] = []
    imghdr = STDLIB / "test" / "imghdrdata"
    for name in ("python.jpg", "python.png", "python.webp"):
        if (imghdr / name).exists():
            out.append((f"cpython-{name}", (imghdr / name).read_bytes()))
    pngs = _shipped_pngs()
    out += [(f"shipped-{p.name}", p.read_bytes()) for p in pngs]
    # Larger JPEG and WebP files with real content: re-encoded from shipped PNGs.
    for p in pngs[:4]:
        with Image.open(p) as im:
            rgb = im.convert("RGB")
        for fmt in ("JPEG", "WEBP"):
            buf = io.BytesIO()
            rgb.save(buf, format=fmt, quality=90)
            out.append((f"reencoded-{p.stem}.{fmt.lower()}", buf.getvalue()))
    return out


def real_wav() -> tuple[str, bytes]:
    wav = STDLIB / "test" / "audiodata" / "pluck-pcm16.wav"
    if wav.exists():
        return "cpython-pluck-pcm16.wav", wav.read_bytes()
    import soundfile as sf  # no shipped WAV on this Python: a synthetic pluck

    t = np.arange(11025) / 11025
    sig = (0.5 * np.sin(2 * np.pi * 440 * t) * np.exp(-3 * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.stack([sig, sig * 0.5], 1), 11025, format="WAV", subtype="PCM_16")
    return "synthetic-pluck.wav", buf.getvalue()


def real_audio() -> list[tuple[str, bytes]]:
    """WAV as shipped, and FLAC / MP3 encoded from it (soundfile)."""
    import soundfile as sf

    name, wav = real_wav()
    data, sr = sf.read(io.BytesIO(wav), dtype="float32")
    out = [(name, wav)]
    for fmt in ("FLAC", "MP3"):
        buf = io.BytesIO()
        sf.write(buf, data, sr, format=fmt)
        out.append((f"{Path(name).stem}.{fmt.lower()}", buf.getvalue()))
    return out


def encode_video(frames: np.ndarray, container: str, codec: str, fps: int = 10) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def real_videos() -> list[tuple[str, bytes]]:
    """Short MP4 (MPEG-4 part 2) and WebM (VP8) clips whose frames pan across a shipped image."""
    from PIL import Image

    out = []
    for k, p in enumerate(_shipped_pngs()[:3]):
        with Image.open(p) as im:
            img = np.asarray(im.convert("RGB").resize((160, 120)))
        nframes = 12 + 5 * k
        frames = np.stack([np.roll(img, 7 * i, axis=1) for i in range(nframes)])
        out.append((f"pan-{p.stem}.mp4", encode_video(frames, "mp4", "mpeg4")))
        out.append((f"pan-{p.stem}.webm", encode_video(frames, "webm", "libvpx")))
    return out


def random_png(seed: int, height: int = 6, width: int = 5) -> bytes:
    """A small PNG of random pixels (Pillow), different for every seed."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def write_table(
    root: Path, name: str, table: pa.Table, *, row_group_rows: int = 8, shard_rows: int = 40
) -> Manifest:
    src = root.parent / f"src-{name}.parquet"
    pq.write_table(table, src)
    return ingest(
        src, name, root, IngestOptions(row_group_rows=row_group_rows, shard_rows=shard_rows, progress=False)
    )


def blob_table(column: str, items: list[tuple[str, bytes]], repeat: int = 1) -> pa.Table:
    names = [n for n, _ in items] * repeat
    blobs = [b for _, b in items] * repeat
    return pa.table(
        {
            "idx": pa.array(np.arange(len(names), dtype=np.int64)),
            "name": pa.array(names),
            column: pa.array(blobs, pa.binary()),
        }
    )


def episodes_table(n: int, seed: int = 0, obs_dim: int = 3) -> pa.Table:
    """n episodes of random lengths 1..40: obs [T, obs_dim] float32, action int64, reward, done."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 41, n)
    obs, act, rew, done = [], [], [], []
    for i, t in enumerate(lengths.tolist()):
        obs.append(rng.standard_normal((t, obs_dim)).astype(np.float32))
        act.append(rng.integers(0, 4, t))
        rew.append(rng.standard_normal(t).astype(np.float32))
        d = np.zeros(t, bool)
        d[-1] = i % 3 != 0  # every third episode is truncated, not terminated
        done.append(d)

    def lists(parts: list[np.ndarray], leaf: pa.DataType, inner: int | None = None) -> pa.Array:
        values = pa.array(np.concatenate([p.reshape(-1) for p in parts]), leaf)
        if inner is not None:
            values = pa.FixedSizeListArray.from_arrays(values, inner)
        offsets = np.zeros(len(parts) + 1, np.int32)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), values)

    return pa.table(
        {
            "episode": pa.array(np.arange(n, dtype=np.int64) + 1000),
            "obs": lists(obs, pa.float32(), obs_dim),
            "action": lists(act, pa.int64()),
            "reward": lists(rew, pa.float32()),
            "done": lists(done, pa.bool_()),
            "length": pa.array(lengths.astype(np.int32)),
        }
    )
