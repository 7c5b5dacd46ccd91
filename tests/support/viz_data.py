"""A registry with one dataset per modality, for the visualizer tests (real media, see media.py).

    text      CPython's own sources (name, text)
    photos    images as shipped (CPython, matplotlib's sample photos, networkx/sympy PNGs) and re-encoded
    sounds    CPython's test WAV, FLAC/MP3 made from it, and matplotlib-free synthetic tones
    clips     MP4 and WebM clips panning over shipped images
    episodes  RL episodes (obs, action, reward, done)
    notes     more CPython sources, the same columns as text; notes@2 appends 8 rows
    mix       not a dataset: `MIXTURE` mixes text and notes
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from .media import (
    blob_table,
    episodes_table,
    python_sources,
    real_audio,
    real_images,
    real_videos,
    write_table,
)

__all__ = ["MIXTURE", "make_viz_registry", "matplotlib_photos"]

MIXTURE = "text@1:0.7,notes@1:0.3"


def matplotlib_photos() -> list[tuple[str, bytes]]:
    """The photos matplotlib ships in its sample data (grace_hopper.jpg and friends), as stored."""
    import matplotlib

    sample = Path(matplotlib.get_data_path()) / "sample_data"
    return [(f"matplotlib-{p.name}", p.read_bytes()) for p in sorted(sample.glob("*.jpg")) + sorted(sample.glob("*.png"))]


def _tones() -> list[tuple[str, bytes]]:
    import soundfile as sf

    out = []
    for k, (freq, seconds, rate) in enumerate(((220, 0.5, 8000), (440, 1.5, 22050), (880, 0.25, 16000))):
        t = np.arange(int(seconds * rate)) / rate
        buf = io.BytesIO()
        sf.write(buf, (0.4 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV", subtype="PCM_16")
        out.append((f"tone-{k}-{freq}hz.wav", buf.getvalue()))
    return out


def make_viz_registry(root: Path) -> Path:
    """Ingest the datasets above under `root` (once per directory) and return it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream.server.writing.ingest import IngestOptions, ingest

    if (root / "text").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    sources = python_sources(96)
    for name, part in (("text", sources[:48]), ("notes", sources[48:])):
        columns = {"id": np.arange(len(part)), "name": [n for n, _ in part], "text": [t[:3000] for _, t in part]}
        write_table(root, name, pa.table(columns))
    # notes@2 appends rows to notes@1: a version history with a diff
    more = sources[:8]
    src = root.parent / "src-notes-2.parquet"
    pq.write_table(pa.table({"id": np.arange(48, 56), "name": [n for n, _ in more], "text": [t[:3000] for _, t in more]}), src)
    ingest(src, "notes", root, IngestOptions(row_group_rows=8, shard_rows=40, progress=False), change="append")
    images = matplotlib_photos() + real_images()
    write_table(root, "photos", blob_table("image", images, repeat=2).rename_columns(["id", "name", "image"]))
    sounds = real_audio() + _tones()
    write_table(root, "sounds", blob_table("audio", sounds, repeat=3).rename_columns(["id", "name", "audio"]))
    write_table(root, "clips", blob_table("video", real_videos(), repeat=2).rename_columns(["id", "name", "video"]))
    write_table(root, "episodes", episodes_table(40))
    return root
