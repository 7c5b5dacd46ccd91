"""Faults of processes: servers killed or drained, trainer ranks killed, the job resized, Redis lost.

Each function runs one fault against real processes (Ctx) and returns its row (chaos_ctx.row); the
fault's own schedule (kill every N s, drain one server after another) uses timers — that is the
fault — while everything else waits on what the processes log.
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Any

from shardstream.client.cursors.stores import open_store

from .chaos_ctx import Ctx, Row, row
from .chaos_job import Job, Phase

__all__ = [
    "kill9_servers",
    "rank_kills",
    "rank_kills_late",
    "redis_restart",
    "redis_wipe_down",
    "redis_wipe_midrun",
    "resize",
    "rolling_restart",
]

POLL_S = 0.02


def _run_until_done(phase: Phase, every_s: float, fault: Any) -> int:
    """Call `fault(i)` every `every_s` (a fixed rate, however long each call takes) while the phase
    runs; how many times it was called."""
    done = 0
    due = time.monotonic() + every_s
    while not all(phase.finished(r) for r in phase.ranks):
        if any(p.poll() is not None for p in phase.procs) and not all(phase.finished(r) for r in phase.ranks):
            break  # a trainer died: the tally says what it left
        if time.monotonic() >= due:
            fault(done)
            done += 1
            due += every_s
        time.sleep(POLL_S)
    return done


def _servers_job(
    ctx: Ctx, stack: contextlib.ExitStack, name: str, seconds: float, args: tuple[str, ...] = ()
) -> tuple[list[Any], Phase, str]:
    """3 servers of a fault's own and a job of `ranks` ranks reading `epochs` epochs of the 1 KB rows
    from them for about `seconds`, started and past its first step: (servers, phase, load)."""
    s = ctx.sizes
    ref = ctx.fleet_vectors  # made before the servers start
    servers = ctx.servers(stack, 3, args=args)
    step_ms = ctx.step_ms_for(seconds, s.fleet_rows, s.ranks, s.batch, s.epochs)
    cfg = ctx.trainer([x.target for x in servers], ref, world_size=s.ranks, epochs=s.epochs, step_ms=step_ms)
    job = ctx.job(name, cfg, ctx.plan(ref, s.epochs))
    stack.callback(job.kill)
    phase = job.start(ctx.groups(s.ranks))
    phase.wait_step(1)
    load = (
        f"{s.ranks} ranks x {s.epochs} epochs of {s.fleet_rows:,} rows of {8 + 4 * s.fleet_dim:,} B "
        f"(step {step_ms:.0f} ms), 3 servers"
    )
    return servers, phase, load


def kill9_servers(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """kill -9 one of 3 servers every kill_every_s (round robin, restarted at once on its port)."""
    s = ctx.sizes
    servers, phase, load = _servers_job(ctx, stack, "kill9", s.kill9_s)
    restart_s: list[float] = []

    def kill(i: int) -> None:
        victim = servers[i % len(servers)]
        victim.kill()
        t0 = time.perf_counter()
        victim.start()
        restart_s.append(time.perf_counter() - t0)

    kills = _run_until_done(phase, s.kill_every_s, kill)
    phase.wait_exit()
    load += f", kill -9 every {s.kill_every_s:g} s"
    schedule = [] if kills >= 2 else [f"only {kills} kills happened while the job ran"]
    return row(
        "kill -9 servers",
        load,
        phase.job.tally(),
        schedule=schedule,
        details={"kills": kills, "restart_s": [round(x, 2) for x in restart_s]},
    )


def rolling_restart(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """Every server in turn: SIGTERM (health NOT_SERVING, drain for --grace), restarted on its port."""
    s = ctx.sizes
    servers, phase, load = _servers_job(ctx, stack, "rolling", s.rolling_s, ("--grace", f"{s.grace_s:g}"))
    drains = []
    for server in servers:
        t0 = time.perf_counter()
        code = server.stop(timeout_s=s.grace_s + 30)
        drained = time.perf_counter() - t0
        server.start()
        drains.append(
            {"exit": code, "drain_s": round(drained, 2), "down_s": round(time.perf_counter() - t0, 2)}
        )
    mid_epoch = not all(phase.finished(r) for r in phase.ranks)
    phase.wait_exit()
    load += f" drained in turn (grace {s.grace_s:g} s)"
    schedule = [] if mid_epoch else ["the job finished before the last server was restarted"]
    schedule += [f"a server exited with {d['exit']} on SIGTERM" for d in drains if d["exit"] != 0]
    return row(
        "rolling restart (SIGTERM, drain)",
        load,
        phase.job.tally(),
        schedule=schedule,
        details={"servers": drains},
    )


def rank_kills(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """A job of 2 rank processes: one rank is SIGKILLed at a random step (its peer goes down with it, as a
    launcher tears a job down), the job restarts with resume="latest" (from the start while nothing is
    committed yet); rank_kills times, then it runs to its end."""
    return _rank_kills(ctx, stack, "rank-kills", late=False)


def rank_kills_late(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """rank_kills where, in every phase, the rank that is not killed starts late: its process opens its
    Loader only once its peer has logged a step, so the peer runs ahead alone until their first
    commit; a restart from the start then meets the late rank's records of the abandoned run."""
    return _rank_kills(ctx, stack, "rank-kills-late", late=True)


