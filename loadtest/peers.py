"""The small-sample comparison of `make bench`: the fleet vs torchdata's StatefulDataLoader, same rows.

Both read the rows of one generated dataset (`id` int64 + `vec` 64 x float32 = 264 B per row):

    shardstream  one `shardstream serve` subprocess -> `Loader(batch_size=32, output="torch")` here
    torchdata    `StatefulDataLoader(map-style dataset, batch_size=32, num_workers=0)` here, over
                 the same rows copied once into two memmapped .npy files (`id`, `vec`); the
                 dataset's `__getitem__` returns one row as numpy, default_collate makes tensors

Both hand the loop a dict of torch tensors per batch of 32, in stored order (shuffle none /
SequentialSampler) or shuffled (block shuffle / RandomSampler). Each pass is one whole epoch; the
loop only counts rows.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from shardstream.client import Loader
from shardstream.registry import Registry

__all__ = ["MemmapRows", "fleet_pass", "peer_pass", "write_memmap"]


def write_memmap(root: str, dataset: str, out_dir: Path) -> tuple[Path, Path]:
    """The dataset's `id` and `vec` columns as .npy files (read back with mmap_mode='r')."""
    with Registry(root) as registry:
        m = registry.resolve(dataset)
        paths = [registry.shard_path(m, s.uri) for s in m.shards]
    out_dir.mkdir(parents=True, exist_ok=True)
    ids_path, vec_path = out_dir / "id.npy", out_dir / "vec.npy"
    dim = m.schema.field("vec").type.list_size
    ids = np.lib.format.open_memmap(ids_path, mode="w+", dtype=np.int64, shape=(m.num_rows,))
    vec = np.lib.format.open_memmap(vec_path, mode="w+", dtype=np.float32, shape=(m.num_rows, dim))
    row = 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65536):
            n = batch.num_rows
            ids[row : row + n] = batch.column("id").to_numpy()
            vec[row : row + n] = batch.column("vec").values.to_numpy().reshape(n, dim)
            row += n
    ids.flush()
    vec.flush()
    del ids, vec
    return ids_path, vec_path


class MemmapRows:
    """A map-style dataset over memmapped arrays: row i as a dict of numpy values."""

    def __init__(self, ids_path: Path, vec_path: Path) -> None:
        # Copy-on-write maps: writable views (torch warns on read-only ones), nothing ever written.
        self.ids = np.load(ids_path, mmap_mode="c")
        self.vec = np.load(vec_path, mmap_mode="c")

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"id": self.ids[i], "vec": self.vec[i]}


def _timed(batches: Any) -> dict[str, Any]:
    n = rows = 0
    first = float("nan")
    t0 = time.perf_counter()
    for batch in batches:
        if n == 0:
            first = time.perf_counter() - t0
        n += 1
        rows += len(batch["id"])
    wall = time.perf_counter() - t0
    return {"batches": n, "rows": rows, "wall_s": wall, "first_batch_s": first, "samples_per_s": rows / wall}


def fleet_pass(target: str, dataset: str, batch_size: int, shuffle: bool) -> dict[str, Any]:
    with Loader(
        [target], dataset, batch_size=batch_size, shuffle="block" if shuffle else "none", output="torch"
    ) as loader:
        return _timed(loader)


def peer_pass(ds: MemmapRows, batch_size: int, shuffle: bool) -> dict[str, Any]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return _timed(StatefulDataLoader(ds, batch_size=batch_size, shuffle=shuffle, num_workers=0))
