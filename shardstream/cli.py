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
from shardstream._table import print_table
from shardstream.cursor_cli import add_cursor_commands
from shardstream.errors import InvalidArgumentError, ShardstreamError
from shardstream.lineage import CLAIMS
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
    from shardstream.server.roots import open_registry

    change = args.change
    if args.append:
        if change not in (None, "append"):
            raise InvalidArgumentError(f"--append is --change append; it contradicts --change {change}")
        change = "append"
    with open_registry(args.root, s3_endpoint=args.s3_endpoint) as reg:
        m = ingest(args.src, args.name, reg, opts, change=change, format=args.format)
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
    from shardstream.server.workers import usable_cpus

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
            workers=args.workers or usable_cpus(),
            # remote roots have latency to hide; local reads are CPU-bound (loadtest/README.md)
            read_ahead=args.read_ahead if args.read_ahead is not None else int(args.root.startswith("s3://")),
            cache_dir=args.cache_dir,
            cache_dir_bytes=args.cache_dir_mib << 20,
            transform_threads=args.transform_threads or usable_cpus(),
        )
    )
    return 0


def _cmd_datasets_list(args: argparse.Namespace) -> int:
    from shardstream.server.roots import open_registry

    with open_registry(args.root, s3_endpoint=args.s3_endpoint) as reg:
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
    print_table(rows)
    return 0


def _cmd_datasets_show(args: argparse.Namespace) -> int:
    from shardstream.server.roots import open_registry

    with open_registry(args.root, s3_endpoint=args.s3_endpoint) as reg:
        m = reg.resolve(args.dataset)
    if args.json:
        print(json.dumps(m.to_json(), indent=1, sort_keys=True))
        return 0
    print(f"{m.ref}")
    print(f"  fingerprint  {m.fingerprint}")
    print(f"  parent       {m.parent if m.parent is not None else '-'} ({m.change})")
    if m.renamed:
        order = {n: i for i, n in enumerate(m.schema.names)}  # stored sorted; shown in field order
        pairs = sorted(m.renamed.items(), key=lambda kv: order.get(kv[1], len(order)))
        print(f"  renamed      {', '.join(f'{o} -> {n}' for o, n in pairs)}")
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


def _cmd_inspect(args: argparse.Namespace) -> int:
    from shardstream.server.roots import open_registry

    with open_registry(args.root, s3_endpoint=args.s3_endpoint) as reg:
        return _inspect(args, reg)


def _inspect(args: argparse.Namespace, reg) -> int:  # type: ignore[no-untyped-def]
    from shardstream.errors import InvalidArgumentError
    from shardstream.inspect import make_selector, shuffle_stats, step_samples
    from shardstream.mixture import is_mixture, parse_mixture
    from shardstream.plan import ShuffleSpec, StepLayout

    if is_mixture(args.dataset):
        pairs = parse_mixture(args.dataset)
        manifests = [reg.resolve(ref) for ref, _ in pairs]
        weights: list[float] | None = [w for _, w in pairs]
    else:
        manifests, weights = [reg.resolve(args.dataset)], None
    spec = ShuffleSpec.parse(args.shuffle, args.window)
    sel = make_selector(
        manifests,
        weights,
        seed=args.seed,
        shuffle=spec,
        mixture_block=args.mixture_block,
        epoch_samples=args.epoch_samples,
    )
    layout = StepLayout(sel.num_rows, args.offset, args.world_size, args.batch_size, args.drop_last)
    what = (
        f"{sel.label} epoch {args.epoch}, seed {args.seed}, shuffle {spec}, world size {args.world_size}, "
        f"batch size {args.batch_size}{', drop_last' if args.drop_last else ''}"
        f"{f', from offset {args.offset}' if args.offset else ''}"
    )
    if args.stats:
        stats = shuffle_stats(sel, layout, args.epoch)
        if args.json:
            print(json.dumps({"config": what, **stats}, indent=1))
            return 0
        print(what)
        for key, value in stats.items():
            print(f"  {key:28s} {value:.4f}" if isinstance(value, float) else f"  {key:28s} {value}")
        return 0
    if not 0 <= args.rank < args.world_size:
        raise InvalidArgumentError(f"--rank must be in [0, {args.world_size}), got {args.rank}")
    if not 0 <= args.step < layout.num_steps:
        raise InvalidArgumentError(
            f"--step {args.step} is outside the epoch's {layout.num_steps} steps (0..{layout.num_steps - 1})"
        )
    smp = step_samples(sel, layout, args.epoch, args.step, args.rank)
    columns = _inspect_columns(args, reg, manifests, smp)
    records = []
    for i in range(len(smp.positions)):
        rec = {
            "position": int(smp.positions[i]),
            "source": manifests[int(smp.sources[i])].ref,
            "shard": manifests[int(smp.sources[i])].shards[int(smp.shards[i])].uri,
            "row": int(smp.shard_rows[i]),
            "row_group": int(smp.row_groups[i]),
        }
        rec.update({name: values[i] for name, values in columns.items()})
        records.append(rec)
    header = {
        "config": what,
        "step": args.step,
        "steps_in_epoch": layout.num_steps,
        "rank": args.rank,
        "global_positions": list(smp.global_range),
        "rank_positions": [
            int(smp.positions[0]) if len(smp.positions) else None,
            int(smp.positions[-1]) + 1 if len(smp.positions) else None,
        ],
    }
    if args.json:
        print(json.dumps({**header, "samples": records}, indent=1, default=str))
        return 0
    print(what)
    print(
        f"step {args.step} of {layout.num_steps}: global positions [{smp.global_range[0]}, {smp.global_range[1]}); "
        f"rank {args.rank} gets {len(records)} sample(s)"
    )
    if not records:
        return 0
    keys = [k for k in records[0] if k != "source" or sel.is_mixture]
    table = [keys] + [[_short(r[k], from_left=k == "shard") for k in keys] for r in records]
    print_table(table)
    return 0