def _rank_kills(ctx: Ctx, stack: contextlib.ExitStack, name: str, *, late: bool) -> Row:
    s = ctx.sizes
    rng = random.Random(s.seed)
    redis, job = _committing_job(ctx, stack, name, persistent=True)  # its ranks in lockstep
    kills, resumed_at = [], []
    for _ in range(s.rank_kills):
        victim = rng.randrange(2)
        # as a launcher would: resume when the job has a checkpoint (a step every rank committed)
        resume = _committed(redis.url, name) is not None
        phase = job.start([[0], [1]], resume=resume, late_rank=1 - victim if late else None)
        start = _started(phase)
        resumed_at.append(start)
        at = start + rng.randint(1, 3 * s.commit_every)
        phase.wait(lambda ph=phase, v=victim, a=at: (ph.step(v) or 0) >= a or ph.finished(v), f"step {at}")
        if phase.finished(victim):
            break
        phase.procs[victim].kill()  # SIGKILL the rank, then the launcher takes the others down
        phase.kill()
        kills.append({"rank": victim, "step": phase.step(victim)})
    last = job.start([[0], [1]], resume=_committed(redis.url, name) is not None, step_ms=0.0)
    last.wait_exit()
    load = f"2 ranks, batch {s.rank_batch}, {s.rows:,} rows; commit every {s.commit_every} steps to Redis"
    schedule = [] if len(kills) == s.rank_kills else [f"{len(kills)} of {s.rank_kills} kills happened"]
    return row(
        f"trainer rank kill -9 x{len(kills)}{', peer late' if late else ''}, resume latest",
        load,
        phase.job.tally(),
        schedule=schedule,
        details={"kills": kills, "resumed_at": resumed_at},
    )


def _committed(store_url: str, job: str | None) -> int | None:
    """The job's newest step committed by all its ranks (None: none yet)."""
    assert job is not None
    store = open_store(store_url)
    try:
        return store.latest(job)
    finally:
        store.close()


def _start(phase: Phase, rank: int) -> int | None:
    starts = [r["start"] for r in phase.records(rank) if "start" in r]
    return starts[-1] if starts else None


def _started(phase: Phase) -> int:
    """The step the phase's ranks start after, once they have all said so."""
    phase.wait(lambda: all(_start(phase, r) is not None for r in phase.ranks), "the ranks' start")
    return _start(phase, phase.ranks[0]) or 0


RESIZE_KINDS = ("plain", "mixture", "mixture+transforms")


