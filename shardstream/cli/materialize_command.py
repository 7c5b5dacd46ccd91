"""`shardstream materialize`: precompute deterministic transforms as a dataset (needs the server extra;
`--engine spark` the spark extra, `--engine ray` the ray extra)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shardstream.errors import InvalidArgumentError
from shardstream.lineage import CLAIMS

from . import common

__all__ = ["add_commands"]

ENGINES = ("local", "spark", "ray")


def _transforms(text: str) -> Any:
    """The --transforms value: JSON, or @FILE holding it."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise InvalidArgumentError(
                f"--transforms {text}: cannot read the file ({exc.strerror or exc})"
            ) from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"--transforms is not valid JSON ({exc})") from exc


def _runner(engine: str, master: str | None) -> Any:
    if engine == "spark":
        from shardstream.engines.spark_io import materialize_runner, session

        return materialize_runner(session("shardstream materialize", master))
    if engine == "ray":
        from shardstream.engines.ray_io import materialize_runner

        return materialize_runner()
    from shardstream.server.writing.materialize import run_local

    return run_local


def _cmd_materialize(args: argparse.Namespace) -> int:
    from shardstream.server.backends.roots import open_registry
    from shardstream.server.writing.materialize import materialize

    transforms = _transforms(args.transforms)
    columns = [c for c in (args.columns or "").split(",") if c]
    if args.spark_master is not None and args.engine != "spark":
        raise InvalidArgumentError("--spark-master applies to --engine spark only")
    with open_registry(args.root, s3_endpoint=args.s3_endpoint) as reg:
        m = materialize(
            reg,
            args.source,
            transforms,
            args.name,
            columns=columns,
            run=_runner(args.engine, args.spark_master),
            threads=args.threads,
            row_group_bytes=args.row_group_mib << 20,
            change=args.change,
            s3_endpoint=args.s3_endpoint,
        )
    print(m.ref, flush=True)
    if not args.quiet:
        d = m.derived_from
        assert d is not None
        print(
            f"  {m.num_rows} rows in {len(m.shards)} shard(s), {common.human_bytes(m.num_bytes)}, from {d.source}, "
            f"fingerprint {m.fingerprint[:16]}",
            file=sys.stderr,
        )
    return 0


def add_commands(sub: Any) -> None:
    sp = common.add_command(
        sub,
        "materialize",
        _cmd_materialize,
        help="run deterministic transforms over a version once and register the output as a dataset",
        description="Apply server-side transforms (the Loader's transforms=[...] form) to every row of "
        "SOURCE — decode and resize images, tokenize text, decode audio and video frames, window RL "
        "episodes — and register the result as the next version of --name, whose lineage records "
        "SOURCE's version and fingerprint, the columns and the transforms (`datasets show` prints "
        "them). Serving it then needs no decode, and its rows are byte for byte what the online "
        "transforms give. Only deterministic transforms: random augmentation (image.decode crop "
        "'random' or hflip, audio.decode crop 'random') and text.pack (its rows depend on the reader's "
        "batch and world size) are refused — apply them online. A sample a transform cannot process "
        "fails the run naming version, shard and row; nothing is registered then. One task per source "
        "shard: in this process (--engine local, the default), in Spark tasks (--engine spark: the "
        "active or a new SparkSession; needs the spark extra) or in Ray tasks (--engine ray: ray.init(), "
        "RAY_ADDRESS to join a cluster; needs the ray extra). Prints NAME@VERSION. Needs the server extra.",
        epilog=common.examples(
            "shardstream materialize images@3 --name images-224 --transforms "
            '\'[{"op": "image.decode", "column": "image", "size": [224, 224]}]\'',
            "shardstream materialize web@5 --name web-tok --columns text --transforms "
            '\'[{"op": "text.tokenize", "column": "text"}]\' --engine spark',
            "shardstream materialize episodes@2 --name windows --transforms @windows.json --engine ray",
        ),
    )
    sp.add_argument("source", help="the version to read: NAME@VERSION, NAME (latest) or NAME@TAG")
    sp.add_argument("--name", required=True, help="the dataset to write (another name than the source's)")
    sp.add_argument(
        "--transforms",
        required=True,
        help='a JSON list of transforms as a Loader takes them, e.g. \'[{"op": "image.decode", "column": '
        '"image", "size": [224, 224]}]\', or @FILE holding it',
    )
    sp.add_argument(
        "--columns",
        help="comma-separated columns to read and keep (default: all); the transforms see only these",
    )
    sp.add_argument("--engine", choices=ENGINES, default="local", help="where the tasks run (default local)")
    sp.add_argument(
        "--spark-master", help="with --engine spark: the master URL (default: spark-submit's, else local[*])"
    )
    sp.add_argument(
        "--threads",
        type=common.threads,
        help="threads per task for per-sample work (default: the CPUs with --engine local, 1 in engine tasks)",
    )
    sp.add_argument(
        "--row-group-mib",
        type=common.positive_int,
        default=4,
        help="target row-group size of the output (default 4; the power of two of rows nearest it)",
    )
    sp.add_argument(
        "--change",
        choices=CLAIMS,
        help="the change from --name's latest version, checked before writing (default: inferred; a first "
        "version is a create)",
    )
    common.root_options(sp)
    common.quiet_option(sp, "no summary; print only NAME@VERSION")
