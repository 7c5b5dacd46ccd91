"""`shardstream explain`: what step T of a job contained, and where a sample lands, from the plan alone.

    explain --job JOB --step T [--rank R]     per rank: dataset version, positions, and every sample's
                                              (mixture source,) shard, row and row group; the transforms
                                              the job applied; the samples they skipped (with --server);
                                              under balance=, each rank's rows, tokens and cost and why
                                              (explain_balance.py)
    explain DATASET --sample SHARD:ROW ...     the sample's position in the epoch, its step and rank; in a
                                              mixture (--source NAME@V), each time the epoch takes it

The job's steps come from its cursor store (the Loader's state at each checkpoint, client/loader_state.py)
walked with the plan's pure functions (shardstream/order/explain.py, inspect_command.py, shardstream/order/read_order.py, shardstream/order/mixture.py,
shardstream/order/curriculum.py: mixture phases too); manifests come from the registry (--root), a drop_rows
version's masks included. A mixture's sample: its place in each source epoch's order, then the stream
position of that source count (`position_of`, the plan's lookup inverted, O(phases) + one block).
Nothing is written; only --server reads data. The `--sample` question is explain_sample.py's; this
module holds the command (its parser, options and output) and the job's side.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from shardstream.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NoCommittedStepError,
    NotFoundError,
)
from shardstream.order.curriculum import is_mixture_schedule, parse_mixture_schedule, schedule_sources
from shardstream.order.delivery import Selector, make_selector, step_samples
from shardstream.order.explain import (
    Cursor,
    StepPlace,
    parse_shuffle,
    place_scheduled_step,
    place_step,
)
from shardstream.order.mixture import is_mixture, parse_mixture
from shardstream.order.schedule import Schedule
from shardstream.registry import Registry

from . import common
from .explain_balance import balanced_step
from .explain_sample import explain_sample

__all__ = ["add_commands"]


def _cmd_explain(args: argparse.Namespace) -> int:
    if (args.job is None) == (args.dataset is None):
        raise InvalidArgumentError("give either --job JOB --step T, or DATASET --sample SHARD:ROW")
    if args.job is not None:
        if args.step is None:
            raise InvalidArgumentError("--job needs --step T (the job's step, counted from 0)")
        out = _explain_step(args)
    else:
        if args.sample is None:
            raise InvalidArgumentError("DATASET needs --sample SHARD:ROW")
        out = explain_sample(args)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        _print(out)
    return 0


# --- a job's step ----------------------------------------------------------------------------------
def _records(args: argparse.Namespace) -> tuple[str, list[tuple[int, Any, dict[str, Any]]]]:
    """(store URL, [(checkpoint step, CursorRecord, its raw state dict)]) of the job, one per step."""
    from shardstream.client.cursors.records import CursorRecord, validate_job

    from .cursor_command import _open_for_reading

    validate_job(args.job)
    store, url = _open_for_reading(args.cursor_store or args.store)
    if store is None:
        raise NoCommittedStepError(f"job {args.job!r} has no cursors in {url}")
    try:
        steps = store.committed(args.job) or sorted(store.steps(args.job))
        out = []
        for step in steps:
            records = store.read(args.job, step)
            if not records:
                continue
            rank, raw = min(records.items())
            rec = CursorRecord.from_bytes(raw, where=f"job {args.job!r} step {step} rank {rank}")
            out.append((step, rec, json.loads(raw)["state"]))
    finally:
        store.close()
    if not out:
        raise NoCommittedStepError(f"job {args.job!r} has no cursors in {url}")
    return url, out


def _selector(reg: Registry, state: Any) -> Selector:
    """The dataset or mixture of a recorded state, as the servers plan it; its fingerprint checked."""
    shuffle = parse_shuffle(state.shuffle)
    if is_mixture_schedule(state.dataset):  # mixture phases: every source any phase names
        refs, phases = schedule_sources(parse_mixture_schedule(state.dataset))
        sel = make_selector(
            [reg.resolve(ref) for ref in refs],
            None,
            seed=state.seed,
            shuffle=shuffle,
            mixture_block=state.mixture_block,
            epoch_samples=state.mixture_epoch_samples,
            phases=phases,
        )
    elif is_mixture(state.dataset):
        pairs = parse_mixture(state.dataset)
        manifests = [reg.resolve(ref) for ref, _ in pairs]
        sel = make_selector(
            manifests,
            [w for _, w in pairs],
            seed=state.seed,
            shuffle=shuffle,
            mixture_block=state.mixture_block,
            epoch_samples=state.mixture_epoch_samples,
        )
    else:
        sel = make_selector([reg.resolve(state.dataset)], None, seed=state.seed, shuffle=shuffle)
    if sel.fingerprint != state.fingerprint:
        raise FailedPreconditionError(
            f"the job read {state.dataset} with fingerprint {state.fingerprint[:12]}…; this registry's has "
            f"{sel.fingerprint[:12]}… (another registry, or a mixture recorded by an older client with a "
            "non-default mixture_block / mixture_epoch_samples)"
        )
    return sel


def _schedule(raw: dict[str, Any], num_rows: int, cursor: Cursor) -> Schedule | None:
    """A recorded state's batch-size phases and skip ranges (client/schedule_state.py), None when plain;
    skip ranges recorded as steps only are placed from the cursor, as the Loader that resumes does."""
    saved = raw.get("schedule")
    if not saved:
        return None
    if not saved.get("batch_size") and not saved.get("skip"):
        return None  # mixture phases only: the selector follows them (_selector), the steps are plain
    from shardstream.client.schedule_state import LoaderSchedule, SkipRecord

    loader_schedule = LoaderSchedule(saved.get("batch_size") or cursor.batch_size, ())
    loader_schedule.saved = tuple(SkipRecord.from_json(r) for r in saved.get("skip") or ())
    skips = loader_schedule.records(
        num_rows=num_rows,
        world_size=cursor.world_size,
        drop_last=cursor.drop_last,
        epoch=cursor.epoch,
        offset=cursor.offset,
        steps=cursor.steps,
    )
    schedule = Schedule.of(list(loader_schedule.batch), [r.positions for r in skips if r.positions])
    return None if schedule.is_plain else schedule


def _explain_step(args: argparse.Namespace) -> dict[str, Any]:
    url, records = _records(args)
    before = [r for r in records if r[1].state.steps <= args.step]
    commit_step, rec, raw = (
        max(before, key=lambda r: r[1].state.steps)
        if before
        else min(records, key=lambda r: r[1].state.steps)
    )
    st = rec.state
    newest = max(records, key=lambda r: r[1].state.steps)[1].state
    with common.open_registry(args) as reg:
        sel = _selector(reg, st)
        cursor = Cursor(st.epoch, st.offset, st.steps, st.world_size, st.batch_size, st.drop_last)
        schedule = _schedule(raw, sel.num_rows, cursor)
        if schedule is None:
            place = place_step(sel.num_rows, cursor, args.step)
        else:  # batch-size phases or skip ranges: forward only, from the job's start if need be
            if not before:
                cursor = Cursor(0, 0, 0, st.world_size, st.batch_size, st.drop_last)
            place = place_scheduled_step(sel.num_rows, cursor, schedule, args.step)
        balanced = None
        if raw.get("balance"):  # which rank got which sample is the servers' split of the step's costs
            balanced = balanced_step(reg, sel, raw["balance"], list(st.transforms), place.layout, place.epoch, place.index)
    if newest.epochs and place.epoch >= newest.epochs:
        raise NotFoundError(
            f"step {args.step} is past the job's end: job {args.job!r} runs {newest.epochs} epoch(s) "
            f"(0..{newest.epochs - 1}) and step {args.step} would be in epoch {place.epoch}; its newest "
            f"checkpoint is step {newest.steps} (epoch {newest.epoch})"
        )
    note = None
    if args.step > newest.steps and newest.epochs is not None and not newest.epochs:
        note = (
            f"step {args.step} is after the job's newest checkpoint (step {newest.steps}, epoch {newest.epoch}): "
            "this is where the plan puts it if the job ran on (its cursors do not say how many epochs it runs)"
        )
    world = cursor.world_size
    ranks = [args.rank] if args.rank is not None else list(range(world))
    if any(not 0 <= r < world for r in ranks):
        raise InvalidArgumentError(f"--rank must be in [0, {world}) (the job's world size then)")
    recorded = "transforms" in raw  # states of older clients did not record them
    skipping = bool(st.transforms) and st.on_error == "skip"
    skipped = _read_skipped(args, st, place, ranks) if skipping and args.server else {}
    start, end = place.layout.global_range(place.index)
    out: dict[str, Any] = {
        "job": args.job,
        "store": url,
        "step": args.step,
        "from_cursor": {"checkpoint": commit_step, "steps": st.steps, "epoch": st.epoch, "offset": st.offset},
        "how": place.how,
        "dataset": st.dataset,
        "fingerprint": st.fingerprint,
        "seed": st.seed,
        "shuffle": st.shuffle,
        "world_size": cursor.world_size,
        "batch_size": cursor.batch_size,
        "schedule": raw.get("schedule"),  # batch-size phases, skip ranges (None: none)
        "drop_last": st.drop_last,
        "epoch": place.epoch,
        "global_positions": [start, end],
        "transforms": list(st.transforms) if recorded else None,
        "on_error": st.on_error if recorded else None,
        "ranks": [],
    }
    if note:
        out["note"] = note
    if balanced is not None:
        out["balance"] = balanced.summary()
    for r in ranks:
        mine = balanced.positions(r) if balanced is not None else None
        smp = step_samples(sel, place.layout, place.epoch, place.index, r, mine)
        samples = []
        for i in range(len(smp.positions)):
            m = sel.manifests[int(smp.sources[i])]
            samples.append(
                {
                    "position": int(smp.positions[i]),
                    "source": m.ref,
                    "shard": int(smp.shards[i]),
                    "shard_uri": m.shards[int(smp.shards[i])].uri,
                    "row": int(smp.shard_rows[i]),
                    "row_group": int(smp.row_groups[i]),
                }
            )
        if not skipping:  # without a skipping transform every sample is delivered (or the stream fails)
            rank_skipped: list[dict[str, Any]] | None = []
        else:
            rank_skipped = skipped.get(r)
        positions = (
            [int(smp.positions[0]), int(smp.positions[-1]) + 1] if len(smp.positions) else [start, start]
        )
        share = balanced.rank(r) if balanced is not None else {}
        out["ranks"].append({"rank": r, "positions": positions, "samples": samples, "skipped": rank_skipped, **share})
    return out


def _read_skipped(
    args: argparse.Namespace, st: Any, place: StepPlace, ranks: list[int]
) -> dict[int, list[dict[str, Any]]]:
    """The samples the job's transforms skipped at the step, by rank: the step's positions read once
    from --server (a Loader of world size 1 resumed at the step's start, one batch of the whole step,
    provenance on; whether a sample is skipped depends on its bytes only), each skipped sample given
    to the rank whose slice holds its position."""
    from shardstream.client import Loader
    from shardstream.client.loader_state import LoaderState

    shuffle = parse_shuffle(st.shuffle)
    start, end = place.layout.global_range(place.index)
    with Loader(
        args.server,
        st.dataset,
        batch_size=end - start,
        rank=0,
        world_size=1,
        seed=st.seed,
        shuffle=shuffle.mode,
        shuffle_window=shuffle.window if shuffle.mode == "block" else None,
        epochs=place.epoch + 1,
        transforms=list(st.transforms),
        on_error=st.on_error,
        mixture_block=st.mixture_block,
        mixture_epoch_samples=st.mixture_epoch_samples,
        prefetch=1,
        provenance=True,
        output="arrow",
        **common.client_security(args),  # --tls*, --token-file: a fleet with TLS or --auth
    ) as loader:
        at_step = LoaderState(
            st.dataset, st.fingerprint, st.seed, st.shuffle, place.epoch, start, 1, end - start
        )
        loader.load_state_dict(at_step.to_dict())
        next(iter(loader))
        info = loader.last_batch
        assert info is not None and (info.position_start, info.position_end) == (start, end)
    out: dict[int, list[dict[str, Any]]] = {r: [] for r in ranks}
    for r in ranks:
        lo, hi = place.layout.rank_range(place.index, r)
        out[r] = [asdict(s) for s in info.skipped if lo <= s.position < hi]
    return out


def _print(out: dict[str, Any]) -> None:
    if "job" not in out:  # a sample
        print(
            f"{out['dataset']} shard {out['shard']} ({out['shard_uri']}) row {out['row']} (dataset row {out['dataset_row']})"
        )
        print(f"  {out['config']}")
        print(f"  epoch {out['epoch']}: position {out['position']}")
        if out["step"] is None:
            print(f"  {out['note']}")
        else:
            job = f" (job step {out['job_step']})" if out["job_step"] is not None else ""
            print(f"  step {out['step']}{job}, rank {out['rank']}, row {out['index_in_batch']} of its batch")
        return
    c = out["from_cursor"]
    print(
        f"job {out['job']} step {out['step']} ({out['how']} of checkpoint {c['checkpoint']}: step {c['steps']}, "
        f"epoch {c['epoch']} offset {c['offset']})"
    )
    print(
        f"  {out['dataset']}  seed {out['seed']}  shuffle {out['shuffle']}  world size {out['world_size']}  "
        f"batch size {out['batch_size']}{'  drop_last' if out['drop_last'] else ''}"
    )
    g = out["global_positions"]
    print(f"  epoch {out['epoch']}, global positions [{g[0]}, {g[1]})")
    if out.get("note"):
        print(f"  note: {out['note']}")
    tf = out["transforms"]
    if tf is None:
        print("  transforms: not recorded (a cursor of an older client)")
    else:
        print(f"  transforms: {json.dumps(tf)} (on_error={out['on_error']})" if tf else "  transforms: none")
    b = out.get("balance")
    if b:
        print(f"  balance={b['mode']}: {b['why']}; largest rank cost / mean {b['cost_max_over_mean']}")
    mixture = len({s["source"] for r in out["ranks"] for s in r["samples"]}) > 1 or is_mixture(out["dataset"])
    for r in out["ranks"]:
        p = r["positions"]
        share = ""
        if "cost" in r:
            rows = f"{r['rows']} row(s), {r['tokens']} token(s) with a label, " if "rows" in r else ""
            share = f"; {rows}cost {r['cost']:g} ({r['cost_over_mean']}x the step's mean)"
        within = "within " if b else ""
        print(f"  rank {r['rank']}: positions {within}[{p[0]}, {p[1]}), {len(r['samples'])} sample(s){share}")
        keys = ["position", *(["source"] if mixture else []), "shard", "shard_uri", "row", "row_group"]
        common.print_table([keys] + [[str(s[k]) for k in keys] for s in r["samples"]])
        if r["skipped"] is None:
            print(
                "    skipped: unknown (on_error='skip': give --server HOST:PORT to read the step and list them)"
            )
        elif r["skipped"]:
            for s in r["skipped"]:
                print(
                    f"    skipped: position {s['position']} shard {s['shard']} row {s['row']}: {s['reason']}"
                )
    sys.stdout.flush()


def add_commands(sub: Any) -> None:
    sp = common.add_command(
        sub,
        "explain",
        _cmd_explain,
        help="what step T of a job contained, or where a sample lands (from the plan alone)",
        description="With --job: what the job's step T (counted from 0 over the whole job: the `steps` its cursors "
        "record) contained — per rank the dataset version, global positions and every sample's source, shard, "
        "row and row group, the transforms the job applied and the samples they skipped — from the job's cursor "
        "store and the read plan (the servers' own functions). With DATASET --sample SHARD:ROW: that sample's "
        "position in the epoch's order, and the step and rank that get it.",
        epilog=common.examples(
            "shardstream explain --job run-42 --step 12345 --store redis://redis:6379/0 --root s3://bucket/registry",
            "shardstream explain --job run-42 --step 12345 --rank 3 --json",
            "shardstream explain --job run-42 --step 700 --server 10.0.0.5:7070",
            "shardstream explain toy@1 --sample 0:17 --seed 7 --world-size 8 --batch-size 32",
            "shardstream explain toy@1 --sample part-00003.parquet:42 --epoch 2 --shuffle full --json",
        ),
    )
    sp.add_argument("dataset", nargs="?", help="NAME@VERSION, with --sample")
    sp.add_argument("--job", help="the job's name (Loader(job=...))")
    sp.add_argument(
        "--step",
        type=int,
        help="the job's step T, counted from 0 since the job began: the number of steps before it, as the "
        "Loader's state and commit(T) after T steps count (the loop in docs/jobs.md logs it with the batch)",
    )
    sp.add_argument("--rank", type=int, help="only this rank (default: every rank)")
    common.store_option(sp)
    sp.add_argument("--cursor-store", metavar="URL", help="the same as --store")
    common.root_options(sp)
    sp.add_argument(
        "--server",
        metavar="HOST:PORT[,HOST:PORT]",
        help="read the step from these servers to list the samples a skipping transform left out",
    )
    common.client_security_options(sp)
    sp.add_argument("--sample", metavar="SHARD:ROW", help="a shard (index, uri or file name) and a row in it")
    sp.add_argument(
        "--source", metavar="NAME@V", help="with a mixture as DATASET: the source the sample is of"
    )
    sp.add_argument(
        "--mixture-block", type=int, default=0, help="with a mixture: the job's mixture_block (default 0)"
    )
    sp.add_argument(
        "--mixture-epoch-samples",
        type=int,
        default=0,
        help="with a mixture: the job's mixture_epoch_samples (default 0)",
    )
    sp.add_argument("--seed", type=int, default=0, help="the job's seed (default 0)")
    sp.add_argument("--world-size", type=common.positive_int, default=1, help="ranks in the job (default 1)")
    sp.add_argument(
        "--batch-size", type=common.positive_int, default=32, help="per-rank batch size (default 32)"
    )
    sp.add_argument("--epoch", type=int, default=0, help="epoch (default 0)")
    sp.add_argument("--offset", type=int, default=0, help="global offset the epoch's steps start from")
    sp.add_argument(
        "--shuffle", default="block", help="none | full | block (default: block, as Loader shuffle=True)"
    )
    sp.add_argument(
        "--window", type=common.positive_int, help="blocks per window for --shuffle block (default 16)"
    )
    sp.add_argument(
        "--drop-last", action="store_true", help="the job drops each epoch's incomplete last step"
    )
    common.json_option(sp)
