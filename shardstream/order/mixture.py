"""Weighted mixtures of dataset versions (DESIGN §4): a pure, seeded, block-stratified schedule.

    {"web@3": 0.7, "code@1": 0.2, "math@2": 0.1}      or      "web@3:0.7,code@1:0.2,math@2:0.1"

The mixture is one endless stream of positions g = epoch·L + p (L samples per mixture epoch,
default: the sources' total rows). The stream is cut into blocks of S samples (default 1000);
every block holds exactly `alloc[s]` samples of source s (the weights' largest-remainder
allocation of S), at slots chosen by a keyed permutation of the block — so the proportions are
exact over every block, not just on average. Source s's k-th sample of the stream (k counted in
stream order, so k = block·alloc[s] + the number of its earlier samples in the block) is sample
k mod N_s of the source's epoch k div N_s. Each source therefore runs its own epochs — a small source repeats, each
repetition in the fresh order of its next epoch — and position -> (source, source epoch, source
position) is O(1). The mixture's fingerprint covers the sources' fingerprints, weights, S and L, so
a state made on one mixture is refused on another.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from shardstream.errors import InvalidArgumentError
from shardstream.manifest import DatasetRef
from shardstream.order.permutation import KeyedPermutation, derive_key
from shardstream.order.read_order import DatasetOrder

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MixtureOrder",
    "MixturePlan",
    "SourceInfo",
    "allocate",
    "is_mixture",
    "parse_mixture",
]

DEFAULT_BLOCK_SIZE = 1000


def is_mixture(dataset: object) -> bool:
    return isinstance(dataset, Mapping) or (isinstance(dataset, str) and (":" in dataset or "," in dataset))


def parse_mixture(spec: str | Mapping[str, object] | Sequence[tuple[str, object]]) -> list[tuple[str, float]]:
    """[(dataset ref, weight)] from a dict, pairs or 'a@1:0.7,b@2:0.3'; one clear error per mistake."""
    if isinstance(spec, str):
        items: list[tuple[str, object]] = []
        for part in spec.split(","):
            ref, sep, weight = part.strip().rpartition(":")
            if not sep or not ref:
                raise InvalidArgumentError(f"mixture entry {part.strip()!r} is not 'NAME[@VERSION]:WEIGHT'")
            try:
                items.append((ref.strip(), float(weight)))
            except ValueError:
                raise InvalidArgumentError(f"mixture weight {weight!r} of {ref!r} is not a number") from None
    elif isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, Sequence) and all(isinstance(p, tuple) and len(p) == 2 for p in spec):
        items = list(spec)
    else:
        raise InvalidArgumentError(
            f"a mixture is a dict {{dataset: weight}} or a string, got {type(spec).__name__}"
        )
    if not items:
        raise InvalidArgumentError("a mixture needs at least one dataset")
    out: list[tuple[str, float]] = []
    for ref, weight in items:
        if not isinstance(ref, str):
            raise InvalidArgumentError(f"mixture keys are dataset names, got {ref!r}")
        DatasetRef.parse(ref)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise InvalidArgumentError(f"mixture weight of {ref!r} must be a number, got {weight!r}")
        if not math.isfinite(weight) or weight <= 0:
            raise InvalidArgumentError(
                f"mixture weight of {ref!r} must be a finite number > 0, got {weight!r}"
            )
        out.append((ref, float(weight)))
    refs = [r for r, _ in out]
    if len(set(refs)) != len(refs):
        raise InvalidArgumentError(f"a dataset appears twice in the mixture: {refs}")
    return out


def allocate(weights: Sequence[float], block_size: int) -> np.ndarray:
    """Samples per block for each weight: largest remainder, ties to the earlier source."""
    w = np.asarray(weights, dtype=np.float64)
    if block_size < len(w):
        raise InvalidArgumentError(f"mixture block size {block_size} is smaller than the {len(w)} sources")
    quota = w / w.sum() * block_size
    alloc = np.floor(quota).astype(np.int64)
    short = block_size - int(alloc.sum())
    order = sorted(range(len(w)), key=lambda i: (-(quota[i] - alloc[i]), i))
    for i in order[:short]:
        alloc[i] += 1
    return alloc


@dataclass(frozen=True)
class SourceInfo:
    ref: str  # name@version, pinned
    fingerprint: str
    num_rows: int
    weight: float


class MixturePlan:
    """Stream position -> (source, source epoch, source position) for one mixture."""

    def __init__(
        self,
        sources: Sequence[SourceInfo],
        seed: int,
        block_size: int = 0,
        epoch_samples: int = 0,
    ) -> None:
        self.sources = list(sources)
        self.block_size = block_size or DEFAULT_BLOCK_SIZE
        for s in self.sources:
            if s.num_rows <= 0:
                raise InvalidArgumentError(f"mixture source {s.ref} has no rows")
        self.alloc = allocate([s.weight for s in self.sources], self.block_size)
        starved = [s.ref for s, a in zip(self.sources, self.alloc, strict=True) if a == 0]
        if starved:
            raise InvalidArgumentError(
                f"weight too small to appear in a block of {self.block_size} samples: {', '.join(starved)}"
            )
        self._prefix = np.concatenate([[0], np.cumsum(self.alloc)]).astype(np.int64)
        self.epoch_samples = epoch_samples or sum(s.num_rows for s in self.sources)
        self.seed = seed
        self._rows = np.asarray([s.num_rows for s in self.sources], dtype=np.int64)
        canonical = json.dumps(
            {
                "sources": [[s.fingerprint, repr(s.weight)] for s in self.sources],
                "block": self.block_size,
                "epoch_samples": self.epoch_samples,
            },
            sort_keys=True,
        )
        self.fingerprint = hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def label(self) -> str:
        return ",".join(f"{s.ref}:{s.weight:g}" for s in self.sources)

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """For each index of schedule block b: its source, and how many earlier indexes share it."""
        key = derive_key("shardstream.order.mixture.v1", self.fingerprint, self.seed, b)
        slot = KeyedPermutation(self.block_size, key)(np.arange(self.block_size, dtype=np.int64))
        src = np.searchsorted(self._prefix, slot, side="right") - 1
        by_source = np.argsort(src, kind="stable")  # grouped by source, position order inside
        rank = np.empty_like(src)
        rank[by_source] = np.arange(self.block_size) - self._prefix[src[by_source]]
        return src, rank

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source index, source epoch, source position) for positions of mixture epoch `epoch`."""
        p = np.asarray(positions, dtype=np.int64)
        g = np.int64(epoch) * np.int64(self.epoch_samples) + p
        block, inner = np.divmod(g, self.block_size)
        src = np.empty_like(inner)
        rank = np.empty_like(inner)
        for (b,), sel in _by_keys(block):
            block_src, block_rank = self._block(b)
            src[sel] = block_src[inner[sel]]
            rank[sel] = block_rank[inner[sel]]
        count = block * self.alloc[src] + rank
        source_epoch, source_pos = np.divmod(count, self._rows[src])
        return src, source_epoch, source_pos

    def taken_before(self, position: int) -> np.ndarray:
        """How many samples of each source the stream holds before stream position `position`."""
        block, inner = divmod(position, self.block_size)
        out = block * self.alloc
        if inner:
            src, _ = self._block(block)
            out = out + np.bincount(src[:inner], minlength=len(self.sources))
        return out

    def position_of(self, source: int, count: int) -> int:
        """The stream position of source `source`'s `count`-th sample (counted from 0 over the whole
        stream: its source epoch is count div its rows) — `locate` inverted, one block's cost."""
        block, k = divmod(count, int(self.alloc[source]))
        src, rank = self._block(block)
        (hit,) = np.flatnonzero((src == source) & (rank == k))
        return block * self.block_size + int(hit)


