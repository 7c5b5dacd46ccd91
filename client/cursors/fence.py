"""Runs of a job: which process may write each rank's cursors (pure, no I/O).

A job outlives its processes: it is restarted after a crash or a preemption, sometimes with another
world size, while a process of the earlier run may still be alive (a hung node, a scheduler that
started the replacement before the old one died). Such a *stale* process must never overwrite what
the new run committed. So every process that writes a rank's cursors first *claims* that rank in the
store, and every write says which claim it comes from.

- Each process has one token, `host:pid:random`, made once (`process_token`): a process that opens
  a new Loader for the same rank (every epoch, say) stays the same run.
- The store keeps, per job, the world size of its current run, a counter, and per rank a *slot*: the
  generation and token of the process that holds it. The counter only grows, so each claim that takes
  a slot over gets a generation never used before in the job.
- `decide_claim` says what a claim does (every store applies it atomically: a Lua script in Redis,
  one transaction in SQLite):
    * another world size than the job's current one: every slot is dropped (no rank of the earlier
      run may write again), then the rank's slot is taken with a new generation;
    * the slot is held by this process: its generation is kept;
    * otherwise the slot is taken over with a new generation (a restarted rank, or a new run).
- A write carries its generation and is refused with `StaleRunError` unless its process still holds
  the slot (both errors are shardstream/errors.py's). A store that holds no run of the job at all (wiped, or restarted without persistence)
  answers `UnclaimedError` instead: the writer claims again and retries. So does a store whose run of
  the job never issued that generation: a run state is created with its counter at a random `base`
  (`new_run_base`), so the generations of one run state are (base, counter] and a generation from a
  run state the store has since lost (Redis wiped mid-run, then another rank claimed first and made
  a new one) falls outside it (`issued_by`) — the writer claims again instead of being called stale.
  (Redis and the in-memory store; an SQLite file is not emptied under running ranks.) A step completes only when every rank's record of it was written by the slot's current
  holder, so records that a replaced process wrote before its replacement started never count.

What this cannot tell apart without a coordinator: a rank restarted alone while its peers keep going
(the demo does this: the restarted rank takes over its own slot only, its peers keep writing) and a
new run whose other ranks have not started yet. So a process of an earlier run with the same world
size can still write until its own rank is claimed again. Its record then completes a step only
together with records of the slots' current holders under the same cursor key (world size, dataset,
epoch, offset): the cursor the new run itself commits at that step.

The run state is versioned (`RUN_FORMAT`) where it is stored. Records written before runs existed
carry no generation: they count as before, and a job with no run state gets one at its first claim.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass

__all__ = [
    "RUN_FORMAT",
    "Claim",
    "Run",
    "Slot",
    "decide_claim",
    "issued_by",
    "new_run_base",
    "process_token",
    "stale_message",
]

RUN_FORMAT = 1

_token: tuple[int, str] | None = None  # (pid, token): a forked child makes its own


def process_token() -> str:
    """This process's run token: host:pid:8 random hex digits, made once per process."""
    global _token
    pid = os.getpid()
    if _token is None or _token[0] != pid:
        _token = (pid, f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}")
    return _token[1]


@dataclass(frozen=True)
class Slot:
    """Who holds one rank of a job: the claim's generation, the process token, when (Unix seconds)."""

    gen: int
    token: str
    time: float = 0.0


@dataclass(frozen=True)
class Run:
    """A job's run as stored: the world size of its current run and who holds each rank."""

    world_size: int
    slots: dict[int, Slot]


@dataclass(frozen=True)
class Claim:
    gen: int  # the generation this process writes the rank with
    counter: int  # the job's counter after the claim
    clear: bool  # drop every slot first (the world size changed)
    take: bool  # write the rank's slot (a new holder)


def decide_claim(
    *, world_size_now: int | None, counter: int, holder: Slot | None, world_size: int, token: str
) -> Claim:
    """What a claim of a rank by `token` does, given the job's run state (see the module docstring)."""
    if world_size_now != world_size:
        return Claim(gen=counter + 1, counter=counter + 1, clear=True, take=True)
    if holder is not None and holder.token == token:
        return Claim(gen=holder.gen, counter=counter, clear=False, take=False)
    return Claim(gen=counter + 1, counter=counter + 1, clear=False, take=True)


def new_run_base() -> int:
    """Where a new run state's generation counter starts: random, so that two run states of one job
    (before and after a store lost it) issue disjoint generations. 2^40 keeps it exact in Redis' Lua."""
    return secrets.randbelow(1 << 40)


def issued_by(gen: int, base: int, counter: int) -> bool:
    """Whether the run state with this base and counter issued generation `gen`."""
    return base < gen <= counter


def stale_message(
    job: str, rank: int, gen: int, holder: Slot | None, world_size_now: int | None, step: int
) -> str:
    """The one line a stale process gets when it tries to commit `step`."""
    if holder is None:
        newer = f"a newer run of world size {world_size_now} owns the job"
    else:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.time)) if holder.time else "?"
        newer = (
            f"a newer run owns rank {rank} (process {holder.token}, generation {holder.gen}, since {when})"
        )
    return (
        f"job {job!r}: {newer}; this process (generation {gen}) is a stale run of the job and may "
        f"not commit step {step} — stop it (the job was restarted; the new run keeps its cursors)"
    )
