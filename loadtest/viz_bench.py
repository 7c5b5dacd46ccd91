"""The web visualizer's cost of showing a step of 64 images, as a ratio of decoding the same 64 images.

Baseline (A): the 64 stored JPEGs decoded and resized to 224² in this process, one after the other,
with the server's own `image.decode` function (Pillow) — the raw decode of the batch.
Candidates, from a running `shardstream web --root R` (which starts its own shard server):
  (B) a fresh step: the step page (the fleet reads and decodes the 64 images with image.decode,
      the app renders the HTML) and then every image on it — 64 decoded PNGs and 64 stored
      originals — fetched over HTTP one after the other, as a browser's requests would arrive;
  (C) the same page and images again with the step already read (the app's step cache): the
      rendering alone (HTML, 64 PNG encodes, 64 originals passed through).
A, B and C alternate (A B C A B C ...) after a warm-up of each; the report is the median of the
pairwise ratios B/A and C/A with their min-max. The images are made from the photo matplotlib ships
(grace_hopper.jpg), cropped and scaled to 64 different 500 x 375 JPEGs.
"""

from __future__ import annotations

import argparse
import html
import io
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from loadtest.chaos_net import free_port
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions

IMAGES = 64
SIZE = [224, 224]


def make_images(n: int) -> list[bytes]:
    import matplotlib
    from PIL import Image

    photo = Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg").convert("RGB")
    out = []
    for i in range(n):
        w, h = photo.size
        box = (i % 8 * 8, i // 8 * 8, w - (7 - i % 8) * 8, h - (7 - i // 8) * 8)
        img = photo.crop(box).resize((500, 375)).rotate(i * 5)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=300) as resp:
        return bytes(resp.read())


def page_and_media(base: str, params: dict[str, str]) -> int:
    """GET the step page, then each image on it; the number of images fetched."""
    page = get(base + "/step?" + urlencode(params)).decode()
    srcs = [html.unescape(s) for s in re.findall(r'<img class="(?:decoded|original)" src="([^"]+)"', page)]
    for src in srcs:
        get(base + src)
    return len(srcs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream.server.transforms.image import decode_image
    from shardstream.server.writing.ingest import IngestOptions, ingest

    images = make_images(IMAGES)
    work = Path(tempfile.mkdtemp(prefix="viz-bench-"))
    src = work / "photos.parquet"
    pq.write_table(pa.table({"id": list(range(IMAGES)), "image": pa.array(images, pa.binary())}), src)
    ingest(src, "photos", work / "root", IngestOptions(row_group_rows=IMAGES, progress=False))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardstream", "web", "--root", str(work / "root"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    transforms = f'[{{"op":"image.decode","column":"image","size":{SIZE}}}]'.replace(" ", "")
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                get(base + "/")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("shardstream web did not start") from None
                time.sleep(0.1)

        def decode() -> float:
            t0 = time.perf_counter()
            for data in images:
                decode_image(data, (SIZE[0], SIZE[1]))
            return time.perf_counter() - t0

        seeds = iter(range(10_000))

        def fresh() -> tuple[float, dict[str, str]]:
            params = {"d": "photos@1", "bs": str(IMAGES), "seed": str(next(seeds)), "tf": transforms}
            t0 = time.perf_counter()
            shown = page_and_media(base, params)
            assert shown == 2 * IMAGES, shown
            return time.perf_counter() - t0, params

        def cached(params: dict[str, str]) -> float:
            t0 = time.perf_counter()
            page_and_media(base, params)
            return time.perf_counter() - t0

        decode()
        _, params = fresh()
        cached(params)
        a_s, b_s, c_s = [], [], []
        for k in range(args.pairs):
            a_s.append(decode())
            b, params = fresh()
            b_s.append(b)
            c_s.append(cached(params))
            log(f"pair {k + 1}: decode {a_s[-1]:.3f} s, fresh step {b_s[-1]:.3f} s, render only {c_s[-1]:.3f} s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return {
        "images": IMAGES,
        "image_bytes": sum(map(len, images)),
        "size": SIZE,
        "decode_seconds": spread(a_s),
        "fresh_step_seconds": spread(b_s),
        "render_seconds": spread(c_s),
        "fresh_over_decode": spread([b / a for a, b in zip(a_s, b_s, strict=True)]),
        "render_over_decode": spread([c / a for a, c in zip(a_s, c_s, strict=True)]),
        "cpus": os.cpu_count(),
        "versions": versions(),
        "median_decode_ms_per_image": 1000 * statistics.median(a_s) / IMAGES,
    }


def print_report(r: dict[str, Any]) -> None:
    def fmt(s: dict[str, float]) -> str:
        return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

    print(f"{r['images']} JPEGs of 500 x 375 ({r['image_bytes'] / 2**20:.1f} MiB) -> image.decode {r['size']}")
    print(f"  raw decode (A)                  {fmt(r['decode_seconds'])} s")
    print(f"  fresh step page + images (B)    {fmt(r['fresh_step_seconds'])} s   B/A {fmt(r['fresh_over_decode'])}")
    print(f"  render only, step cached (C)    {fmt(r['render_seconds'])} s   C/A {fmt(r['render_over_decode'])}")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.viz_bench", __doc__, whole_doc=True)
    ap.add_argument("--pairs", type=int, default=3, help="alternating A B C rounds after the warm-up (default 3)")
    return bench_main(ap, argv, run, json_default=results_path("viz_bench"), report=print_report)


if __name__ == "__main__":
    sys.exit(main())
