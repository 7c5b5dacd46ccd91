"""The command line of `python -m loadtest` (loadtest/driver.py runs it): arguments, table, JSON, PNG."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from .common import bench_main, bench_parser
from .driver import OUTPUTS, SHUFFLES, LoadConfig, run_load

__all__ = ["main"]


# --- report ------------------------------------------------------------------------------------
def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_report(res: dict[str, Any]) -> None:
    cfg, ds, tot = res["config"], res["dataset"], res["total"]
    print(
        f"\nloadtest: {cfg['servers']} servers, {cfg['ranks']} ranks, step {cfg['step_ms']:g} ms, "
        f"batch {cfg['batch_size']}, shuffle {cfg['shuffle']}, {ds['ref']} ({ds['rows']} rows, "
        f"{ds['shards']} shards, {ds['row_groups']} row groups), {res['window_s']:.1f} s window"
    )
    head = (
        f"{'process':<10} {'samples/s':>10} {'MB/s':>8} {'wait p50 ms':>12} {'wait p99 ms':>12} "
        f"{'stall':>7} {'1st ms':>8} {'CPU s':>7} {'peak RSS MiB':>13}"
    )
    print(head)
    print("-" * len(head))
    for r in res["ranks"]:
        print(
            f"{'rank ' + str(r['rank']):<10} {r['samples_per_s']:>10.0f} {r['mb_per_s']:>8.1f} "
            f"{_f(r['wait_p50_ms'], '.3f'):>12} {_f(r['wait_p99_ms'], '.3f'):>12} "
            f"{_f(r['stall_fraction'], '.2%'):>7} {_f(r['first_batch_ms'], '.1f'):>8} {r['cpu_s']:>7.2f} "
            f"{_f(r['peak_rss_mib'], '.0f'):>13}"
        )
    for s in res["servers"]:
        print(
            f"{'server ' + str(s['index']):<10} {'':>10} {'':>8} {'':>12} {'':>12} {'':>7} {'':>8} "
            f"{s['cpu_s']:>7.2f} {_f(s['peak_rss_mib'], '.0f'):>13}"
        )
    print(
        f"{'total':<10} {tot['samples_per_s']:>10.0f} {tot['mb_per_s']:>8.1f} {_f(tot['wait_p50_ms'], '.3f'):>12} "
        f"{_f(tot['wait_p99_ms'], '.3f'):>12} {_f(tot['stall_fraction_mean'], '.2%'):>7}"
    )
    amp = tot["read_amplification"]
    fetched = tot["fetched_amplification"]
    print(
        f"storage read amplification {_f(amp, '.3f')} (read {tot['storage_read_bytes'] / 1e6:.1f} MB decoded "
        f"for {tot['bytes'] / 1e6:.1f} MB delivered)"
        + (f"; fetched from S3 {_f(fetched, '.3f')}" if fetched else "")
    )
    chk = res["check"]
    print(
        f"checks: whole epochs {chk['whole_epochs']}, positions exactly once {chk['positions_exactly_once']}, "
        f"ids add up {chk['ids_add_up']}, rows = positions {chk['rows_equal_positions']}"
    )


def checks_failed(res: dict[str, Any]) -> bool:
    return any(v is False for k, v in res["check"].items() if k != "whole_epochs")


def build_parser() -> argparse.ArgumentParser:
    d = LoadConfig()
    from . import driver

    ap = bench_parser(
        "loadtest",
        driver.__doc__.split("\n\n")[0],
        epilog="See loadtest/driver.py and loadtest/README.md for what is measured.",
    )
    ap.add_argument("--servers", type=int, default=d.servers, help=f"server processes (default {d.servers})")
    ap.add_argument("--ranks", type=int, default=d.ranks, help=f"rank processes (default {d.ranks})")
    ap.add_argument(
        "--step-ms",
        type=float,
        default=d.step_ms,
        help=f"simulated compute per batch (default {d.step_ms:g})",
    )
    ap.add_argument(
        "--duration",
        type=float,
        default=d.duration_s,
        help=f"seconds (default {d.duration_s:g}; 0: no time limit, with --epochs)",
    )
    ap.add_argument(
        "--batches",
        type=int,
        default=d.batches,
        help="fixed work: every rank takes this many batches, however long it takes (--duration unused)",
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=d.batch_size,
        help=f"rows per rank per step (default {d.batch_size})",
    )
    ap.add_argument("--root", help="registry root: a directory or s3://BUCKET/PREFIX (default: a temp dir)")
    ap.add_argument("--s3-endpoint", help="S3 endpoint URL for s3:// roots (default $AWS_ENDPOINT_URL)")
    ap.add_argument("--dataset", help="a dataset under --root (default: generate lt-r<rows>-d<dim>, reused)")
    ap.add_argument(
        "--rows", type=int, default=d.rows, help=f"rows of the generated dataset (default {d.rows})"
    )
    ap.add_argument(
        "--dim", type=int, default=d.dim, help=f"float32 values per row (default {d.dim}: 264 B rows)"
    )
    ap.add_argument("--row-group-rows", type=int, help="rows per row group (default: ingest's ~4 MiB)")
    ap.add_argument("--shuffle", choices=SHUFFLES, default=d.shuffle, help=f"(default {d.shuffle})")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument(
        "--epochs", type=int, default=d.epochs, help="epochs per rank (default 0: until --duration)"
    )
    ap.add_argument(
        "--prefetch", type=int, default=d.prefetch, help=f"Loader prefetch, batches (default {d.prefetch})"
    )
    ap.add_argument(
        "--streams",
        type=int,
        default=d.streams,
        help="streams per rank, striped over the servers (default 1)",
    )
    ap.add_argument("--output", choices=OUTPUTS, default=d.output, help=f"Loader output (default {d.output})")
    ap.add_argument(
        "--cache-mib", type=int, default=d.cache_mib, help=f"server row-group cache (default {d.cache_mib})"
    )
    ap.add_argument(
        "--cache-dir",
        help="a local-disk row-group tier shared by all the servers (serve --cache-dir): each row group "
        "is read from storage once for the whole fleet of this host",
    )
    ap.add_argument(
        "--max-message-bytes", type=int, default=0, help="server message size target (default ~2 MiB)"
    )
    ap.add_argument("--png", type=Path, help="write the plot here")
    return ap  # main() adds --json


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    return LoadConfig(
        servers=args.servers,
        ranks=args.ranks,
        step_ms=args.step_ms,
        duration_s=args.duration,
        batches=args.batches,
        batch_size=args.batch_size,
        root=args.root,
        s3_endpoint=args.s3_endpoint,
        dataset=args.dataset,
        rows=args.rows,
        dim=args.dim,
        row_group_rows=args.row_group_rows,
        shuffle=args.shuffle,
        seed=args.seed,
        epochs=args.epochs,
        prefetch=args.prefetch,
        streams=args.streams,
        output=args.output,
        cache_mib=args.cache_mib,
        cache_dir=args.cache_dir,
        max_message_bytes=args.max_message_bytes,
    )


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds run_load: its servers and ranks are stopped


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        config_from_args(args).check()
    except ValueError as exc:
        ap.error(str(exc))


def _plot(args: argparse.Namespace, res: dict[str, Any]) -> None:
    if args.png:
        from .plot import plot_load  # matplotlib, only when a plot is asked for

        plot_load(res, args.png)
        print(f"wrote {args.png}")


def main(argv: list[str] | None = None) -> int:
    """Exit status 1 when a check of the delivered samples failed (checks_failed), else 0."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return bench_main(
        build_parser(),
        argv,
        lambda args: run_load(config_from_args(args)),
        json_default=None,
        report=print_report,
        check=_check,
        then=_plot,
        failed=checks_failed,
    )
