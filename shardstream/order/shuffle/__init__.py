"""Shuffle modes: pure functions from (block sizes, key, spec) to an epoch's order. No I/O.

Each mode lives in its own module and is selected by name through `SHUFFLES` and one dispatcher,
`get_order`. An order maps global positions in [0, N) to dataset row indices and is a bijection.
"Blocks" are the dataset's non-empty row groups in storage order — the unit one storage read fetches.

    none   position p is row p
    full   a keyed pseudo-random permutation of all N rows: the best mixing, no read locality
    block  blocks are permuted (across all shards), then samples are permuted within each window of
           `window` consecutive blocks of that order: a batch touches at most ~window row groups, and
           `window` is the one knob between locality (small) and shuffle quality (large)

Every mode derives its randomness from the key alone (see permutation.derive_key), so the order is
the same in every process; the key is made from (fingerprint, seed, epoch, spec) by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.errors import InvalidArgumentError
from shardstream.limits import MAX_SHUFFLE_WINDOW, check_int

from .block import block_order
from .full import full_order
from .none import none_order

__all__ = ["DEFAULT_MODE", "DEFAULT_WINDOW", "SHUFFLES", "Order", "ShuffleSpec", "get_order"]

Order = Callable[[np.ndarray], np.ndarray]

# name -> factory(block_sizes, key, window) -> order
SHUFFLES: dict[str, Callable[[np.ndarray, bytes, int], Order]] = {
    "none": none_order,
    "full": full_order,
    "block": block_order,
}
DEFAULT_MODE = "block"
DEFAULT_WINDOW = 16  # blocks (row groups) mixed together


@dataclass(frozen=True)
class ShuffleSpec:
    """A shuffle mode and its parameter; `window` only matters for "block"."""

    mode: str = DEFAULT_MODE
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if self.mode not in SHUFFLES:
            raise InvalidArgumentError(
                f"unknown shuffle mode {self.mode!r}; known: {', '.join(sorted(SHUFFLES))}"
            )
        check_int("shuffle window", self.window, 1, MAX_SHUFFLE_WINDOW, "blocks")

    @classmethod
    def parse(cls, shuffle: Any, window: int | None = None) -> ShuffleSpec:
        """`True` -> the default mode, `False`/None -> "none", a name, a dict, or a ShuffleSpec."""
        if isinstance(shuffle, ShuffleSpec):
            return shuffle if window is None else cls(shuffle.mode, window)
        if isinstance(shuffle, Mapping):
            extra = set(shuffle) - {"mode", "window"}
            if extra:
                raise InvalidArgumentError(f"unknown shuffle option(s) {sorted(extra)}; known: mode, window")
            return cls(shuffle.get("mode", DEFAULT_MODE), shuffle.get("window", window or DEFAULT_WINDOW))
        if shuffle is True:
            mode = DEFAULT_MODE
        elif shuffle is False or shuffle is None:
            mode = "none"
        elif isinstance(shuffle, str):
            mode = shuffle
        else:
            raise InvalidArgumentError(f"shuffle must be a bool, a mode name or a dict, got {shuffle!r}")
        return cls(mode, DEFAULT_WINDOW if window is None else window)

    @property
    def key_parts(self) -> tuple[object, ...]:
        """What the order depends on besides fingerprint, seed and epoch."""
        return (self.mode, self.window) if self.mode == "block" else (self.mode,)

    def __str__(self) -> str:
        return f"block(window={self.window})" if self.mode == "block" else self.mode


def get_order(spec: ShuffleSpec, block_sizes: np.ndarray, key: bytes) -> Order:
    return SHUFFLES[spec.mode](np.asarray(block_sizes, dtype=np.int64), key, spec.window)
