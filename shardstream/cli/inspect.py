"""`shardstream inspect`: which samples rank R gets at step T, computed from the read plan alone.

Only the id column (or, with --show, the rows) is read from the shards; nothing is written.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardstream.errors import InvalidArgumentError
from shardstream.inspect import StepSamples, make_selector, shuffle_stats, step_samples
from shardstream.manifest import Manifest
from shardstream.mixture import is_mixture, parse_mixture
from shardstream.plan import ShuffleSpec, StepLayout
from shardstream.registry import Registry

from . import common

__all__ = ["add_commands"]


def _cmd_inspect(args: argparse.Namespace) -> int:
    with common.open_registry(args) as reg:
        return _inspect(args, reg)


def _inspect(args: argparse.Namespace, reg: Registry) -> int:
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
    common.print_table(table)
    return 0


def _short(value: object, limit: int = 40, from_left: bool = False) -> str:
    text = str(value)
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if from_left else text[: limit - 1] + "…"


def _inspect_columns(
    args: argparse.Namespace, reg: Registry, manifests: list[Manifest], smp: StepSamples
) -> dict[str, list[Any]]:
    """The id column (if every source has it) or, with --show, the requested columns, read from the shards."""
    common_names = [n for n in manifests[0].schema.names if all(n in m.schema.names for m in manifests)]
    if args.show:
        wanted = args.columns.split(",") if args.columns else common_names
    else:
        wanted = [args.id_column] if args.id_column in common_names else []
    if not wanted or not len(smp.rows):
        return {}
    unknown = [c for c in wanted if c not in common_names]
    if unknown:
        raise InvalidArgumentError(f"unknown column(s) {unknown}; columns are: {', '.join(common_names)}")
    from shardstream.server.reader import DatasetReader, new_row_group_cache

    cache = new_row_group_cache(256 << 20)
    out: dict[str, list[Any]] = {c: [None] * len(smp.rows) for c in wanted}
    for s in sorted(set(smp.sources.tolist())):
        m = manifests[s]
        reader = DatasetReader(m, [reg.shard_path(m, sh.uri) for sh in m.shards], cache)
        idx = [i for i, src in enumerate(smp.sources.tolist()) if src == s]
        batch = reader.take(smp.rows[idx], wanted)
        for c in wanted:
            for i, v in zip(idx, batch.column(c).to_pylist(), strict=True):
                out[c][i] = v
    return out


def add_commands(sub: Any) -> None:
    sp = common.add_command(
        sub,
        "inspect",
        _cmd_inspect,
        help="which samples rank R gets at step T (from the plan alone)",
        description="Compute, from the read plan alone (the same functions the servers run), which samples a rank "
        "gets at a step: global positions, shard, row, row group and the id column. --show prints the rows "
        "themselves; --stats reports the configuration's read locality and shuffle quality instead, to help "
        "pick --window.",
        epilog=common.examples(
            "shardstream inspect toy@1 --root ./datasets",
            "shardstream inspect toy@1 --world-size 8 --batch-size 32 --rank 3 --step 12 --seed 7",
            "shardstream inspect toy@1 --shuffle none --batch-size 4 --show --columns id,text",
            "shardstream inspect 'web@2:0.7,code@1:0.3' --world-size 4 --rank 1 --json",
            "shardstream inspect toy@1 --shuffle block --window 4 --stats",
        ),
    )
    sp.add_argument("dataset", help="NAME[@VERSION|@TAG], or a mixture 'a@1:0.7,b@2:0.3'")
    common.root_options(sp)
    sp.add_argument("--seed", type=int, default=0, help="the job's seed (default 0)")
    sp.add_argument("--world-size", type=common.positive_int, default=1, help="ranks in the job (default 1)")
    sp.add_argument(
        "--batch-size", type=common.positive_int, default=32, help="per-rank batch size (default 32)"
    )
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
    sp.add_argument(
        "--window", type=common.positive_int, help="blocks per window for --shuffle block (default 16)"
    )
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
    common.json_option(sp)
