"""The `shardstream` command line: one module per command group, each parser beside its handler.

    common.py               global options, argument types, opening a registry, help with examples, tables
    ingest_command.py       ingest
    serve.py                serve
    datasets.py             datasets list|show|history|diff|tag|verify, and register
    datasets_gc.py          datasets gc
    materialize_command.py  materialize
    inspect_command.py      inspect
    explain_command.py      explain
    cursor_command.py       cursor list|show|migrate
    checkpoint_command.py   checkpoint list|show|verify|pull|gc
    checkpoint_pull.py      checkpoint pull: a commit as a plain torch.distributed.checkpoint directory
    ping_command.py         ping (what answers at HOST:PORT)
    fleet_command.py        fleet recommend (servers for the trainers' stall)
    demo_command.py         demo
    dev_command.py          dev (ingest a folder, serve it, the web viewer)
    visualize.py            view (terminal UI) and web (browser UI), over shardstream.viz

This package is an entry point (DESIGN §2): with `shardstream.demo`, `shardstream.viz` and
`shardstream.engines`, the only code that imports the client and the server. Handlers import their
side when they run, so a client-only install runs the client-side commands; a command that needs
the server extra says so in one line.

Global options (`--root`, `--s3-endpoint`, `--store`, `--json`, `-q`) are accepted before or after
the command; given at both places, the one after the command wins.

Exit codes: 0 success, 1 a shardstream error (the message says what to fix) or a missing server
extra, 2 bad usage, 130 interrupted, 141 the output pipe was closed (`| head`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shardstream import __version__, kernels
from shardstream.errors import ShardstreamError

from . import (
    checkpoint_command,
    common,
    cursor_command,
    datasets,
    demo_command,
    dev_command,
    explain_command,
    fleet_command,
    ingest_command,
    inspect_command,
    materialize_command,
    ping_command,
    serve,
    visualize,
)

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardstream",
        description="Serve datasets to training jobs: Arrow batches over gRPC, exact resume across ranks and restarts.",
        epilog=common.examples(
            "shardstream ingest data.jsonl --name toy --root ./datasets",
            "shardstream serve --root ./datasets --port 7070",
            "shardstream --root ./datasets datasets list",
            "shardstream datasets show toy@1 --root ./datasets",
            "shardstream inspect toy@1 --world-size 8 --rank 3 --step 12 --root ./datasets",
            "shardstream cursor show my-job --store sqlite:///.shardstream/cursors.db",
            "shardstream demo",
            before="Run `shardstream COMMAND --help` for a command's options. Environment: SHARDSTREAM_ROOT sets "
            "the default --root, SHARDSTREAM_CURSOR_STORE the default --store.",
        ),
        formatter_class=common.HelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"shardstream {__version__} ({kernels.describe()})")
    common.add_global_options(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    ingest_command.add_commands(sub)
    serve.add_commands(sub)
    datasets.add_commands(sub)
    materialize_command.add_commands(sub)
    inspect_command.add_commands(sub)
    explain_command.add_commands(sub)
    cursor_command.add_commands(sub)
    checkpoint_command.add_commands(sub)
    ping_command.add_commands(sub)
    fleet_command.add_commands(sub)
    visualize.add_commands(sub)
    demo_command.add_commands(sub)
    dev_command.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        common.apply_global_options(parser, args)
        code = int(args.fn(args))
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return code
    except BrokenPipeError:
        return common.closed_pipe()
    except ModuleNotFoundError as exc:
        if not common.needs_server_extra(exc):
            raise
        print(common.SERVER_EXTRA_HINT, file=sys.stderr)
        return common.EXIT_ERROR
    except ShardstreamError as exc:
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return common.EXIT_ERROR
    except KeyboardInterrupt:
        print("shardstream: interrupted", file=sys.stderr)
        return common.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
