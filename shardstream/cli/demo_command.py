"""`shardstream demo`: the end-to-end demo (`shardstream.demo`), as a command."""

from __future__ import annotations

import argparse
from typing import Any

from . import common

__all__ = ["add_commands"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from shardstream.demo import run_demo

    return run_demo(rows=args.rows, workdir=args.workdir, keep=args.keep)


def add_commands(sub: Any) -> None:
    sp = common.add_command(
        sub,
        "demo",
        _cmd_demo,
        help="end-to-end demo: ingest, 2 servers, 2 ranks train, resume on 3 ranks",
        description="Make a small dataset, start two servers, train a tiny torch model on two "
        "ranks, stop them mid-epoch, resume on three ranks with another batch size, and check "
        "that every sample was seen exactly once. Needs torch and the server extra.",
        epilog=common.examples(
            "shardstream demo",
            "shardstream demo --rows 5000 --workdir ./demo --keep",
        ),
    )
    sp.add_argument(
        "--rows", type=common.positive_int, default=20_000, help="samples in the demo dataset (default 20000)"
    )
    sp.add_argument("--workdir", help="directory for data and logs (default: a temporary one)")
    sp.add_argument("--keep", action="store_true", help="keep the work directory")
