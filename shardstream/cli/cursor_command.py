"""`shardstream cursor list|show|migrate|skip`: what jobs committed, moving a job to a new version, and
skipping steps of a job from its committed cursor (cursor_skip.py).

`list` and `show` only read. An embedded (sqlite) store that does not exist yet holds no jobs, and no
cursor command creates it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardstream.errors import FailedPreconditionError, InvalidArgumentError, NoCommittedStepError
from shardstream.manifest import DatasetRef
from shardstream.order.mixture import is_mixture

from . import common
from .cursor_skip import add_skip_command

if TYPE_CHECKING:
    from shardstream.client.cursors.stores import CursorStore

__all__ = ["add_commands"]


def _open_for_reading(url: str | None) -> tuple[CursorStore | None, str]:
    """(the store, its URL), or (None, URL) for an embedded store file that does not exist."""
    from shardstream.client.cursors.stores import DEFAULT_STORE_URL, open_store

    url = url or DEFAULT_STORE_URL
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else ""
    if path and not Path(path).is_file():
        return None, url  # opening it would create the file (and its directory)
    return open_store(url), url


def _cmd_cursor_list(args: argparse.Namespace) -> int:
    store, url = _open_for_reading(args.store)
    rows: list[dict[str, Any]] = []
    try:
        for job in store.jobs() if store is not None else ():
            committed = store.committed(job)
            rows.append(
                {
                    "job": job,
                    "committed_steps": len(committed),
                    "latest": committed[-1] if committed else None,
                    "steps_written": len(store.steps(job)),
                }
            )
    finally:
        if store is not None:
            store.close()
    if args.json:
        print(json.dumps(rows, indent=1))
    elif not rows:
        print(f"no jobs in {url}", file=sys.stderr)
    else:
        table = [("JOB", "LATEST", "COMMITTED", "WRITTEN")] + [
            (
                r["job"],
                str(r["latest"] if r["latest"] is not None else "-"),
                str(r["committed_steps"]),
                str(r["steps_written"]),
            )
            for r in rows
        ]
        common.print_table(table)
    return 0


def _cmd_cursor_show(args: argparse.Namespace) -> int:
    from shardstream.client.cursors.records import CursorRecord, validate_job

    validate_job(args.job)
    store, url = _open_for_reading(args.store)
    if store is None:
        raise NoCommittedStepError(f"job {args.job!r} has no cursors in {url}")
    try:
        steps = store.steps(args.job)
        committed = store.committed(args.job)
        if not steps:
            raise NoCommittedStepError(f"job {args.job!r} has no cursors in {store.url}")
        step = args.step if args.step is not None else (committed[-1] if committed else max(steps))
        records = [
            CursorRecord.from_bytes(b, where=f"job {args.job!r} step {step} rank {r}").describe()
            for r, b in sorted(store.read(args.job, step).items())
        ]
        run = store.run(args.job)
    finally:
        store.close()
    out = {
        "job": args.job,
        "store": store.url,
        "committed": committed,
        "written": steps,
        "step": step,
        "step_committed": step in committed,
        "ranks": records,
        # who may commit now: the world size of the job's current run, and the process holding each rank
        "run": None
        if run is None
        else {
            "world_size": run.world_size,
            "ranks": [
                {"rank": r, "generation": slot.gen, "process": slot.token, "since": slot.time}
                for r, slot in run.slots.items()
            ],
        },
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"job {args.job} in {store.url}")
    print(
        f"  committed steps  {', '.join(map(str, committed[-10:])) or 'none'}{' …' if len(committed) > 10 else ''}"
    )
    if run is not None:
        held = ", ".join(
            f"rank {r} by {slot.token} (generation {slot.gen})" for r, slot in list(run.slots.items())[:4]
        )
        more = f", … {len(run.slots) - 4} more" if len(run.slots) > 4 else ""
        print(f"  run              world size {run.world_size}: {held or 'no rank claimed'}{more}")
    partial = {s: n for s, n in steps.items() if s not in committed}
    if partial:
        print(f"  partial steps    {', '.join(f'{s} ({n} ranks)' for s, n in list(partial.items())[-5:])}")
    print(f"  step {step} ({'committed' if step in committed else 'NOT committed'}):")
    for r in records:
        print(
            f"    rank {r['rank']}/{r['world_size']}  {r['dataset']}  epoch {r['epoch']}  offset {r['offset']}  "
            f"batch {r['batch_size']}"
        )
    return 0


def _cmd_cursor_migrate(args: argparse.Namespace) -> int:
    from shardstream.client.cursors.records import CursorRecord, Migration, validate_job

    validate_job(args.job)
    store, url = _open_for_reading(args.store)
    if store is None:
        raise NoCommittedStepError(f"job {args.job!r} has no committed step in {url}: nothing to migrate")
    try:
        committed = store.committed(args.job)
        if not committed:
            raise NoCommittedStepError(
                f"job {args.job!r} has no committed step in {store.url}: nothing to migrate"
            )
        step = committed[-1]
        records = store.read(args.job, step)
        rec = CursorRecord.from_bytes(next(iter(records.values())), where=f"job {args.job!r} step {step}")
        state = rec.state
        if is_mixture(state.dataset):
            raise InvalidArgumentError("moving a mixture job to new versions is not supported yet")
        old = DatasetRef.parse(state.dataset)
        with common.open_registry(args) as reg:
            new = reg.resolve(args.to)
            if new.name != old.name:
                raise InvalidArgumentError(
                    f"job {args.job!r} reads {old.name}; --to {args.to} is another dataset"
                )
            lineage = [new.version]
            m = new
            while m.parent is not None and m.version != old.version:
                m = reg.resolve(f"{m.name}@{m.parent}")
                lineage.append(m.version)
        if old.version not in lineage:
            raise FailedPreconditionError(
                f"{new.ref} does not descend from {state.dataset} (its lineage: "
                f"{' <- '.join(f'v{v}' for v in lineage)}): refusing to move job {args.job!r}"
            )
        if new.fingerprint == state.fingerprint:
            print(
                f"{new.ref} has the same content as {state.dataset}: job {args.job!r} can resume on it as is"
            )
            return 0
        at_epoch = state.epoch + 1 if state.offset > 0 else state.epoch
        store.set_migration(
            args.job,
            Migration(
                args.job, state.dataset, state.fingerprint, new.ref, new.fingerprint, at_epoch
            ).to_bytes(),
        )
    finally:
        store.close()
    print(
        f"job {args.job}: moves from {state.dataset} to {new.ref} (lineage {' <- '.join(f'v{v}' for v in lineage)}) "
        f"at epoch {at_epoch}; resume it with Loader(..., {new.ref!r}, job={args.job!r}, resume='latest')"
    )
    return 0


def add_commands(sub: Any) -> None:
    cur = common.add_command(
        sub,
        "cursor",
        None,
        help="job cursors: list jobs, show a job's committed steps, move a job to a new version, skip steps",
        description="Inspect the cursors jobs commit per checkpoint step (Loader(job=..., "
        "cursor_store=...)). --store defaults to $SHARDSTREAM_CURSOR_STORE or "
        "sqlite:///.shardstream/cursors.db.",
        epilog=common.examples(
            "shardstream cursor list --store redis://localhost:6379/0",
            "shardstream cursor show my-job --store sqlite:///.shardstream/cursors.db",
            "shardstream cursor --store redis://localhost:6379/0 migrate my-job --to toy@2 --root ./datasets",
        ),
    )
    csub = cur.add_subparsers(dest="cursor_command", metavar="SUBCOMMAND", required=True)
    sp = common.add_command(
        csub,
        "list",
        _cmd_cursor_list,
        help="every job with its latest committed step",
        description="Every job in the cursor store with its latest committed step, its number of committed "
        "steps and of steps written by at least one rank.",
        epilog=common.examples(
            "shardstream cursor list",
            "shardstream cursor list --store redis://localhost:6379/0 --json",
        ),
    )
    common.store_option(sp)
    common.json_option(sp)
    sp = common.add_command(
        csub,
        "show",
        _cmd_cursor_show,
        help="one job: committed steps and every rank's cursor at a step",
        description="The committed and partial steps of JOB, and every rank's cursor (dataset version, epoch, "
        "offset, batch size) at --step, by default the latest committed one.",
        epilog=common.examples(
            "shardstream cursor show my-job",
            "shardstream cursor show my-job --step 1200 --store redis://localhost:6379/0 --json",
        ),
    )
    sp.add_argument("job", help="job name")
    common.store_option(sp)
    sp.add_argument("--step", type=int, help="which step (default: the latest committed)")
    common.json_option(sp)
    sp = common.add_command(
        csub,
        "migrate",
        _cmd_cursor_migrate,
        help="move a job to a newer version of its dataset, at its next epoch boundary",
        description="Record that JOB moves from the dataset version of its latest committed cursor to --to, "
        "which must descend from it (its parent chain in the registry). The move takes effect at the job's next "
        "epoch boundary; a Loader on the new version then resumes the job. Without it, resuming on another "
        "version is refused.",
        epilog=common.examples(
            "shardstream cursor migrate my-job --to toy@2 --root ./datasets",
            "shardstream --root s3://bucket/registry cursor migrate my-job --to web@prod --store redis://localhost:6379/0",
        ),
    )
    sp.add_argument("job", help="job name")
    sp.add_argument("--to", required=True, help="NAME@VERSION to move to")
    common.store_option(sp)
    common.root_options(sp)
    add_skip_command(csub)
    common.add_global_options(cur, common.accepted_globals(list(csub.choices.values())))
