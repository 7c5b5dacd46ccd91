"""`shardstream register` and `shardstream datasets verify|tag|history|diff`: parsers and commands.

`cli.py` only calls `add_registry_commands`; the work that reads data (register, verify) lives in
the server package (`shardstream.server.registry_ops`) and is imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from shardstream._table import print_table
from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.lineage import CLAIMS, VersionDiff, diff
from shardstream.manifest import DatasetRef

__all__ = ["add_registry_commands"]


def _registry(args: argparse.Namespace) -> Any:
    from shardstream.server.roots import open_registry

    return open_registry(args.root, s3_endpoint=args.s3_endpoint)


def _threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= value <= 256:
        raise argparse.ArgumentTypeError(f"expected 1..256, got {value}")
    return value


def _cmd_register(args: argparse.Namespace) -> int:
    from shardstream.server.registry_ops import register

    with _registry(args) as reg:
        m = register(
            reg,
            args.name,
            args.sources,
            threads=args.threads,
            progress=False if args.quiet else None,
            change=args.change,
        )
    print(m.ref, flush=True)
    if not args.quiet:
        print(
            f"  {m.num_rows} rows in {len(m.shards)} file(s), {m.num_bytes} bytes, fingerprint "
            f"{m.fingerprint[:16]}",
            file=sys.stderr,
        )
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from shardstream.server.registry_ops import verify

    with _registry(args) as reg:
        m = reg.resolve(args.dataset)
        problems = verify(reg, m, threads=args.threads, progress=False if args.quiet else None)
    if args.json:
        print(
            json.dumps(
                {
                    "dataset": m.ref,
                    "shards": len(m.shards),
                    "bad": [{"uri": p.uri, "problem": p.problem} for p in problems],
                },
                indent=1,
            )
        )
    else:
        for p in problems:
            print(f"BAD  {p.uri}: {p.problem}")
    if problems:
        raise DataLossError(f"{m.ref}: {len(problems)} of {len(m.shards)} shard(s) failed verification")
    if not args.json:
        print(f"{m.ref}: all {len(m.shards)} shard(s) match the manifest ({m.num_bytes} bytes hashed)")
    return 0


def _cmd_tag_any(args: argparse.Namespace) -> int:
    ref = DatasetRef.parse(args.dataset)
    if ref.version is None and ref.tag is None:
        raise InvalidArgumentError(f"tag needs NAME@VERSION or NAME@TAG, got {args.dataset!r}")
    with _registry(args) as reg:
        m = reg.set_tag(ref, args.tag)
    print(f"{m.name}@{args.tag} -> {m.ref}")
    return 0


def _cmd_history(args: argparse.Namespace) -> int:
    with _registry(args) as reg:
        ref = DatasetRef.parse(args.name)
        if ref.version is not None or ref.tag is not None:
            raise InvalidArgumentError(f"history takes a dataset NAME, got {args.name!r}")
        versions = reg.versions(ref.name)
        if not versions:
            raise reg_not_found(reg, ref.name)
        tags = reg.tags(ref.name)
        manifests = [reg.resolve(DatasetRef(ref.name, v)) for v in versions]
    by_version: dict[int, list[str]] = {}
    for tag, v in tags.items():
        by_version.setdefault(v, []).append(tag)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "version": m.version,
                        "parent": m.parent,
                        "change": m.change,
                        "created_at": m.created_at,
                        "rows": m.num_rows,
                        "shards": len(m.shards),
                        "fingerprint": m.fingerprint,
                        "tags": by_version.get(m.version, []),
                    }
                    for m in manifests
                ],
                indent=1,
            )
        )
        return 0
    rows = [("VERSION", "PARENT", "CHANGE", "ROWS", "SHARDS", "FINGERPRINT", "CREATED", "TAGS")]
    for m in reversed(manifests):
        rows.append(
            (
                str(m.version),
                "-" if m.parent is None else str(m.parent),
                m.change,
                str(m.num_rows),
                str(len(m.shards)),
                m.fingerprint[:12],
                m.created_at,
                ",".join(by_version.get(m.version, [])),
            )
        )
    print_table(rows)
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    refs = [DatasetRef.parse(text) for text in (args.old, args.new)]
    for ref, text in zip(refs, (args.old, args.new), strict=True):
        if ref.version is None and ref.tag is None:
            raise InvalidArgumentError(f"diff needs NAME@VERSION or NAME@TAG, got {text!r}")
    with _registry(args) as reg:
        d = diff(reg.resolve(refs[0]), reg.resolve(refs[1]))
    if args.json:
        print(json.dumps(d.to_json(), indent=1))
    else:
        print_diff(d)
    return 0


def _delta(before: int, after: int) -> str:
    return f"{before} -> {after} ({after - before:+d})"


def print_diff(d: VersionDiff, limit: int = 10) -> None:
    recorded = f" (recorded: {d.recorded})" if d.recorded is not None else ""
    print(f"{d.old} -> {d.new}: {d.change}{recorded}")
    print(f"  rows    {_delta(d.rows_before, d.rows_after)}")
    print(
        f"  shards  {_delta(d.shards_before, d.shards_after)}: {len(d.shards_added)} added, "
        f"{len(d.shards_removed)} removed"
    )
    lines = [f"+ {n}: {t}" for n, t in d.fields_added]
    lines += [f"- {n}: {t}" for n, t in d.fields_removed]
    lines += [f"~ {o} -> {n} (renamed)" for o, n in d.fields_renamed]
    lines += [f"~ {n}: {o} -> {t} (retyped)" for n, o, t in d.fields_retyped]
    print(f"  fields  {'unchanged' if not lines else lines[0]}")
    for line in lines[1:]:
        print(f"          {line}")
    for sign, uris in (("+", d.shards_added), ("-", d.shards_removed)):
        for uri in uris[:limit]:
            print(f"  {sign} shard {uri}")
        if len(uris) > limit:
            print(f"  {sign} … {len(uris) - limit} more (--json lists all)")


def reg_not_found(reg: Any, name: str) -> Exception:
    from shardstream.errors import NotFoundError

    return NotFoundError(f"no dataset named {name!r} under {reg.root}")


def add_registry_commands(sub: Any, dsub: Any, root_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `register` to the top-level subparsers and `verify|tag|history|diff` to `datasets`."""
    sp = sub.add_parser(
        "register",
        help="register existing Parquet files as a new dataset version (no rewrite)",
        description="Register Parquet files already under the dataset's directory (ROOT/NAME/...) — "
        "written by Spark, Ray Data, DuckDB, pandas, … — as the next version of NAME, without rewriting "
        "them. Footers are read first, concurrently; when the files' schemas differ the files and fields "
        "are named and nothing is registered. Then each file is hashed (concurrently) for the manifest. "
        "Prints NAME@VERSION.",
        epilog="--from takes a path relative to ROOT/NAME (e.g. data/2024-06), or an absolute path / "
        "s3:// URI inside it; a directory or prefix means every *.parquet under it (files and folders "
        "starting with '_' or '.' are skipped). Files the latest version already holds come first, in its "
        "order, then the new ones sorted: registering a grown prefix is an append. Example: shardstream "
        "register web --from s3://bucket/registry/web/data/2024-06/ --root s3://bucket/registry",
    )
    sp.add_argument("name", help="dataset name (letters, digits, '.', '_', '-')")
    sp.add_argument(
        "--from",
        dest="sources",
        nargs="+",
        required=True,
        metavar="URI",
        help="Parquet file(s) or directory/prefix(es) under ROOT/NAME",
    )
    root_arg(sp)
    sp.add_argument(
        "--change",
        choices=CLAIMS,
        help="the change from the latest version, checked before anything is written: append (the "
        "parent's files first, unchanged, then new ones; same schema), add_columns (same rows per file, "
        "only new fields), rename_columns (same rows per file and field types, other names), drop_columns "
        "(same rows per file, fewer fields), replace (anything). Default: inferred",
    )
    sp.add_argument("--threads", type=_threads, default=32, help="concurrent reads (default 32)")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    sp.set_defaults(fn=_cmd_register)

    sp = dsub.add_parser(
        "verify",
        help="re-hash every shard and report each one that differs from the manifest",
        description="Recompute the size and sha256 of every shard of NAME[@VERSION|@TAG] and print each "
        "one that is missing or differs. Exit code 0 only when every shard matches.",
    )
    sp.add_argument("dataset", help="NAME (latest), NAME@VERSION or NAME@TAG")
    root_arg(sp)
    sp.add_argument("--threads", type=_threads, default=16, help="shards hashed at once (default 16)")
    sp.add_argument("--json", action="store_true", help="machine-readable report")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    sp.set_defaults(fn=_cmd_verify)

    sp = dsub.add_parser(
        "tag",
        help="point a tag at a version (atomic; moves an existing tag)",
        description="Point TAG at NAME@VERSION (NAME@OTHERTAG works too). The tag file is replaced "
        "atomically: readers see the old version or the new one. Then NAME@TAG resolves to it.",
    )
    sp.add_argument("dataset", help="NAME@VERSION or NAME@TAG")
    sp.add_argument("tag", help="tag name (letters, digits, '.', '_', '-'; not a number)")
    root_arg(sp)
    sp.set_defaults(fn=_cmd_tag_any)

    sp = dsub.add_parser(
        "history",
        help="every version of a dataset: parent, change, size, fingerprint, tags",
        description="List the versions of NAME, newest first, with lineage and tags.",
    )
    sp.add_argument("name", help="dataset NAME")
    root_arg(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(fn=_cmd_history)

    sp = dsub.add_parser(
        "diff",
        help="the change between two versions: fields, shards, rows, change kind",
        description="Print what changed from OLD to NEW (NAME@VERSION or NAME@TAG): fields added, removed, "
        "renamed or retyped, shards added and removed, rows before and after, and the most specific change "
        "kind that holds (append, add_columns, rename_columns, drop_columns, else replace) — with the "
        "recorded one when OLD is NEW's parent.",
    )
    sp.add_argument("old", help="NAME@VERSION or NAME@TAG")
    sp.add_argument("new", help="NAME@VERSION or NAME@TAG")
    root_arg(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(fn=_cmd_diff)
