"""Single-byte flips in files, and reading a whole dataset through a real server to judge each one.

A flip's outcome is one of: the dataset read back byte-identical to its source (the byte was not
one anything decodes), DATA_LOSS naming the version, the shard and the row group (or the footer,
which describes every row group), or a *silent* mismatch — the one outcome that must never happen.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from shardstream.client import Loader
from shardstream.errors import DataLossError

__all__ = ["FlipTally", "flip_byte", "random_table", "read_dataset"]


def random_table(n_rows: int, payload_bytes: int, seed: int = 0) -> pa.Table:
    """id (0..n), value (float64) and an incompressible payload: a file about as big as its data."""
    rng = np.random.default_rng(seed)
    blob = rng.bytes(n_rows * payload_bytes)
    offsets = pa.array(np.arange(0, (n_rows + 1) * payload_bytes, payload_bytes, dtype=np.int32))
    payload = pa.Array.from_buffers(pa.binary(), n_rows, [None, offsets.buffers()[1], pa.py_buffer(blob)])
    return pa.table(
        {"id": np.arange(n_rows, dtype=np.int64), "value": rng.random(n_rows), "payload": payload}
    )


def flip_byte(path: Path, pos: int, mask: int) -> int:
    """XOR the byte at `pos` of `path` with `mask` in place; returns the original byte (flip back with
    the same call)."""
    with path.open("r+b") as f:
        f.seek(pos)
        old = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([old ^ mask]))
    return old


def read_dataset(target: str, dataset: str, *, columns: list[str] | None = None) -> pa.Table | DataLossError:
    """Every row of `dataset` in order through a Loader, or the DataLossError that ended the read."""
    try:
        with Loader(
            [target], dataset, batch_size=4096, shuffle=False, output="arrow", columns=columns, timeout_s=120
        ) as ld:
            batches = list(ld)
    except DataLossError as exc:
        return exc
    return pa.Table.from_batches(batches)


@dataclass
class FlipTally:
    """Outcomes of flips against `source` for shard `uri` of `ref`; `silent` lists the positions
    whose read differed from the source without an error."""

    source: pa.Table
    ref: str
    uri: str
    counts: Counter[str] = field(default_factory=Counter)
    silent: list[int] = field(default_factory=list)
    unnamed: list[str] = field(default_factory=list)

    def add(self, pos: int, got: pa.Table | DataLossError) -> None:
        if isinstance(got, DataLossError):
            where = rf"{re.escape(self.ref)}: shard {re.escape(self.uri)}: (row group \d+|footer)"
            if re.search(where, str(got)):
                self.counts["data_loss"] += 1
            else:
                self.unnamed.append(str(got))
        elif got.select(self.source.column_names).equals(self.source):
            self.counts["identical"] += 1
        else:
            self.silent.append(pos)

    def summary(self) -> str:
        return (
            f"{sum(self.counts.values()) + len(self.silent) + len(self.unnamed)} flips: "
            f"{self.counts['data_loss']} DATA_LOSS naming shard and row group, {self.counts['identical']} "
            f"byte-identical, {len(self.silent)} silent mismatches, {len(self.unnamed)} errors not naming both"
        )
