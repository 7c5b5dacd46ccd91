"""Keyed pseudo-random permutations of [0, n) in O(1) memory (pure, no I/O).

A balanced Feistel network over 2k bits (the smallest 4**k >= n) is a bijection on [0, 4**k);
"cycle walking" (apply it again while the result is >= n) restricts it to a bijection on [0, n).
Since 4**k < 4n, each walk step lands inside with probability > 1/4, so a lookup costs a few
rounds on average, whatever n is: position -> index is O(1) time and memory, and an epoch of
10**10 samples needs no array of positions.

Round keys come from blake2b over the caller's key bytes, so the permutation is the same in every
process and on every machine (no Python hash seed, no global RNG state).

The walk runs in C where shardstream._kernels is built (shardstream/kernels.py), ~4x faster than
numpy with the GIL released; `_walk_numpy` is its twin, the same result bit for bit
(tests/test_kernels.py).
"""

from __future__ import annotations

import hashlib

import numpy as np

from shardstream import kernels

__all__ = ["KeyedPermutation", "derive_key"]

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def derive_key(*parts: object) -> bytes:
    """A 32-byte key from printable parts, joined unambiguously."""
    text = "\x1f".join(str(p) for p in parts)
    return hashlib.blake2b(text.encode(), digest_size=32).digest()


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


class KeyedPermutation:
    """A bijection of [0, n) chosen by `key`; `perm(positions)` maps an array at a time."""

    def __init__(self, n: int, key: bytes) -> None:
        if n < 0:
            raise ValueError(f"permutation size must be >= 0, got {n}")
        if n >= 1 << 62:
            raise ValueError(f"permutation size must be < 2**62, got {n}")
        self.n = n
        bits = max(1, (max(n, 2) - 1).bit_length())
        self._half = (bits + 1) // 2
        self._mask = np.uint64((1 << self._half) - 1)
        digest = hashlib.blake2b(key, digest_size=8 * _ROUNDS).digest()
        self._round_keys = [
            np.uint64(int.from_bytes(digest[8 * i : 8 * i + 8], "little")) for i in range(_ROUNDS)
        ]
        self._key_bytes = np.array(self._round_keys, dtype="<u8").tobytes()  # for the C walk

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self._half)
        left = x >> h
        right = x & self._mask
        for rk in self._round_keys:
            left, right = right, left ^ (_mix(right ^ rk) & self._mask)
        return (left << h) | right

    def _decrypt(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self._half)
        left = x >> h
        right = x & self._mask
        for rk in reversed(self._round_keys):
            left, right = right ^ (_mix(left ^ rk) & self._mask), left
        return (left << h) | right

    def _walk(self, positions: np.ndarray, decrypt: bool) -> np.ndarray:
        native = kernels.native
        if native is None:
            return self._walk_numpy(positions, self._decrypt if decrypt else self._encrypt)
        x = np.ascontiguousarray(positions, dtype=np.int64)
        out = np.empty_like(x)
        try:
            native.feistel_walk(x, out, self.n, self._half, self._key_bytes, decrypt)
        except IndexError:
            raise IndexError(f"positions must lie in [0, {self.n})") from None
        return out

    def _walk_numpy(self, positions: np.ndarray, step) -> np.ndarray:  # type: ignore[no-untyped-def]
        x = np.asarray(positions, dtype=np.int64)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"positions must lie in [0, {self.n})")
        n = np.uint64(self.n)
        out = step(x.astype(np.uint64))
        todo = np.nonzero(out >= n)[0]
        while todo.size:
            out[todo] = step(out[todo])
            todo = todo[out[todo] >= n]
        return out.astype(np.int64)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Indices at `positions` of the permuted order."""
        return self._walk(positions, decrypt=False)

    def inverse(self, indices: np.ndarray) -> np.ndarray:
        """Positions at which `indices` appear in the permuted order."""
        return self._walk(indices, decrypt=True)
