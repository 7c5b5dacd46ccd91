"""The `shardstream` command (`python -m shardstream`, and the installed script): the CLI
(shardstream/cli), after what must happen before pyarrow is imported.

A process that serves (`shardstream serve`, and the workers it starts, which inherit its
environment) asks Arrow's jemalloc for transparent huge pages: jemalloc reads its configuration once,
when pyarrow's library loads, which the CLI's first import does (shardstream/allocator.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "serve" in args and "pyarrow" not in sys.modules:  # a dataset named `serve` costs nothing
        from shardstream import allocator
        from shardstream.server.serving.cpus import usable_cpus  # the standard library only: no pyarrow yet

        allocator.arrow_huge_pages(os.environ, usable_cpus())
    from shardstream.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