def resize(ctx: Ctx, stack: contextlib.ExitStack, kind: str) -> Row:
    """8 ranks (one process) commit and die past a checkpoint; 4 ranks resume and die past the next;
    16 ranks resume and finish the epoch. `kind`: a dataset, a mixture, or a mixture of texts
    tokenized and packed by the servers."""
    s = ctx.sizes
    redis = ctx.redis(stack, f"redis-resize-{kind}", persistent=True)
    kw: dict[str, Any] = {"batch_size": s.resize_batch}
    if kind == "plain":
        dataset: str | dict[str, float] = ctx.vectors
    elif kind == "mixture":
        dataset = {ctx.vectors: 0.7, ctx.mix_vectors: 0.3}
        kw["key"] = "source_id"
    else:
        dataset = {ctx.texts[0]: 0.6, ctx.texts[1]: 0.4}
        kw.update(
            key="text",
            columns=["text"],
            transforms=[
                {"op": "text.tokenize", "column": "text", "tokenizer": "bytes"},
                {"op": "text.pack", "column": "text", "seq_len": 128},
            ],
            batch_size=max(4, s.resize_batch // 2),
        )
    job_name = f"resize-{kind.replace('+', '-')}"
    cfg = ctx.trainer(
        [x.target for x in ctx.fleet],
        dataset,
        job=job_name,
        store=redis.url,
        commit_every=s.commit_every,
        step_ms=0.0,
        **kw,
    )
    job = ctx.job(job_name, cfg, ctx.plan(dataset, 1))
    stack.callback(job.kill)
    holds = list(s.resize_holds)
    for i, (world, hold) in enumerate(zip((8, 4), holds, strict=True)):
        phase = job.start([list(range(world))], world_size=world, resume=i > 0, hold_at=hold)
        phase.wait_held()
        phase.kill()
    job.start([list(range(16))], world_size=16, resume=True).wait_exit()
    load = f"8 -> 4 -> 16 ranks, {kind}" + (f" ({' + '.join(dataset)})" if isinstance(dataset, dict) else "")
    t = job.tally()
    return row(f"resume 8 -> 4 -> 16 ranks ({kind})", load, t, details={"holds": holds})


def _committing_job(
    ctx: Ctx, stack: contextlib.ExitStack, name: str, *, persistent: bool, **kw: Any
) -> tuple[Any, Job]:
    """A job of 2 ranks over the stable fleet committing every commit_every steps to a Redis of its
    own (with an append-only file if `persistent`); `kw` changes its trainers' config.

    The ranks meet before each commit (chaos_rank._Lockstep), as a data-parallel job's ranks do at
    every all-reduce: ranks that drift apart let a step complete with a peer's record of an earlier,
    abandoned run (client/cursors/fence.py), which a real job never does."""
    s = ctx.sizes
    redis = ctx.redis(stack, f"redis-{name}", persistent=persistent)
    kw.setdefault("lockstep", True)
    cfg = ctx.trainer(
        [x.target for x in ctx.fleet],
        ctx.vectors,
        world_size=2,
        batch_size=s.rank_batch,
        step_ms=s.rank_step_ms,
        job=name,
        store=redis.url,
        commit_every=s.commit_every,
        **kw,
    )
    job = ctx.job(name, cfg, ctx.plan(ctx.vectors, 1))
    stack.callback(job.kill)
    return redis, job


def _redis_job(ctx: Ctx, stack: contextlib.ExitStack, name: str, persistent: bool) -> tuple[Any, Job]:
    """A job of 2 ranks in one process, checkpointing every commit_every steps (chaos_rank: commit, then
    the model checkpoint with the Loader's state); resumes fall back to that checkpoint."""
    return _committing_job(
        ctx,
        stack,
        name,
        persistent=persistent,
        commit_timeout_s=5.0,
        checkpoint_dir=str(ctx.workdir / "jobs" / name / "checkpoints"),
        fallback_to_checkpoint=True,
    )


def redis_restart(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """Redis (append-only file, fsync always) kill -9ed mid-run, down for redis_outage_s, restarted;
    training goes on until a commit made after the restart is in the store; then the job is killed and
    resumes from the store.

    The ranks save their checkpoint at every commit step, also when the commit failed (Redis down): a
    job killed before any commit landed in the restarted Redis rightly resumes from its checkpoint, which
    is newer than the store's latest step (CursorStoreBehindError, then the fallback). So the kill waits
    for such a commit — counted in the store, not timed: on a busy machine Redis may take longer to come
    back than the ranks take for a few steps."""
    s = ctx.sizes
    redis, job = _redis_job(ctx, stack, "redis-restart", persistent=True)
    k = s.commit_every
    store = open_store(redis.url)  # the driver's own client: it reconnects to the restarted Redis
    stack.callback(store.close)
    phase = job.start([[0, 1]])
    phase.wait_step(2 * k + 1)
    phase.wait(lambda: store.latest(job.name) is not None, "a commit before the kill")
    before = store.latest(job.name)
    redis.kill()
    time.sleep(s.redis_outage_s)  # the outage (the fault's schedule)
    redis.start()
    # Redis answers again: a step after this one commits there, with training going on
    back_at = max(phase.step(r) or 0 for r in phase.ranks)
    kept = before in store.committed(job.name)  # acknowledged before the kill -9: in the append-only file
    phase.wait(
        lambda: (store.latest(job.name) or 0) > back_at,
        f"a commit after step {back_at} in the restarted Redis",
    )
    committed_after = store.latest(job.name)
    phase.kill()
    job.start([[0, 1]], resume=True, step_ms=0.0).wait_exit()
    t = job.tally()
    schedule = [] if t.resumes.get("store") == 1 else [f"the job resumed {t.resumes}, not from the store"]
    if not kept:
        schedule.append(f"the restarted Redis lost step {before}, committed before the kill")
    load = f"2 ranks, batch {s.rank_batch}; Redis down {s.redis_outage_s:g} s mid-run, then the job killed and resumed"
    return row(
        "Redis kill -9 + restart (AOF)",
        load,
        t,
        schedule=schedule,
        details={
            "commit_failures": t.commit_failures,
            "resumes": t.resumes,
            "committed_before_kill": before,
            "back_at_step": back_at,
            "committed_after_restart": committed_after,
        },
    )


# After Redis comes back empty, the first rank whose commit finds no run claims the job again, which
# makes a new run state; the others' generations were issued by the lost one, so their writes are
# answered "unclaimed" (fence.issued_by), not "stale", and they claim again too.
def redis_wipe_midrun(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """Redis without persistence, wiped (kill -9, restarted empty) while a job of 2 rank processes
    runs: commits must claim the job again and go on; the job is then killed and resumed from the store."""
    s = ctx.sizes
    redis, job = _committing_job(ctx, stack, "redis-wipe-midrun", persistent=False)
    k = s.commit_every
    phase = job.start([[0], [1]])
    phase.wait_step(2 * k + 1)
    redis.kill()
    redis.start()  # empty: wiped while the job runs
    wiped_at = max(phase.step(0) or 0, phase.step(1) or 0)
    phase.wait(
        lambda: all((phase.step(r) or 0) >= wiped_at + 3 * k or phase.finished(r) for r in (0, 1)),
        f"step {wiped_at + 3 * k}",
        exits_ok=True,  # a rank that a typed error ended has finished
    )
    survived = not any(phase.finished(r) for r in (0, 1))
    phase.kill()
    if survived:
        job.start([[0], [1]], resume=True, step_ms=0.0).wait_exit()
    t = job.tally()
    load = f"2 rank processes, batch {s.rank_batch}; Redis without persistence wiped at step {wiped_at}"
    return row(
        "Redis wiped mid-run (restarted empty)",
        load,
        t,
        details={"resumes": t.resumes, "commit_failures": t.commit_failures},
    )


def redis_wipe_down(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """Redis without persistence wiped while the job is down: a resume with resume_min_step (its
    checkpoint's step) must fail loudly (CursorStoreBehindError), and the trainer's fallback resumes
    from the Loader state saved in its checkpoint (load_state_dict)."""
    s = ctx.sizes
    redis, job = _redis_job(ctx, stack, "redis-wipe-down", persistent=False)
    phase = job.start([[0, 1]])
    phase.wait_step(3 * s.commit_every + 1)
    phase.kill()
    redis.kill()
    redis.start()  # wiped while the job is down
    loud = job.start([[0, 1]], resume=True, fallback_to_checkpoint=False)
    codes = loud.wait_exit()
    job.start([[0, 1]], resume=True, step_ms=0.0).wait_exit()
    t = job.tally()
    schedule = [] if codes == [3] else [f"the resume without fallback exited {codes}, not 3 (a typed error)"]
    if t.resumes.get("checkpoint") != 1:
        schedule.append(f"resumed {t.resumes}: expected once from the checkpoint")
    load = f"2 ranks, batch {s.rank_batch}; Redis without persistence wiped while the job was down"
    return row(
        "Redis wiped while the job is down",
        load,
        t,
        allowed_errors=("CursorStoreBehindError",),
        schedule=schedule,
        details={
            "resumes": t.resumes,
            "resume_errors": sorted(set(t.resume_errors)),
            "loud_exit_codes": codes,
        },
    )
