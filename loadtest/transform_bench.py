"""Server-side transforms vs doing the same work locally, as ratios measured side by side.

    python -m loadtest.transform_bench [--images 600] [--pairs 3] [--json PATH]

1. image decode, per server core: a server with `--transform-threads 1` decodes + resizes + center-crops
   JPEGs (500x375 -> 224x224, like ImageNet) for one client; vs a bare Pillow loop doing the same
   calls on the same bytes in this process. Reports images/s and images per CPU-second of the server
   process (the fairer "per core" figure on a 2-core machine where client and server share the CPUs).
2. token packing: text.pack of pre-tokenized documents into 2048-token rows served, vs a bare numpy
   pack (concatenate + EOS + reshape) of the same ids in this process: tokens/s.
3. trainer CPU: client CPU-seconds per 1,000 images received decoded from the fleet, vs a local
   `torch.utils.data.DataLoader` (num_workers=0) decoding the same JPEGs with the same Pillow calls.

Passes alternate A B A B after a warm-up each; ratios are medians (min-max) of the per-pair ratios.
Benchmarks assert nothing; read loadtest/README.md before quoting a figure.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.client import Loader
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

from .common import bench_main, bench_parser, log, results_path, spread, versions

SIZE = 224


def make_jpegs(n: int, seed: int = 0) -> list[bytes]:
    """n JPEGs of 500x375 with smooth random content (realistic sizes, ~30-60 kB)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    yy, xx = np.mgrid[0:375, 0:500]
    for _ in range(n):
        f = rng.uniform(0.005, 0.05, 6)
        img = np.stack(
            [127 + 120 * np.sin(f[2 * c] * xx + f[2 * c + 1] * yy + rng.uniform(0, 6)) for c in range(3)],
            axis=-1,
        )
        img += rng.normal(0, 12, img.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def pillow_decode(data: bytes) -> np.ndarray:
    """The bare baseline: the same Pillow calls image.decode makes (center crop, bilinear)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as src:
        w0, h0 = src.size
        img = src.convert("RGB")
    s = max(SIZE / h0, SIZE / w0)
    nw, nh = max(SIZE, round(w0 * s)), max(SIZE, round(h0 * s))
    img = img.resize((nw, nh), Image.Resampling.BILINEAR)
    left, top = (nw - SIZE) // 2, (nh - SIZE) // 2
    return np.asarray(img.crop((left, top, left + SIZE, top + SIZE)))


def ratio(pairs: list[tuple[float, float]]) -> dict[str, float]:
    return spread([a / b for a, b in pairs])


def alternate(
    a: Callable[[], dict[str, float]], b: Callable[[], dict[str, float]], pairs: int
) -> tuple[list, list]:
    a(), b()  # warm-up
    ra, rb = [], []
    for _ in range(pairs):
        ra.append(a())
        rb.append(b())
    return ra, rb


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="shardstream-tbench-"))
    root = work / "root"
    log(f"making {args.images} JPEGs and {args.docs} token documents in {work}")
    jpegs = make_jpegs(args.images)
    pq.write_table(pa.table({"image": pa.array(jpegs, pa.binary())}), work / "images.parquet")
    ingest(work / "images.parquet", "images", root, IngestOptions(row_group_rows=64, progress=False))
    rng = np.random.default_rng(1)
    lengths = rng.integers(50, 1500, args.docs)
    docs = [rng.integers(0, 100_000, n).astype(np.int32) for n in lengths]
    offsets = np.zeros(len(docs) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(docs)))
    pq.write_table(pa.table({"ids": tokens}), work / "tokens.parquet")
    ingest(work / "tokens.parquet", "tokens", root, IngestOptions(progress=False))
    total_tokens = int(lengths.sum()) + args.docs

    server = LocalServer(root, extra_args=("--transform-threads", "1")).start()
    proc = psutil.Process(server.proc.pid)  # type: ignore[union-attr]
    results: dict[str, Any] = {"versions": versions("grpcio", "pillow", "av", "torch"), "images": args.images}
    try:

        def cpu_server() -> float:
            t = proc.cpu_times()
            return t.user + t.system

        def served_images() -> dict[str, float]:
            s0, c0, t0 = cpu_server(), time.process_time(), time.perf_counter()
            n = 0
            with Loader(
                [server.target],
                "images",
                batch_size=32,
                shuffle=False,
                columns=["image"],
                transforms=[{"op": "image.decode", "size": [SIZE, SIZE]}],
            ) as loader:
                for b in loader:
                    n += len(b["image"])
            wall = time.perf_counter() - t0
            return {
                "per_s": n / wall,
                "server_cpu": cpu_server() - s0,
                "client_cpu": time.process_time() - c0,
                "n": n,
            }

        def bare_images() -> dict[str, float]:
            c0, t0 = time.process_time(), time.perf_counter()
            for data in jpegs:
                pillow_decode(data)
            wall = time.perf_counter() - t0
            return {"per_s": len(jpegs) / wall, "cpu": time.process_time() - c0}

        log("1. image decode: served (1 transform thread) vs bare Pillow loop")
        served, bare = alternate(served_images, bare_images, args.pairs)
        results["image_decode"] = {
            "served_per_s": [r["per_s"] for r in served],
            "bare_per_s": [r["per_s"] for r in bare],
            "throughput_ratio": ratio([(a["per_s"], b["per_s"]) for a, b in zip(served, bare, strict=True)]),
            "per_server_cpu_s_ratio": ratio(
                [(a["n"] / a["server_cpu"], len(jpegs) / b["cpu"]) for a, b in zip(served, bare, strict=True)]
            ),
        }

        def served_pack() -> dict[str, float]:
            t0 = time.perf_counter()
            n = 0
            with Loader(
                [server.target],
                "tokens",
                batch_size=256,
                shuffle=False,
                columns=["ids"],
                transforms=[{"op": "text.pack", "column": "ids", "seq_len": 2048, "eos_id": 0}],
            ) as loader:
                for b in loader:
                    n += int((b["document_ids"] >= 0).sum())
            assert n == total_tokens
            return {"per_s": n / (time.perf_counter() - t0)}

        def bare_pack() -> dict[str, float]:
            t0 = time.perf_counter()
            table = pq.read_table(work / "tokens.parquet")
            n = 0
            col = table.column("ids").combine_chunks()
            for start in range(0, len(col), 256):
                part = col.slice(start, 256)
                vals = part.flatten().to_numpy()
                lens = np.diff(part.offsets.to_numpy()) + 1
                flat = np.zeros(int(lens.sum()), np.int32)
                ends = np.cumsum(lens) - 1
                mask = np.ones(len(flat), bool)
                mask[ends] = False
                flat[mask] = vals
                rows = -(-len(flat) // 2048)
                np.concatenate([flat, np.zeros(rows * 2048 - len(flat), np.int32)]).reshape(rows, 2048)
                n += len(flat)
            return {"per_s": n / (time.perf_counter() - t0)}

        log("2. token packing: served text.pack vs bare numpy packing")
        served, bare = alternate(served_pack, bare_pack, args.pairs)
        results["token_pack"] = {
            "served_tokens_per_s": [r["per_s"] for r in served],
            "bare_tokens_per_s": [r["per_s"] for r in bare],
            "ratio": ratio([(a["per_s"], b["per_s"]) for a, b in zip(served, bare, strict=True)]),
        }

        import torch

        class Local(torch.utils.data.Dataset):
            def __len__(self) -> int:
                return len(jpegs)

            def __getitem__(self, i: int) -> Any:
                return torch.from_numpy(pillow_decode(jpegs[i]).copy())  # writable, as a Dataset returns

        def local_loader() -> dict[str, float]:
            c0 = time.process_time()
            n = 0
            for b in torch.utils.data.DataLoader(Local(), batch_size=32, num_workers=0):
                n += len(b)
            return {"cpu_per_1000": (time.process_time() - c0) / n * 1000}

        def fleet_loader() -> dict[str, float]:
            r = served_images()
            return {"cpu_per_1000": r["client_cpu"] / r["n"] * 1000}

        log("3. trainer CPU per 1,000 images: fleet-decoded vs local DataLoader decoding")
        fleet, local = alternate(fleet_loader, local_loader, args.pairs)
        results["trainer_cpu"] = {
            "fleet_cpu_s_per_1000": [r["cpu_per_1000"] for r in fleet],
            "local_cpu_s_per_1000": [r["cpu_per_1000"] for r in local],
            "ratio": ratio(
                [(a["cpu_per_1000"], b["cpu_per_1000"]) for a, b in zip(fleet, local, strict=True)]
            ),
        }
    finally:
        server.stop()
    return results


def print_report(results: dict[str, Any]) -> None:
    for key, label in (
        ("image_decode", "throughput_ratio"),
        ("image_decode", "per_server_cpu_s_ratio"),
        ("token_pack", "ratio"),
        ("trainer_cpu", "ratio"),
    ):
        r = results[key][label]
        print(f"{key:14s} {label:24s} {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.transform_bench", __doc__, whole_doc=True)
    ap.add_argument("--images", type=int, default=600, help="JPEGs per pass (default 600)")
    ap.add_argument("--docs", type=int, default=20_000, help="documents per packing pass (default 20000)")
    ap.add_argument("--pairs", type=int, default=3, help="A/B pairs after the warm-up (default 3)")
    return bench_main(ap, argv, run, json_default=results_path("transform_bench"), report=print_report)


if __name__ == "__main__":
    raise SystemExit(main())
