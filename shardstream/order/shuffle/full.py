"""Shuffle mode "full": one keyed pseudo-random permutation of all N rows, O(1) per lookup."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardstream.order.permutation import KeyedPermutation


def full_order(block_sizes: np.ndarray, key: bytes, window: int) -> Callable[[np.ndarray], np.ndarray]:
    del window
    return KeyedPermutation(int(block_sizes.sum()), key)
