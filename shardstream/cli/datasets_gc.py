"""`shardstream datasets gc NAME|--all [--dry-run] [--min-age AGE]`: the command line of server/writing/orphan_files.py.

A subcommand of the `datasets` group (datasets.py registers it) kept in a module of its own: the
group's module is already past 400 lines, and what gc removes and why is decided in
`shardstream.server.writing.orphan_files`, not here. A local root runs on a client-only install (that
module imports the core only); an s3:// root needs the server extra, as every command's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from shardstream.errors import NotFoundError
from shardstream.manifest import validate_name
from shardstream.server.writing.orphan_files import DEFAULT_MIN_AGE_S, OrphanReport, remove_orphans

from . import common

__all__ = ["add_command", "duration"]

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """Seconds of `90`, `90s`, `30m`, `1h`, `2d` (argparse type)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected an age like 90s, 30m, 1h or 2d, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _print_report(r: OrphanReport) -> None:
    verb = "would remove" if r.dry_run else "removed"
    for f in r.removed:
        print(f"{verb}  {f.key}  {f.bytes} bytes  ({_age(f.age_s)} old)")
    for d in r.dirs:
        print(f"{verb}  {d}/  (empty ingest directory)")
    for key, why in r.failed:
        print(f"shardstream: warning: could not remove {key}: {why}", file=sys.stderr)
    if r.skipped:
        print(f"shardstream: warning: {r.name} skipped: {r.skipped}", file=sys.stderr)
        return
    kept = []
    if r.young:
        kept.append(f"{len(r.young)} younger than the grace age")
    if r.foreign:
        kept.append(f"{len(r.foreign)} outside ingest directories (e.g. waiting for register)")
    more = f"; kept {len(r.young) + len(r.foreign)} unreferenced: {', '.join(kept)}" if kept else ""
    print(
        f"{r.name}: {verb} {len(r.removed)} file(s), {r.bytes} bytes ({common.human_bytes(r.bytes)}){more}",
        file=sys.stderr,
    )


def _cmd_gc(args: argparse.Namespace) -> int:
    with common.open_registry(args) as reg:
        if args.all:
            names = reg.dataset_dirs()
        else:
            name = validate_name(args.name)
            if name not in reg.dataset_dirs():
                raise NotFoundError(f"no dataset directory named {name!r} under {reg.root}")
            names = [name]
        reports = [remove_orphans(reg, n, min_age_s=args.min_age, dry_run=args.dry_run) for n in names]
    if args.json:
        out: dict[str, Any] = {
            "dry_run": args.dry_run,
            "min_age_s": args.min_age,
            "bytes": sum(r.bytes for r in reports),
            "datasets": [r.to_json() for r in reports],
        }
        print(json.dumps(out, indent=1))
    else:
        for r in reports:
            _print_report(r)
        if len(reports) > 1:
            verb = "would remove" if args.dry_run else "removed"
            total = sum(r.bytes for r in reports)
            files = sum(len(r.removed) for r in reports)
            print(
                f"total: {verb} {files} file(s), {total} bytes ({common.human_bytes(total)})", file=sys.stderr
            )
    return common.EXIT_ERROR if any(r.skipped or r.failed for r in reports) else 0


def add_command(dsub: Any) -> None:
    sp = common.add_command(
        dsub,
        "gc",
        _cmd_gc,
        help="remove data files no manifest references (leftovers of killed ingests)",
        description="Remove what no version of NAME (or of every dataset, --all) references: the shards "
        "of an ingest killed before it created its manifest (its directory NAME/data/<ingest id>/, left "
        "empty or not) and temp files of interrupted writes. Prints each file removed (or, with "
        "--dry-run, that would be) with its bytes, and the total. Never removed: any file a manifest "
        "references; files outside ingest directories (e.g. Parquet waiting for `register`: reported "
        "as kept); anything younger than --min-age — an ingest directory is young while any file in it "
        "is, so gc never races a running ingest. A dataset with an unreadable manifest or a symlinked "
        "directory is skipped and reported (exit code 1), since what it references is unknown. Works "
        "on local and s3:// roots.",
        epilog=common.examples(
            "shardstream datasets gc toy --dry-run --root ./datasets",
            "shardstream datasets gc toy --root ./datasets",
            "shardstream datasets gc --all --min-age 6h --root s3://bucket/registry --json",
        ),
    )
    which = sp.add_mutually_exclusive_group(required=True)
    which.add_argument("name", nargs="?", help="dataset NAME")
    which.add_argument("--all", action="store_true", help="every dataset directory under --root")
    sp.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    sp.add_argument(
        "--min-age",
        type=duration,
        default=DEFAULT_MIN_AGE_S,
        metavar="AGE",
        help="leave files younger than AGE alone (90s, 30m, 1h, 2d; default 1h): longer than the longest "
        "pause between two shard writes of a running ingest",
    )
    common.root_options(sp)
    common.json_option(sp, "machine-readable report")
