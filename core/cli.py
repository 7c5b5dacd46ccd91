"""The `shardstream` command line. Subcommands import their side (server or client) lazily, so a
client-only install can still run the client-side commands.

Exit codes: 0 success, 1 a shardstream error (the message says what to fix), 2 bad usage,
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shardstream import __version__
from shardstream.errors import ShardstreamError
from shardstream.registry_cli import add_registry_commands

if TYPE_CHECKING:
    from shardstream.registry import Registry

__all__ = ["main"]

DEFAULT_ROOT = os.environ.get("SHARDSTREAM_ROOT", "./datasets")


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"port must be in [0, 65535], got {value}")
    return value


# --- commands ----------------------------------------------------------------------------------
def _cmd_ingest(args: argparse.Namespace) -> int:
    from shardstream.server.ingest import IngestOptions, ingest

    opts = IngestOptions(
        row_group_bytes=args.row_group_mib << 20,
        row_group_rows=args.row_group_rows,
        shard_bytes=args.shard_mib << 20,
        shard_rows=args.shard_rows,
        progress=False if args.quiet else None,
    )
    from shardstream.registry import Registry

    with Registry(args.root, s3_endpoint=args.s3_endpoint) as reg:
        m = ingest(args.src, args.name, reg, opts)
    print(f"{m.ref}", flush=True)
    if not args.quiet:
        print(
            f"  {m.num_rows} rows in {len(m.shards)} shard(s), {_human_bytes(m.num_bytes)}, "
            f"fingerprint {m.fingerprint[:16]}",
            file=sys.stderr,
        )
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from shardstream.server.app import ServerConfig, run

    run(
        ServerConfig(
            root=args.root,
            port=args.port,
            host=args.host,
            metrics_port=args.metrics_port,
            cache_bytes=args.cache_mib << 20,
            grace_s=args.grace,
            ready_file=args.ready_file,
            s3_endpoint=args.s3_endpoint,
        )
    )
    return 0


def _cmd_datasets_list(args: argparse.Namespace) -> int:
    from shardstream.registry import Registry

    with Registry(args.root, s3_endpoint=args.s3_endpoint) as reg:
        return _print_datasets(args, reg)


def _print_datasets(args: argparse.Namespace, reg: Registry) -> int:
    manifests = [reg.resolve(name) for name in reg.names()]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": m.name,
                        "latest": m.version,
                        "versions": reg.versions(m.name),
                        "rows": m.num_rows,
                        "shards": len(m.shards),
                        "bytes": m.num_bytes,
                        "fingerprint": m.fingerprint,
                    }
                    for m in manifests
                ],
                indent=1,
            )
        )
        return 0
    if not manifests:
        print(f"no datasets under {reg.root}", file=sys.stderr)
        return 0
    rows = [("NAME", "LATEST", "VERSIONS", "ROWS", "SHARDS", "SIZE", "CREATED")]
    for m in manifests:
        rows.append(
            (
                m.name,
                str(m.version),
                str(len(reg.versions(m.name))),
                str(m.num_rows),
                str(len(m.shards)),
                _human_bytes(m.num_bytes),
                m.created_at,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _cmd_datasets_show(args: argparse.Namespace) -> int:
    from shardstream.registry import Registry

    with Registry(args.root, s3_endpoint=args.s3_endpoint) as reg:
        m = reg.resolve(args.dataset)
    if args.json:
        print(json.dumps(m.to_json(), indent=1, sort_keys=True))
        return 0
    print(f"{m.ref}")
    print(f"  fingerprint  {m.fingerprint}")
    print(f"  parent       {m.parent if m.parent is not None else '-'} ({m.change})")
    print(f"  created      {m.created_at}")
    print(f"  rows         {m.num_rows}")
    print(f"  size         {_human_bytes(m.num_bytes)} in {len(m.shards)} shard(s)")
    if m.metadata:
        print(f"  metadata     {json.dumps(dict(m.metadata), sort_keys=True)}")
    print("  fields")
    for name, typ in m.fields:
        print(f"    {name}: {typ}")
    print("  shards")
    limit = None if args.all_shards else 10
    for s in m.shards[:limit]:
        print(
            f"    {s.uri}  rows={s.rows}  row_groups={len(s.row_groups)}  {_human_bytes(s.bytes)}  sha256={s.sha256[:16]}"
        )
    if limit is not None and len(m.shards) > limit:
        print(f"    … {len(m.shards) - limit} more (--all-shards)")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from shardstream.demo import run_demo

    return run_demo(rows=args.rows, workdir=args.workdir, keep=args.keep)


# --- parser ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardstream",
        description="Serve datasets to training jobs: Arrow batches over gRPC, exact resume across ranks and restarts.",
        epilog="Run `shardstream COMMAND --help` for a command's options. Environment: SHARDSTREAM_ROOT sets the "
        "default --root.",
    )
    p.add_argument("--version", action="version", version=f"shardstream {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def root_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--root",
            default=DEFAULT_ROOT,
            help=f"dataset registry: a local directory or s3://BUCKET/PREFIX (default: $SHARDSTREAM_ROOT or "
            f"{DEFAULT_ROOT!r})",
        )
        sp.add_argument(
            "--s3-endpoint",
            default=None,
            help="S3 endpoint URL for s3:// roots (default: $AWS_ENDPOINT_URL, else AWS); credentials come "
            "from the standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, …)",
        )

    sp = sub.add_parser(
        "ingest",
        help="write JSON Lines or Parquet as a new dataset version",
        description="Read JSON Lines (.jsonl/.ndjson/.json) or Parquet (.parquet) — a file or a "
        "directory of them — and write Parquet shards plus a new immutable version of NAME. "
        "Prints NAME@VERSION. Nothing is registered if any input is bad.",
    )
    sp.add_argument("src", help="input file or directory")
    sp.add_argument("--name", required=True, help="dataset name (letters, digits, '.', '_', '-')")
    root_arg(sp)
    sp.add_argument(
        "--row-group-mib",
        type=_positive_int,
        default=4,
        help="target row-group size, uncompressed (default 4)",
    )
    sp.add_argument(
        "--row-group-rows", type=_positive_int, help="fixed rows per row group (overrides --row-group-mib)"
    )
    sp.add_argument(
        "--shard-mib", type=_positive_int, default=256, help="target shard size, uncompressed (default 256)"
    )
    sp.add_argument("--shard-rows", type=_positive_int, help="fixed rows per shard (overrides --shard-mib)")
    sp.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar or summary; print only NAME@VERSION"
    )
    sp.set_defaults(fn=_cmd_ingest)

    sp = sub.add_parser(
        "serve",
        help="run a shard-reader server",
        description="Serve the datasets under --root over gRPC (ShardStream, grpc.health.v1, "
        "reflection) until SIGTERM/SIGINT, then drain: health goes NOT_SERVING and in-flight "
        "streams get --grace seconds to finish.",
    )
    root_arg(sp)
    sp.add_argument("--port", type=_port, default=7070, help="gRPC port (default 7070; 0 picks a free one)")
    sp.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)"
    )
    sp.add_argument("--metrics-port", type=_port, help="serve Prometheus /metrics on this port (0 picks one)")
    sp.add_argument(
        "--cache-mib", type=_positive_int, default=1024, help="row-group cache size (default 1024)"
    )
    sp.add_argument(
        "--grace", type=float, default=10.0, help="seconds in-flight streams get on shutdown (default 10)"
    )
    sp.add_argument("--ready-file", help="write {port, metrics_port, pid} as JSON here once serving")
    sp.set_defaults(fn=_cmd_serve)

    ds = sub.add_parser(
        "datasets",
        help="list, show, verify, tag and trace registered datasets",
        description="Inspect and maintain the registry under --root.",
    )
    dsub = ds.add_subparsers(dest="datasets_command", metavar="SUBCOMMAND", required=True)
    sp = dsub.add_parser("list", help="every dataset with its latest version")
    root_arg(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(fn=_cmd_datasets_list)
    sp = dsub.add_parser("show", help="one version: fingerprint, lineage, fields, shards")
    sp.add_argument("dataset", help="NAME (latest), NAME@VERSION or NAME@TAG")
    root_arg(sp)
    sp.add_argument("--json", action="store_true", help="print the manifest as JSON")
    sp.add_argument("--all-shards", action="store_true", help="list every shard, not the first 10")
    sp.set_defaults(fn=_cmd_datasets_show)
    add_registry_commands(sub, dsub, root_arg)

    sp = sub.add_parser(
        "demo",
        help="end-to-end demo: ingest, 2 servers, 2 ranks train, resume on 3 ranks",
        description="Make a small dataset, start two servers, train a tiny torch model on two "
        "ranks, stop them mid-epoch, resume on three ranks with another batch size, and check "
        "that every sample was seen exactly once. Needs torch.",
    )
    sp.add_argument(
        "--rows", type=_positive_int, default=20_000, help="samples in the demo dataset (default 20000)"
    )
    sp.add_argument("--workdir", help="directory for data and logs (default: a temporary one)")
    sp.add_argument("--keep", action="store_true", help="keep the work directory")
    sp.set_defaults(fn=_cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except ShardstreamError as exc:
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("shardstream: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
