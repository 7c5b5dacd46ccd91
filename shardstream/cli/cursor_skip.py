"""`shardstream cursor skip --job J --steps A:B`: skip global steps of a job from its committed cursor.

What `Loader(skip_steps=[(A, B)])` does, done on the job's latest committed cursor (after a loss
spike: the job resumes from its checkpoint and never sees the data of steps A..B-1). Steps are the
job's global steps as its Loaders count them (`steps` of the cursor: those delivered so far; a
skipped step gets no number). Every rank's record of the committed step gets the range, without
positions: the Loader that resumes the job places it from the cursor with its own world size and
records the positions it covers (client/schedule_state.py). The records are rewritten in place,
all ranks, unfenced (a tool's write); rerunning the command finishes an interrupted one. A range
that starts before the cursor's step is refused: its first steps were delivered.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from shardstream.errors import InvalidArgumentError, NoCommittedStepError
from shardstream.order.schedule import parse_ranges

from . import common

__all__ = ["add_skip_command"]


def _cmd_cursor_skip(args: argparse.Namespace) -> int:
    from shardstream.client.cursors.records import CursorRecord, validate_job
    from shardstream.client.cursors.stores import DEFAULT_STORE_URL, open_store

    validate_job(args.job)
    ranges = parse_ranges(args.steps, "--steps")
    url = args.store or DEFAULT_STORE_URL
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        # (opening it would create the file)
        raise NoCommittedStepError(f"job {args.job!r} has no committed step in {url}: nothing to skip from")
    store = open_store(url)
    try:
        committed = store.committed(args.job)
        if not committed:
            raise NoCommittedStepError(
                f"job {args.job!r} has no committed step in {store.url}: nothing to skip from"
            )
        step = committed[-1]
        where = f"job {args.job!r} step {step}"
        records = {
            r: CursorRecord.from_bytes(b, where=f"{where} rank {r}")
            for r, b in sorted(store.read(args.job, step).items())
        }
        state = next(iter(records.values())).state
        for a, b in ranges:
            if a < state.steps:
                raise InvalidArgumentError(
                    f"--steps {a}:{b} starts before step {state.steps}, where job {args.job!r} is (its cursor at "
                    f"checkpoint step {step}): steps {a}..{state.steps - 1} were delivered already"
                )
        added = []
        for rank, rec in records.items():
            schedule: dict[str, Any] = dict(rec.state.schedule or {})
            skips = [dict(s) for s in schedule.get("skip") or ()]
            have = {tuple(s["steps"]) for s in skips}
            new = [{"steps": [a, b]} for a, b in ranges if (a, b) not in have]
            added = new
            schedule["skip"] = skips + new
            fresh = dataclasses.replace(rec, state=dataclasses.replace(rec.state, schedule=schedule))
            store.write(args.job, step, fresh.key, rank, rec.world_size, fresh.to_bytes(), durable=True)
    finally:
        store.close()
    out = {
        "job": args.job,
        "step": step,
        "cursor_steps": state.steps,
        "added": [s["steps"] for s in added],
        "skip": schedule["skip"],
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    if not added:
        print(f"job {args.job}: steps {args.steps} were already to be skipped from checkpoint step {step}")
        return 0
    print(
        f"job {args.job}: from checkpoint step {step} (cursor at its step {state.steps}), steps "
        f"{', '.join(f'{a}..{b - 1}' for a, b in out['added'])} will be skipped; resume it with "
        f"Loader(..., job={args.job!r}, resume='latest')"
    )
    return 0


def add_skip_command(csub: Any) -> None:
    sp = common.add_command(
        csub,
        "skip",
        _cmd_cursor_skip,
        help="skip global steps A..B-1 of a job from its latest committed cursor",
        description="Record on JOB's latest committed cursor that its global steps [A, B) are to be skipped "
        "(as Loader(skip_steps=[(A, B)]) does): the Loader that resumes the job never delivers their samples, "
        "counts them (loader.skipped) and moves its cursor past them. Steps are counted as the job's Loaders "
        "count them (the cursor's `steps`: steps delivered so far). Rerunning it is harmless.",
        epilog=common.examples(
            "shardstream cursor skip --job my-job --steps 12000:12200",
            "shardstream cursor skip --job my-job --steps 12000:12200,15000:15010 --store redis://localhost:6379/0",
        ),
    )
    sp.add_argument("--job", required=True, help="job name")
    sp.add_argument("--steps", required=True, help="A:B[,C:D...] global steps to skip, end exclusive")
    common.store_option(sp)
    common.json_option(sp)
