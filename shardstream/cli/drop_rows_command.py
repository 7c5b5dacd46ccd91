"""`shardstream datasets drop-rows`: a new version without known-bad rows, its shards untouched
(server/writing/drop_rows.py).

Rows come as SHARD:ROW pairs (--row), as a JSON document (--rows FILE, or - for stdin) holding
objects with "shard" (index or URI) and "row" keys anywhere in it — what `inspect --json` prints
under "samples", and sample records of other tools in that shape; objects naming another dataset
under "source" or "dataset" are left out — or as values of a key column (--key with --values).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardstream.errors import InvalidArgumentError
from shardstream.manifest import DatasetRef

from . import common

__all__ = ["add_command"]


def _records(doc: Any) -> Iterator[dict[str, Any]]:
    """Every object with "shard" and "row" keys, anywhere in a JSON document."""
    if isinstance(doc, dict):
        if "shard" in doc and "row" in doc:
            yield doc
            return
        for value in doc.values():
            yield from _records(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _records(value)


def rows_from_json(text: str, name: str) -> tuple[list[tuple[int | str, int]], int]:
    """((shard, row) pairs of dataset `name`, how many records named another dataset)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"--rows: not JSON ({exc})") from None
    rows: list[tuple[int | str, int]] = []
    other = 0
    for rec in _records(doc):
        owner = rec.get("source", rec.get("dataset"))
        if isinstance(owner, str) and DatasetRef.parse(owner).name != name:
            other += 1
            continue
        shard, row = rec["shard"], rec["row"]
        if not isinstance(shard, (int, str)) or isinstance(shard, bool) or not isinstance(row, int):
            raise InvalidArgumentError(
                f"--rows: a record's shard is an index or a URI and its row an integer: {rec}"
            )
        rows.append((shard, row))
    return rows, other


def _cmd_drop_rows(args: argparse.Namespace) -> int:
    from shardstream.server.writing.drop_rows import drop_rows

    name = DatasetRef.parse(args.dataset).name
    rows: list[tuple[int | str, int]] = []
    for pair in args.row or ():
        shard, sep, row = pair.rpartition(":")
        if not sep or not shard or not row.isdigit():
            raise InvalidArgumentError(f"--row {pair!r} is not SHARD:ROW")
        rows.append((shard, int(row)))
    other = 0
    if args.rows:
        text = sys.stdin.read() if args.rows == "-" else Path(args.rows).read_text()
        found, other = rows_from_json(text, name)
        rows += found
    values: list[str] = []
    if args.values:
        values = [v for v in args.values.split(",") if v]
    if (args.key is None) != (not values):
        raise InvalidArgumentError("--key and --values go together")
    if not rows and args.key is None:
        raise InvalidArgumentError(
            "name rows to drop: --row SHARD:ROW, --rows FILE, or --key COLUMN --values ..."
        )
    with common.open_registry(args) as reg:
        res = drop_rows(reg, args.dataset, rows=rows, key=args.key, values=values, reason=args.reason or "")
    out = {
        "dataset": res.manifest.ref,
        "parent": f"{res.manifest.name}@{res.manifest.parent}",
        "dropped": res.dropped,
        "masked_already": res.already,
        "masked_rows": res.manifest.masked_rows,
        "num_rows": res.manifest.num_rows,
        "values_not_found": list(res.missing),
        "records_of_other_datasets": other,
        "fingerprint": res.manifest.fingerprint,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(res.manifest.ref)
    print(
        f"  masks {res.dropped} more row(s) of {out['parent']} ({res.manifest.masked_rows} in all, "
        f"{res.manifest.num_rows} rows held); shards not rewritten",
        file=sys.stderr,
    )
    if res.already:
        print(f"  {res.already} row(s) named were masked already", file=sys.stderr)
    if res.missing:
        print(f"  no row holds {args.key} = {', '.join(res.missing[:10])}", file=sys.stderr)
    if other:
        print(f"  {other} record(s) of other datasets left out", file=sys.stderr)
    return 0


def add_command(dsub: Any) -> None:
    sp = common.add_command(
        dsub,
        "drop-rows",
        _cmd_drop_rows,
        help="a new version without some rows, masked in its manifest (no shard rewritten)",
        description="Write the next version of NAME (its latest version's shards, unchanged) with the rows "
        "named masked: the plan orders only the rows a version holds, so no job reading it ever sees them. "
        "Jobs on the parent keep reading the parent (move one with `cursor migrate`). Prints NAME@VERSION.",
        epilog=common.examples(
            "shardstream datasets drop-rows web --row 3:17 --row part-00009.parquet:4 --root ./datasets",
            "shardstream datasets drop-rows web --key id --values a1f3,77c0 --reason 'duplicates of eval'",
            "shardstream datasets drop-rows web --rows step-12.json  # inspect --json output, or - for stdin",
        ),
    )
    sp.add_argument("dataset", help="NAME (or its latest NAME@VERSION)")
    sp.add_argument(
        "--row", action="append", metavar="SHARD:ROW", help="a row: shard index or URI, row in shard"
    )
    sp.add_argument("--rows", metavar="FILE", help="JSON with {shard, row} records (- for stdin)")
    sp.add_argument("--key", metavar="COLUMN", help="drop every row whose COLUMN is one of --values")
    sp.add_argument("--values", metavar="V1,V2,...", help="values of --key")
    sp.add_argument("--reason", help="why, kept in the version's metadata")
    common.root_options(sp)
    common.json_option(sp)