def _short(value: object, limit: int = 40, from_left: bool = False) -> str:
    text = str(value)
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if from_left else text[: limit - 1] + "…"


def _inspect_columns(args: argparse.Namespace, reg, manifests: list, smp) -> dict[str, list]:  # type: ignore[no-untyped-def,type-arg]
    """The id column (if every source has it) or, with --show, the requested columns, read from the shards."""
    common = [n for n in manifests[0].schema.names if all(n in m.schema.names for m in manifests)]
    if args.show:
        wanted = args.columns.split(",") if args.columns else common
    else:
        wanted = [args.id_column] if args.id_column in common else []
    if not wanted or not len(smp.rows):
        return {}
    from shardstream.errors import InvalidArgumentError
    from shardstream.server.reader import DatasetReader, new_row_group_cache

    unknown = [c for c in wanted if c not in common]
    if unknown:
        raise InvalidArgumentError(f"unknown column(s) {unknown}; columns are: {', '.join(common)}")
    cache = new_row_group_cache(256 << 20)
    out: dict[str, list] = {c: [None] * len(smp.rows) for c in wanted}  # type: ignore[type-arg]
    for s in sorted(set(smp.sources.tolist())):
        m = manifests[s]
        reader = DatasetReader(m, [reg.shard_path(m, sh.uri) for sh in m.shards], cache)
        idx = [i for i, src in enumerate(smp.sources.tolist()) if src == s]
        batch = reader.take(smp.rows[idx], wanted)
        for c in wanted:
            for i, v in zip(idx, batch.column(c).to_pylist(), strict=True):
                out[c][i] = v
    return out


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
        help="write JSON Lines, Parquet, images, WebDataset tars or RL episodes as a new dataset version",
        description="Read JSON Lines (.jsonl/.ndjson/.json) or Parquet (.parquet) — a file or a "
        "directory of them —, a folder of images with one sub-folder per class "
        "(SRC/<class>/<file>.{jpg,jpeg,png,webp}; rows image (the file's bytes), label, class, path), "
        "WebDataset-style tar shards (*.tar; one binary column per member extension, plus __key__) "
        "or RL episodes (one .npz per episode with obs/action/reward/done arrays of one length; one row "
        "per episode) and write Parquet shards plus a new immutable version of NAME; the modality is "
        "recorded in the manifest metadata. Prints NAME@VERSION. Nothing is registered if any input is "
        "bad: an image folder holding any file that is not an image (or a file outside a class folder, "
        "or an empty class folder) is refused, not skipped; in the other formats, files of other types "
        "are ignored. Hidden files are never read.",
        epilog="Lineage: a new version of an existing NAME records its parent (the latest version) and its "
        "change, which --change claims and the registry checks against the parent before writing "
        "(a false claim registers nothing and names the fields or shards that contradict it); without "
        "--change the most specific kind that holds is recorded. --append (= --change append) makes "
        "the new version the parent's shards followed by this input's, written in the parent's schema.",
    )
    sp.add_argument("src", help="input file or directory")
    sp.add_argument("--name", required=True, help="dataset name (letters, digits, '.', '_', '-')")
    sp.add_argument(
        "--format",
        choices=("jsonl", "parquet", "images", "webdataset", "episodes"),
        help="how to read SRC (default: detected from its files: .jsonl/.json/.parquet tables, *.tar "
        "WebDataset, *.npz episodes, image files in class folders; a mix is refused)",
    )
    root_arg(sp)
    sp.add_argument(
        "--change",
        choices=CLAIMS,
        help="the change from the latest version, checked before writing: append (the parent's shards, "
        "then new ones; same schema), add_columns (same rows per shard, only new fields), rename_columns "
        "(same rows per shard and field types, other names), drop_columns (same rows per shard, fewer "
        "fields), replace (anything). Default: inferred",
    )
    sp.add_argument(
        "--append",
        action="store_true",
        help="add this input's rows after the latest version's: new version = its shards + the new ones",
    )
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
        "streams get --grace seconds to finish. With --workers N > 1, N worker processes share the "
        "port (SO_REUSEPORT among themselves; the port must be free) under a supervisor that restarts "
        "a worker that dies, drains them all on SIGTERM and serves their summed /metrics.",
    )
    root_arg(sp)
    sp.add_argument("--port", type=_port, default=7070, help="gRPC port (default 7070; 0 picks a free one)")
    sp.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)"
    )
    sp.add_argument("--metrics-port", type=_port, help="serve Prometheus /metrics on this port (0 picks one)")
    sp.add_argument(
        "--workers",
        type=_positive_int,
        help="server processes sharing the port (default: the usable CPUs, affinity and cgroup "
        "quota; 1 = a single process)",
    )
    sp.add_argument(
        "--cache-mib",
        type=_positive_int,
        default=1024,
        help="row-group cache size of the server, split evenly between its workers (default 1024)",
    )
    sp.add_argument(
        "--cache-dir",
        help="local-disk tier under the memory cache, shared by the workers (and later runs): row groups "
        "read from storage are kept here as Arrow files named by shard content hash (default: none)",
    )
    sp.add_argument(
        "--cache-dir-mib", type=_positive_int, default=8192, help="size bound of --cache-dir (default 8192)"
    )
    sp.add_argument(
        "--read-ahead",
        type=int,
        choices=range(0, 9),
        metavar="{0..8}",
        help="messages of each stream whose row groups are fetched before they are built (0 = off; "
        "default 1 for s3:// roots, 0 for local ones, where reads cost CPU and hide no latency)",
    )
    sp.add_argument(
        "--grace", type=float, default=10.0, help="seconds in-flight streams get on shutdown (default 10)"
    )
    sp.add_argument(
        "--ready-file", help="write {port, metrics_port, pid, workers} as JSON here once every worker serves"
    )
    sp.add_argument(
        "--transform-threads",
        type=_positive_int,
        default=None,
        help="threads per worker for server-side transforms (image/audio/video decode, tokenizing; they "
        "run without the GIL): default = the usable CPUs",
    )
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
        "inspect",
        help="which samples rank R gets at step T (from the plan alone)",
        description="Compute, from the read plan alone (the same functions the servers run), which samples a rank "
        "gets at a step: global positions, shard, row, row group and the id column. --show prints the rows "
        "themselves; --stats reports the configuration's read locality and shuffle quality instead, to help "
        "pick --window.",
    )
    sp.add_argument("dataset", help="NAME[@VERSION|@TAG], or a mixture 'a@1:0.7,b@2:0.3'")
    root_arg(sp)
    sp.add_argument("--seed", type=int, default=0, help="the job's seed (default 0)")
    sp.add_argument("--world-size", type=_positive_int, default=1, help="ranks in the job (default 1)")
    sp.add_argument("--batch-size", type=_positive_int, default=32, help="per-rank batch size (default 32)")
    sp.add_argument("--rank", type=int, default=0, help="which rank (default 0)")
    sp.add_argument(
        "--step", type=int, default=0, help="step of the epoch, counted from --offset (default 0)"
    )
    sp.add_argument("--epoch", type=int, default=0, help="epoch (default 0)")
    sp.add_argument(
        "--offset", type=int, default=0, help="global offset the steps start from, as after a resume"
    )
    sp.add_argument(
        "--shuffle", default="block", help="none | full | block (default: block, as Loader shuffle=True)"
    )
    sp.add_argument("--window", type=_positive_int, help="blocks per window for --shuffle block (default 16)")
    sp.add_argument("--drop-last", action="store_true", help="drop the epoch's incomplete last step")
    sp.add_argument(
        "--mixture-block", type=int, default=0, help="mixture schedule block, samples (default 1000)"
    )
    sp.add_argument(
        "--epoch-samples", type=int, default=0, help="samples per mixture epoch (default: all rows)"
    )
    sp.add_argument(
        "--id-column", default="id", help="column printed beside each sample if present (default id)"
    )
    sp.add_argument(
        "--show", action="store_true", help="print the rows themselves (all columns, or --columns)"
    )
    sp.add_argument("--columns", help="comma-separated columns for --show")
    sp.add_argument(
        "--stats", action="store_true", help="locality and shuffle-quality report for the configuration"
    )
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(fn=_cmd_inspect)

    add_cursor_commands(sub, root_arg)

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
