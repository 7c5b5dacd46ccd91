"""`shardstream datasets list|show|history|diff|tag|verify|gc|drop-rows` and `shardstream register`: the registry
under --root, read and maintained.

The reading commands open a local root through the shared package (a client-only install runs them)
and never create anything; `register` and `verify` read data through the server package
(`shardstream.server.writing.registry_ops`, needs the server extra), imported when they run. `gc` and `drop-rows` have their
own modules (datasets_gc.py, drop_rows_command.py). An entry of the registry that cannot be read (registry.BadEntry) is skipped
by `list` and `history` with a warning on stderr (and under "bad" with --json); any command that
needs it fails naming the version. The group is one module (about 450 lines) so that its parser
sits beside every handler; gc, whose parser and handler share nothing with the others, is apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardstream.errors import DataLossError, InvalidArgumentError, NotFoundError
from shardstream.lineage import CLAIMS, VersionDiff, diff
from shardstream.manifest import DatasetRef
from shardstream.registry import BadEntry, Registry

from . import common, datasets_gc, drop_rows_command

__all__ = ["add_commands", "print_diff"]


def _cmd_list(args: argparse.Namespace) -> int:
    with common.open_registry(args) as reg:
        return _print_datasets(args, reg)


def _bad_json(reg: Registry, bad: BadEntry) -> dict[str, Any]:
    return {
        "dataset": bad.ref,
        "name": bad.name,
        "version": bad.version,
        "reason": bad.reason,
        "location": reg.storage.url_of(bad.key) if bad.key else None,
        "detail": bad.detail or None,
    }


def warn_bad(reg: Registry, bad: BadEntry) -> None:
    """One line on stderr for an entry that cannot be read: what, why, where (and the error)."""
    where = reg.storage.url_of(bad.key) if bad.key else bad.name
    detail = f": {bad.detail}" if bad.detail else ""
    print(f"shardstream: warning: {bad.ref}: {bad.reason}; skipped ({where}{detail})", file=sys.stderr)


def _print_datasets(args: argparse.Namespace, reg: Registry) -> int:
    listing = reg.listing()
    manifests = listing.manifests
    for bad in listing.bad:
        warn_bad(reg, bad)
    if args.json:
        datasets = [
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
        ]
        bad = [_bad_json(reg, b) for b in listing.bad]
        print(json.dumps({"datasets": datasets, "bad": bad}, indent=1))
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
                common.human_bytes(m.num_bytes),
                m.created_at,
            )
        )
    common.print_table(rows)
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    with common.open_registry(args) as reg:
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
    if m.derived_from is not None:  # a materialized version: its source and the transforms applied
        d = m.derived_from
        columns = f", columns {', '.join(d.columns)}" if d.columns else ""
        print(f"  derived from {d.source} (fingerprint {d.fingerprint[:16]}{columns})")
        print(f"  transforms   {json.dumps([dict(t) for t in d.transforms], sort_keys=True)}")
    print(f"  created      {m.created_at}")
    print(f"  rows         {m.num_rows}")
    print(f"  size         {common.human_bytes(m.num_bytes)} in {len(m.shards)} shard(s)")
    if m.metadata:
        print(f"  metadata     {json.dumps(dict(m.metadata), sort_keys=True)}")
    print("  fields")
    for name, typ in m.fields:
        print(f"    {name}: {typ}")
    print("  shards")
    limit = None if args.all_shards else 10
    for s in m.shards[:limit]:
        print(
            f"    {s.uri}  rows={s.rows}  row_groups={len(s.row_groups)}  {common.human_bytes(s.bytes)}  "
            f"sha256={s.sha256[:16]}"
        )
    if limit is not None and len(m.shards) > limit:
        print(f"    … {len(m.shards) - limit} more (--all-shards)")
    return 0


def _cmd_register(args: argparse.Namespace) -> int:
    from shardstream.server.writing.registry_ops import register

    with common.open_registry(args, must_exist=False) as reg:
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
    from shardstream.server.writing.registry_ops import verify

    with common.open_registry(args) as reg:
        m = reg.resolve(args.dataset)
        problems = verify(reg, m, threads=args.threads, progress=False if args.quiet else None)
    unchecked = sum(s.checksums is None for s in m.shards)  # registered before row-group checksums
    if args.json:
        print(
            json.dumps(
                {
                    "dataset": m.ref,
                    "shards": len(m.shards),
                    "shards_without_row_group_checksums": unchecked,
                    "bad": [{"uri": p.uri, "problem": p.problem} for p in problems],
                },
                indent=1,
            )
        )
    else:
        for p in problems:
            print(f"BAD  {p.uri}: {p.problem}")
        if unchecked:
            print(
                f"note: {unchecked} of {len(m.shards)} shard(s) of {m.ref} have no row-group checksums (registered "
                "before they existed): checked here by size and sha256; nothing was changed "
                "(register the files again for a version with them, same fingerprint)"
            )
    if problems:
        raise DataLossError(f"{m.ref}: {len(problems)} of {len(m.shards)} shard(s) failed verification")
    if not args.json:
        print(f"{m.ref}: all {len(m.shards)} shard(s) match the manifest ({m.num_bytes} bytes hashed)")
    return 0


def _cmd_tag_any(args: argparse.Namespace) -> int:
    ref = DatasetRef.parse(args.dataset)
    if ref.version is None and ref.tag is None:
        raise InvalidArgumentError(f"tag needs NAME@VERSION or NAME@TAG, got {args.dataset!r}")
    with common.open_registry(args) as reg:
        m = reg.set_tag(ref, args.tag)
    print(f"{m.name}@{args.tag} -> {m.ref}")
    return 0


def _cmd_history(args: argparse.Namespace) -> int:
    with common.open_registry(args) as reg:
        ref = DatasetRef.parse(args.name)
        if ref.version is not None or ref.tag is not None:
            raise InvalidArgumentError(f"history takes a dataset NAME, got {args.name!r}")
        versions = reg.versions(ref.name)
        if not versions:
            raise NotFoundError(f"no dataset named {ref.name!r} under {reg.root}")
        tags = reg.tags(ref.name)
        loaded = reg.manifests(ref.name)
        for bad in loaded:
            if isinstance(bad, BadEntry):
                warn_bad(reg, bad)
    by_version: dict[int, list[str]] = {}
    for tag, v in tags.items():
        by_version.setdefault(v, []).append(tag)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "version": m.version,
                        "unreadable": m.reason,
                        "tags": by_version.get(m.version or 0, []),
                    }
                    if isinstance(m, BadEntry)
                    else {
                        "version": m.version,
                        "parent": m.parent,
                        "change": m.change,
                        "created_at": m.created_at,
                        "rows": m.num_rows,
                        "shards": len(m.shards),
                        "fingerprint": m.fingerprint,
                        "tags": by_version.get(m.version, []),
                    }
                    for m in loaded
                ],
                indent=1,
            )
        )
        return 0
    rows = [("VERSION", "PARENT", "CHANGE", "ROWS", "SHARDS", "FINGERPRINT", "CREATED", "TAGS")]
    for m in reversed(loaded):
        if isinstance(m, BadEntry):
            tag_list = ",".join(by_version.get(m.version or 0, []))
            rows.append((str(m.version), "?", "UNREADABLE", "-", "-", "-", "-", tag_list))
            continue
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
    common.print_table(rows)
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    refs = [DatasetRef.parse(text) for text in (args.old, args.new)]
    for ref, text in zip(refs, (args.old, args.new), strict=True):
        if ref.version is None and ref.tag is None:
            raise InvalidArgumentError(f"diff needs NAME@VERSION or NAME@TAG, got {text!r}")
    with common.open_registry(args) as reg:
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


def add_commands(sub: Any) -> None:
    """`datasets` and its subcommands, and `register` (a top-level command: it writes a version)."""
    ds = common.add_command(
        sub,
        "datasets",
        None,
        help="list, show, verify, tag, trace and garbage-collect registered datasets",
        description="Inspect and maintain the registry under --root.",
        epilog=common.examples(
            "shardstream datasets list --root ./datasets",
            "shardstream --root ./datasets datasets show toy@1",
            "shardstream datasets history toy --root s3://bucket/registry --s3-endpoint http://127.0.0.1:8333",
            "shardstream datasets diff toy@1 toy@2 --json",
        ),
    )
    dsub = ds.add_subparsers(dest="datasets_command", metavar="SUBCOMMAND", required=True)
    sp = common.add_command(
        dsub,
        "list",
        _cmd_list,
        help="every dataset with its latest version",
        description="Every dataset under --root with its latest version, number of versions, rows, shards, "
        "size and creation time. A root that does not exist is an error. An entry that cannot be read (a "
        "truncated or invalid manifest, a symlinked dataset directory, one without read permission) is "
        "skipped with a warning line on stderr naming it, why and where; with --json the output is "
        '{"datasets": [...], "bad": [...]}. The exit code stays 0: the readable datasets are listed.',
        epilog=common.examples(
            "shardstream datasets list",
            "shardstream datasets list --root ./datasets --json",
            "shardstream --root s3://bucket/registry datasets list",
        ),
    )
    common.root_options(sp)
    common.json_option(sp)

    sp = common.add_command(
        dsub,
        "show",
        _cmd_show,
        help="one version: fingerprint, lineage, fields, shards",
        description="One version of a dataset: fingerprint, parent and change, what a materialized version "
        "was derived from (source version and transforms), size, metadata, fields and "
        "shards (the first 10 unless --all-shards).",
        epilog=common.examples(
            "shardstream datasets show toy --root ./datasets",
            "shardstream datasets show toy@prod --all-shards",
            "shardstream datasets show toy@1 --json",
        ),
    )
    sp.add_argument("dataset", help="NAME (latest), NAME@VERSION or NAME@TAG")
    common.root_options(sp)
    common.json_option(sp, "print the manifest as JSON")
    sp.add_argument("--all-shards", action="store_true", help="list every shard, not the first 10")

    sp = common.add_command(
        dsub,
        "verify",
        _cmd_verify,
        help="re-hash every shard and report each one that differs from the manifest",
        description="Recompute the size, sha256 and row-group checksums of every shard of "
        "NAME[@VERSION|@TAG] and print each one that is missing or differs (naming row groups and columns). "
        "Reads only: a version without row-group checksums is checked by sha256 and left as it is. "
        "Exit code 0 only when every shard matches. Needs the server extra.",
        epilog=common.examples(
            "shardstream datasets verify toy --root ./datasets",
            "shardstream datasets verify web@prod --root s3://bucket/registry --threads 64 --json -q",
        ),
    )
    sp.add_argument("dataset", help="NAME (latest), NAME@VERSION or NAME@TAG")
    common.root_options(sp)
    sp.add_argument("--threads", type=common.threads, default=16, help="shards hashed at once (default 16)")
    common.json_option(sp, "machine-readable report")
    common.quiet_option(sp, "no progress bar")

    sp = common.add_command(
        dsub,
        "tag",
        _cmd_tag_any,
        help="point a tag at a version (atomic; moves an existing tag)",
        description="Point TAG at NAME@VERSION (NAME@OTHERTAG works too). The tag file is replaced "
        "atomically: readers see the old version or the new one. Then NAME@TAG resolves to it.",
        epilog=common.examples(
            "shardstream datasets tag toy@2 prod --root ./datasets",
            "shardstream datasets tag toy@prod previous",
        ),
    )
    sp.add_argument("dataset", help="NAME@VERSION or NAME@TAG")
    sp.add_argument("tag", help="tag name (letters, digits, '.', '_', '-'; not a number)")
    common.root_options(sp)

    sp = common.add_command(
        dsub,
        "history",
        _cmd_history,
        help="every version of a dataset: parent, change, size, fingerprint, tags",
        description="List the versions of NAME, newest first, with lineage and tags.",
        epilog=common.examples(
            "shardstream datasets history toy --root ./datasets",
            "shardstream datasets history toy --json",
        ),
    )
    sp.add_argument("name", help="dataset NAME")
    common.root_options(sp)
    common.json_option(sp)

    sp = common.add_command(
        dsub,
        "diff",
        _cmd_diff,
        help="the change between two versions: fields, shards, rows, change kind",
        description="Print what changed from OLD to NEW (NAME@VERSION or NAME@TAG): fields added, removed, "
        "renamed or retyped, shards added and removed, rows before and after, and the most specific change "
        "kind that holds (append, add_columns, rename_columns, drop_columns, else replace) — with the "
        "recorded one when OLD is NEW's parent.",
        epilog=common.examples(
            "shardstream datasets diff toy@1 toy@2 --root ./datasets",
            "shardstream datasets diff toy@prod toy@3 --json",
        ),
    )
    sp.add_argument("old", help="NAME@VERSION or NAME@TAG")
    sp.add_argument("new", help="NAME@VERSION or NAME@TAG")
    common.root_options(sp)
    common.json_option(sp)
    datasets_gc.add_command(dsub)
    drop_rows_command.add_command(dsub)
    common.add_global_options(ds, common.accepted_globals(list(dsub.choices.values())))

    sp = common.add_command(
        sub,
        "register",
        _cmd_register,
        help="register existing Parquet files as a new dataset version (no rewrite)",
        description="Register Parquet files already under the dataset's directory (ROOT/NAME/...) — "
        "written by Spark, Ray Data, DuckDB, pandas, … — as the next version of NAME, without rewriting "
        "them. Footers are read first, concurrently; when the files' schemas differ the files and fields "
        "are named and nothing is registered. Then each file is hashed (concurrently) for the manifest. "
        "Prints NAME@VERSION. Needs the server extra.",
        epilog=common.examples(
            "shardstream register web --from data/2024-06 --root ./datasets",
            "shardstream register web --from s3://bucket/registry/web/data/2024-06/ --root s3://bucket/registry",
            "shardstream register web --from data/2024-07 --change append --threads 64 -q",
            before="--from takes a path relative to ROOT/NAME (e.g. data/2024-06), or an absolute path / "
            "s3:// URI inside it; a directory or prefix means every *.parquet under it (files and folders "
            "starting with '_' or '.' are skipped). Files the latest version already holds come first, in its "
            "order, then the new ones sorted: registering a grown prefix is an append.",
        ),
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
    common.root_options(sp)
    sp.add_argument(
        "--change",
        choices=CLAIMS,
        help="the change from the latest version, checked before anything is written: append (the "
        "parent's files first, unchanged, then new ones; same schema), add_columns (same rows per file, "
        "only new fields), rename_columns (same rows per file and field types, other names), drop_columns "
        "(same rows per file, fewer fields), replace (anything). Default: inferred",
    )
    sp.add_argument("--threads", type=common.threads, default=32, help="concurrent reads (default 32)")
    common.quiet_option(sp)
