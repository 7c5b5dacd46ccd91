"""`shardstream ingest`: write files as a new dataset version (needs the server extra)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardstream.errors import InvalidArgumentError
from shardstream.lineage import CLAIMS

from . import common

__all__ = ["add_commands"]


def _cmd_ingest(args: argparse.Namespace) -> int:
    from shardstream.server.backends.roots import open_registry
    from shardstream.server.writing.ingest import IngestOptions, ingest

    opts = IngestOptions(
        row_group_bytes=args.row_group_mib << 20,
        row_group_rows=args.row_group_rows,
        shard_bytes=args.shard_mib << 20,
        shard_rows=args.shard_rows,
        progress=False if args.quiet else None,
    )
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
            f"  {m.num_rows} rows in {len(m.shards)} shard(s), {common.human_bytes(m.num_bytes)}, "
            f"fingerprint {m.fingerprint[:16]}",
            file=sys.stderr,
        )
    return 0


def add_commands(sub: Any) -> None:
    sp = common.add_command(
        sub,
        "ingest",
        _cmd_ingest,
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
        epilog=common.examples(
            "shardstream ingest data.jsonl --name toy --root ./datasets",
            "shardstream ingest more.jsonl --name toy --append --root ./datasets",
            "shardstream ingest photos/ --name pets --format images --shard-mib 64 -q",
            "shardstream ingest part.parquet --name web --root s3://bucket/registry --s3-endpoint http://127.0.0.1:8333",
            before="Lineage: a new version of an existing NAME records its parent (the latest version) and its "
            "change, which --change claims and the registry checks against the parent before writing "
            "(a false claim registers nothing and names the fields or shards that contradict it); without "
            "--change the most specific kind that holds is recorded. --append (= --change append) makes "
            "the new version the parent's shards followed by this input's, written in the parent's schema.",
        ),
    )
    sp.add_argument("src", help="input file or directory")
    sp.add_argument("--name", required=True, help="dataset name (letters, digits, '.', '_', '-')")
    sp.add_argument(
        "--format",
        choices=("jsonl", "parquet", "images", "webdataset", "episodes"),
        help="how to read SRC (default: detected from its files: .jsonl/.json/.parquet tables, *.tar "
        "WebDataset, *.npz episodes, image files in class folders; a mix is refused)",
    )
    common.root_options(sp)
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
        type=common.positive_int,
        default=4,
        help="target row-group size, uncompressed (default 4): the power of two of rows nearest it, so that power-of-two batches of an unshuffled read lie within one row group (sent without a copy)",
    )
    sp.add_argument(
        "--row-group-rows",
        type=common.positive_int,
        help="fixed rows per row group (overrides --row-group-mib)",
    )
    sp.add_argument(
        "--shard-mib",
        type=common.positive_int,
        default=256,
        help="target shard size, uncompressed (default 256)",
    )
    sp.add_argument(
        "--shard-rows", type=common.positive_int, help="fixed rows per shard (overrides --shard-mib)"
    )
    common.quiet_option(sp, "no progress bar or summary; print only NAME@VERSION")
