"""Where a job resumes: the cursor its ranks committed at a checkpoint step, read from the cursor store.

`committed_state(store, job, resume, target, rank=r)` reads the records of the step (`resume` is a
step number or "latest", the newest step all ranks wrote), checks that they belong to it and
agree — and, given `min_step` (the step of the model checkpoint being restored), that "latest" is not
older than it: a store that lost commits (a Redis restart without an append-only file, a rollback to
an older snapshot) would otherwise pair that checkpoint with an older data cursor, silently — and — when the job was moved to another dataset version with `shardstream cursor migrate` —
moves the state to that version at the epoch boundary the move named. Anything else is one clear
error: a step not committed, a record that is not what it claims, a fingerprint with no move.
"""

from __future__ import annotations

import dataclasses
import json

from shardstream.errors import (
    CorruptCursorError,
    CursorStoreBehindError,
    FailedPreconditionError,
    NoCommittedStepError,
)

from ..loader_state import LoaderState
from ..target import Target
from .records import CursorRecord, Migration
from .stores import CursorStore

__all__ = ["committed_state"]


def committed_state(
    store: CursorStore,
    job: str,
    resume: str | int,
    target: Target,
    *,
    min_step: int | None = None,
    rank: int = 0,
) -> tuple[LoaderState, int]:
    """The job's committed state at step `resume` ("latest" or a step), on `target`, and that step.

    Rank 0 reads and checks every rank's record of the step; any other rank only its own (when the
    step has it) and rank 0's. A restart of W ranks at once so reads ~2W records from the store, not
    W² (a rank's HGETALL of all W records made 1,000 ranks pull ~0.5 GB through one Redis thread and
    miss its 2 s timeout: loadtest/README.md, "The fleet at scale"). Rank 0's full check still stops
    the job on a corrupt or disagreeing record of any rank, and every rank checks the records it reads."""

    def records_of(step: int) -> dict[int, bytes]:
        return store.read(job, step) if rank == 0 else store.read_ranks(job, step, sorted({rank, 0}))

    if resume == "latest":
        latest = store.latest(job)
        if min_step is not None and (latest is None or latest < min_step):
            have = f"latest committed step is {latest}" if latest is not None else "has no committed step"
            raise CursorStoreBehindError(
                f"job {job!r}: the cursor store {store.url} {have}, older than step {min_step} of the checkpoint "
                f"being restored (resume_min_step={min_step}): the store lost commits (a Redis restart without an "
                "append-only file, or a rollback to an older snapshot). Restore the Loader state saved with that "
                "checkpoint (load_state_dict)"
                + (
                    f", or resume={latest} with the model checkpoint of step {latest}"
                    if latest is not None
                    else ""
                )
            )
        if latest is None:
            raise NoCommittedStepError(f"job {job!r} has no step committed by all its ranks in {store.url}")
        step = latest
    else:
        step = int(resume)
        if not records_of(step):
            written = store.steps(job).get(step, 0)
            committed = store.committed(job)
            raise NoCommittedStepError(
                f"job {job!r}: step {step} is not committed (ranks written: {written}); "
                f"committed steps: {committed[-5:] or 'none'} in {store.url}"
            )
    where = f"cursor store {store.url}, job {job!r}, step {step}"
    records = {r: CursorRecord.from_bytes(b, where=f"{where}, rank {r}") for r, b in records_of(step).items()}
    for r, rec in records.items():
        if rec.job != job or rec.step != step or rec.rank != r:
            raise CorruptCursorError(
                f"{where}, rank {r}: the record belongs to job {rec.job!r} step {rec.step} rank {rec.rank}"
            )
    states = {
        (
            rec.state.fingerprint,
            rec.state.epoch,
            rec.state.offset,
            json.dumps(rec.state.schedule, sort_keys=True),
        )
        for rec in records.values()
    }
    if len(states) != 1:
        raise CorruptCursorError(f"{where}: ranks disagree on the cursor ({sorted(states)})")
    state = next(iter(records.values())).state
    if state.fingerprint != target.fingerprint:
        state = _migrated(store, job, state, target, where)
    return state, step


def _migrated(store: CursorStore, job: str, state: LoaderState, target: Target, where: str) -> LoaderState:
    """The committed state moved to the target's dataset version, if `cursor migrate` said so."""
    raw = store.get_migration(job)
    mig = Migration.from_bytes(raw, where=f"{where} (migration)") if raw is not None else None
    if mig is None or (mig.from_fingerprint, mig.to_fingerprint) != (state.fingerprint, target.fingerprint):
        raise FailedPreconditionError(
            f"job {job!r} was committed on {state.dataset} (fingerprint {state.fingerprint[:12]}…) but this "
            f"loader reads {target.label} (fingerprint {target.fingerprint[:12]}…); move the job explicitly "
            f"with `shardstream cursor migrate {job} --to {target.label}`"
        )
    if state.epoch < mig.at_epoch:
        raise FailedPreconditionError(
            f"job {job!r} is in epoch {state.epoch} of {state.dataset} (offset {state.offset}); its move "
            f"to {target.label} takes effect at epoch {mig.at_epoch}: finish the epoch on {state.dataset} "
            f"(Loader(..., {state.dataset!r}, epochs={mig.at_epoch}) and commit at its end), then resume here"
        )
    return dataclasses.replace(state, dataset=target.label, fingerprint=target.fingerprint, offset=0)
