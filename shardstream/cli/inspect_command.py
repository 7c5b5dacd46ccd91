"""`shardstream inspect`: which samples rank R gets at step T, computed from the read plan alone.

Only the id column (or, with --show, the rows) is read from the shards; nothing is written. Schedules
are understood (DESIGN §7): --batch-size takes batch-size phases ('0:8,1000000:16'), --skip skipped job
positions, and the dataset may be mixture phases ('0=a@1:0.7,b@2:0.3;2000000=a@1:0.5,b@2:0.5').
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from shardstream.errors import InvalidArgumentError
from shardstream.manifest import Manifest
from shardstream.order.curriculum import is_mixture_schedule, parse_mixture_schedule, schedule_sources
from shardstream.order.delivery import StepSamples, make_selector, shuffle_stats, step_samples
from shardstream.order.mixture import is_mixture, parse_mixture
from shardstream.order.read_order import ShuffleSpec
from shardstream.order.schedule import Schedule, job_position, parse_batch_schedule, parse_ranges
from shardstream.order.scheduled_steps import make_layout
from shardstream.registry import Registry

from . import common

__all__ = ["add_commands"]


def _cmd_inspect(args: argparse.Namespace) -> int:
    with common.open_registry(args) as reg:
        return _inspect(args, reg)


def _inspect(args: argparse.Namespace, reg: Registry) -> int:
    phases = None
    if is_mixture_schedule(args.dataset):
        refs, phases = schedule_sources(parse_mixture_schedule(args.dataset))
        manifests, weights = [reg.resolve(ref) for ref in refs], None
    elif is_mixture(args.dataset):
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
        phases=phases,
    )
    schedule = Schedule.of(parse_batch_schedule(args.batch_size), parse_ranges(args.skip, "--skip"))
    layout = make_layout(
        sel.num_rows,
        args.offset,
        args.world_size,
        schedule.first_batch,
        args.drop_last,
        epoch=args.epoch,
        schedule=schedule,
    )
    what = (
        f"{sel.label} epoch {args.epoch}, seed {args.seed}, shuffle {spec}, world size {args.world_size}, "
        f"batch size {args.batch_size}{', drop_last' if args.drop_last else ''}"
        f"{f', skipping {args.skip}' if args.skip else ''}"
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
    start = job_position(args.epoch, smp.global_range[0], sel.num_rows)
    header = {
        "config": what,
        "step": args.step,
        "steps_in_epoch": layout.num_steps,
        "rank": args.rank,
        "global_positions": list(smp.global_range),
        "job_position": start,  # epoch * N + offset: what schedules are keyed by
        "batch_size": schedule.batch_at(start),
        "skipped_before": schedule.skipped_between(0, start),
        "rank_positions": [
            int(smp.positions[0]) if len(smp.positions) else None,
            int(smp.positions[-1]) + 1 if len(smp.positions) else None,
        ],
    }
    weights_at = getattr(sel.order, "plan", None)
    if phases is not None and weights_at is not None:
        header["mixture_weights"] = weights_at.weights_at(start)
    if args.json:
        print(json.dumps({**header, "samples": records}, indent=1, default=str))
        return 0
    print(what)
    if not schedule.is_plain or phases is not None:
        mix = f", mixture {header['mixture_weights']}" if "mixture_weights" in header else ""
        print(
            f"job position {start}: batch size {header['batch_size']}{mix}, "
            f"{header['skipped_before']} sample(s) skipped before it"
        )
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
    from shardstream.server.read.reader import DatasetReader, new_row_group_cache

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
            "shardstream inspect toy@1 --world-size 4 --batch-size 0:8,1000000:16 --epoch 3 --step 5",
            "shardstream inspect '0=web@2:0.7,code@1:0.3;2000000=web@2:0.5,code@1:0.5' --skip 12000:12800",
        ),
    )
    sp.add_argument("dataset", help="NAME[@VERSION|@TAG], or a mixture 'a@1:0.7,b@2:0.3'")
    common.root_options(sp)
    sp.add_argument("--seed", type=int, default=0, help="the job's seed (default 0)")
    sp.add_argument("--world-size", type=common.positive_int, default=1, help="ranks in the job (default 1)")
    sp.add_argument(
        "--batch-size",
        default="32",
        help="per-rank batch size (default 32), or batch-size phases OFFSET:SIZE,... keyed by job position",
    )
    sp.add_argument(
        "--skip",
        help="job positions START:END[,...] the job never delivers (its skip ranges, as a state records)",
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