class MixtureOrder:
    """Mixture positions -> (source index, row index in that source), through each source's orders."""

    def __init__(self, plan: MixturePlan, orders: Sequence[DatasetOrder]) -> None:
        if len(orders) != len(plan.sources):
            raise ValueError("one DatasetOrder per mixture source")
        self.plan = plan
        self.orders = list(orders)
        self.num_rows = plan.epoch_samples

    def select(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        src, source_epoch, source_pos = self.plan.locate(epoch, positions)
        rows = np.empty_like(source_pos)
        for (s, e), sel in _by_keys(src, source_epoch):
            rows[sel] = self.orders[s].rows(e, source_pos[sel])
        return src.astype(np.int32), rows


def _by_keys(*keys: np.ndarray) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """(keys, the indexes holding them, in order) for each distinct tuple of `keys` (arrays of one
    length), in key order: one sort, not a pass over every index per key (a message of small
    mixture blocks spans thousands of blocks)."""
    n = len(keys[0])
    if not n:
        return []
    order = np.lexsort(keys[::-1])  # (stable: indexes in order within a key)
    ordered = [k[order] for k in keys]
    change = np.zeros(n, bool)
    change[0] = True
    for k in ordered:
        change[1:] |= k[1:] != k[:-1]
    starts = np.flatnonzero(change).tolist()
    ends = [*starts[1:], n]
    return [(tuple(int(k[a]) for k in ordered), order[a:b]) for a, b in zip(starts, ends, strict=True)]
