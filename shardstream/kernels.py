"""Which implementation of the data plane's hot loops runs: C (shardstream/_kernels.c) or numpy.

The loops that cost the most CPU per shuffled message and are pure arithmetic or copies have a C
twin, built by the ordinary install when a C compiler is there (pyproject.toml, `ext-modules`,
optional):

    feistel_walk   the keyed permutation of every shuffled position (order/permutation.py)
    gather_rows    the copy of a shuffled message's fixed-width rows (server/read/gather.py)
    locate_rows    each row's row group, shard and place in both (order/read_order.py)
    unique_groups  a message's row groups and each row's index among them (server/read/reader.py)

Each caller keeps its numpy version, which gives the same result bit for bit
(tests/test_kernels.py) and runs where the module was not built or SHARDSTREAM_NATIVE=0 is set.
Callers read `native` at call time, so a test can switch it off.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["describe", "native"]


def _load() -> tuple[ModuleType | None, str]:
    """The C module, or None and why not."""
    if os.environ.get("SHARDSTREAM_NATIVE", "1") == "0":
        return None, "SHARDSTREAM_NATIVE=0"
    try:
        from shardstream import _kernels
    except ImportError:
        return None, "shardstream._kernels not built: no C compiler at install"
    return _kernels, ""


native: ModuleType | None
native, _why_not = _load()


def describe() -> str:
    """One phrase for --version and the server's start line."""
    if native is not None:
        return "native kernels"
    return f"numpy kernels ({_why_not or 'switched off in this process'})"
