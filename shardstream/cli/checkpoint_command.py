"""`shardstream checkpoint list|show|verify|pull|gc`: a checkpoint root, as an operator sees it.

They read the root itself (`--checkpoint-root`, a directory or s3://; what `serve --checkpoint-root`
serves), so they run beside the fleet with the storage's credentials, not through it:

    list    [--job J]                  jobs, or a job's committed steps (size, age, data position; a
                                       damaged manifest is listed as DAMAGED and the others still are)
    show    --job J [--step S]         one checkpoint: ranks, tensors, bytes, chunks, Loader state
    verify  --job J [--step S]         re-read every chunk and check it against its name (exit 1 on a problem)
    pull    --job J [--step S] --to D  write a plain torch.distributed.checkpoint directory: the saved tree
                                       at its top level, the Loader states under "shardstream_loader";
                                       dcp.load reads it without shardstream (checkpoint_pull.py)
    gc      --job J --keep N           keep the newest N intact, reclaim the rest and any damaged manifest
                                       (server/checkpoints/reclaim.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from shardstream.errors import DataLossError, InvalidArgumentError, NotFoundError

from . import common
from .datasets_gc import duration

__all__ = ["add_commands"]

DEFAULT_ROOT_ENV = "SHARDSTREAM_CHECKPOINT_ROOT"
PULL_DESCRIPTION = """\
Write checkpoint JOB@STEP as the directory dcp.save writes for the saved state: its tree at the top
level, so the dcp.load written for DCP reads it (no shardstream needed), plus the Loader states under
the reserved key "shardstream_loader" (a JSON string: {"job", "step", "world_size", "ranks": [one
Loader state per rank]}).

    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, storage_reader=FileSystemReader("./run-42-1000"))
    opt.load_state_dict(state["optim"])

A checkpoint saved through DCP (Checkpointer.storage_writer) by any number of ranks keeps its shards:
dcp.load reshards them to its own world size. One saved by Checkpointer.save on several ranks holds a
whole tree per rank: --rank picks one (default 0; a note says where the ranks differ)."""


def _store(args: argparse.Namespace) -> Any:
    from shardstream.server.checkpoints import open_checkpoint_store

    root = args.checkpoint_root or os.environ.get(DEFAULT_ROOT_ENV)
    if not root:
        raise InvalidArgumentError(f"name the checkpoint root: --checkpoint-root URL or ${DEFAULT_ROOT_ENV}")
    if not root.startswith("s3://") and not Path(root).is_dir():
        raise NotFoundError(f"--checkpoint-root {Path(root).resolve()}: no such directory")
    return open_checkpoint_store(root, s3_endpoint=args.s3_endpoint)


def _step(store: Any, job: str, step: int | None) -> int:
    if step is not None:
        return step
    latest = store.latest(job)
    if latest is None:
        raise NotFoundError(f"checkpoint job {job} has no committed checkpoint")
    return int(latest)


def _position(part: dict[str, Any]) -> str:
    loader = part.get("loader") or {}
    return f"epoch {loader['epoch']} offset {loader['offset']}" if "offset" in loader else "-"


def _cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    if not args.job:
        jobs = store.jobs()
        listed = {j: store.sort_steps(j) for j in jobs}
        if args.json:
            print(json.dumps({"jobs": [{"job": j, "steps": ok, "damaged": bad} for j, (ok, bad) in listed.items()]}))
        else:
            common.print_table(
                [["JOB", "CHECKPOINTS", "LATEST", "DAMAGED"]]
                + [[j, str(len(ok)), str(ok[-1]) if ok else "-", str(len(bad))] for j, (ok, bad) in listed.items()]
            )
        return 0
    rows, out = [["STEP", "RANKS", "BYTES", "AGE", "DATA POSITION"]], []
    for step in store.steps(args.job):
        try:
            m = store.manifest(args.job, step)
        except DataLossError as exc:  # one damaged manifest: said, and the others still listed
            out.append({"step": step, "damaged": str(exc)})
            rows.append([str(step), "-", "-", "-", "DAMAGED: manifest unreadable (checkpoint gc removes it)"])
            continue
        age = time.time() - m["committed_s"]
        out.append({"step": step, "world_size": m["world_size"], "bytes": m["bytes"], "committed_s": m["committed_s"]})
        rows.append([str(step), str(m["world_size"]), common.human_bytes(m["bytes"]), f"{age:.0f}s", _position(m["parts"][0])])
    if args.json:
        print(json.dumps({"job": args.job, "checkpoints": out}))
    else:
        common.print_table(rows)
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    m = store.manifest(args.job, _step(store, args.job, args.step))
    if args.json:
        print(json.dumps(m))
        return 0
    print(f"checkpoint {args.job}@{m['step']}: {m['world_size']} rank(s), {common.human_bytes(m['bytes'])} in {m['chunks']} chunks")
    for part in m["parts"]:
        print(f"rank {part['rank']}: {len(part['tensors'])} tensors, data position {_position(part)}")
        for t in sorted(part["tensors"].values(), key=lambda t: t["path"]):
            print(f"  {t['path']}  {t['dtype']}{t['shape']}  {common.human_bytes(t['nbytes'])}  {len(t['chunks'])} chunk(s)")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    store = _store(args)
    step = _step(store, args.job, args.step)
    problems = store.verify(args.job, step)
    for p in problems:
        print(f"checkpoint {args.job}@{step}: {p}")
    if not problems:
        print(f"checkpoint {args.job}@{step}: every chunk present and verified")
    return common.EXIT_ERROR if problems else 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from .checkpoint_pull import LOADER_KEY, pull

    store = _store(args)
    step = _step(store, args.job, args.step)
    pulled = pull(store, args.job, step, Path(args.to), rank=args.rank)
    if pulled.differing:  # said whatever --quiet: the directory is one rank's of several that differ
        shown = ", ".join(pulled.differing[:5]) + (f" and {len(pulled.differing) - 5} more" if len(pulled.differing) > 5 else "")
        print(
            f"shardstream: note: checkpoint {args.job}@{step}: the other ranks saved other values at {shown}; "
            f"this is rank {pulled.rank}'s (--rank R pulls another)",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps({**pulled.__dict__, "differing": list(pulled.differing), "loader_key": LOADER_KEY}))
    elif not args.quiet:
        what = (
            "every rank's shards (dcp.load reshards them)"
            if pulled.saved_by == "dcp"
            else f"rank {pulled.rank}'s state" + (f" of {pulled.world_size}" if pulled.world_size > 1 else "")
        )
        print(
            f"checkpoint {args.job}@{step}: {common.human_bytes(pulled.bytes)} written to {args.to} "
            f"(torch.distributed.checkpoint: {what}; Loader states under {LOADER_KEY!r})"
        )
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    from shardstream.server.checkpoints import collect

    store = _store(args)
    report = collect(store, args.job, keep=args.keep, min_age_s=args.min_age, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    if args.json:
        print(json.dumps(report.__dict__))
    else:
        damaged = f", damaged steps {report.damaged_steps}" if report.damaged_steps else ""
        print(
            f"checkpoint job {args.job}: kept steps {report.kept_steps}; {verb} steps {report.removed_steps}{damaged}, "
            f"{report.removed_parts} part(s), {report.removed_chunks} chunk(s), {common.human_bytes(report.freed_bytes)}"
        )
    return 0


def add_commands(sub: Any) -> None:
    group = common.add_command(
        sub,
        "checkpoint",
        None,
        help="training checkpoints under a checkpoint root: list, show, verify, pull, gc",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        epilog=common.examples(
            "shardstream checkpoint list --checkpoint-root ./checkpoints",
            "shardstream checkpoint show --job run-42 --checkpoint-root s3://bucket/ckpt",
            "shardstream checkpoint pull --job run-42 --step 1000 --to ./run-42-1000",
            "shardstream checkpoint gc --job run-42 --keep 3",
        ),
    )
    cmds = group.add_subparsers(dest="checkpoint_command", metavar="COMMAND", required=True)

    def command(
        name: str, fn: Any, help: str, example: str, *, job: str = "required", step: bool = False
    ) -> argparse.ArgumentParser:
        sp = common.add_command(cmds, name, fn, help=help, epilog=common.examples(f"shardstream checkpoint {name} {example}"))
        sp.add_argument(
            "--checkpoint-root",
            metavar="URL",
            help=f"the root `serve --checkpoint-root` serves: a directory or s3://BUCKET/PREFIX (default: ${DEFAULT_ROOT_ENV})",
        )
        sp.add_argument("--job", required=job == "required", help="the checkpoint job (Checkpointer(job=...))")
        if step:
            sp.add_argument("--step", type=int, default=None, help="the step (default: the latest committed)")
        common._add_global(sp, "s3_endpoint", None, "S3 endpoint URL for s3:// roots (default: $AWS_ENDPOINT_URL)")
        common.json_option(sp)
        return sp

    root = "--checkpoint-root ./checkpoints"
    command("list", _cmd_list, "jobs, or a job's committed checkpoints", f"--job run-42 {root}", job="optional")
    command("show", _cmd_show, "one checkpoint: ranks, tensors, bytes, Loader state", f"--job run-42 {root}", step=True)
    command(
        "verify", _cmd_verify, "re-check every chunk of a checkpoint against its checksum", f"--job run-42 --step 1000 {root}", step=True
    )
    pull = command(
        "pull", _cmd_pull, "write a plain torch.distributed.checkpoint directory", f"--job run-42 --to ./run-42 {root}", step=True
    )
    pull.description = PULL_DESCRIPTION
    pull.epilog = common.examples(
        f"shardstream checkpoint pull --job run-42 --step 1000 --to ./run-42-1000 {root}",
        f"shardstream checkpoint pull --job run-42 --rank 3 --to ./run-42-rank3 {root}",
    )
    pull.add_argument("--to", required=True, metavar="DIR", help="the directory to write (new or empty)")
    pull.add_argument(
        "--rank",
        type=int,
        default=None,
        help="the rank whose state to write, for a checkpoint Checkpointer.save wrote on several ranks (default 0); "
        "a checkpoint saved through DCP holds every rank's shards and takes none",
    )
    common.quiet_option(pull)
    gc = command("gc", _cmd_gc, "keep the newest N checkpoints, reclaim the rest", f"--job run-42 --keep 3 {root}")
    gc.add_argument("--keep", type=common.positive_int, required=True, help="committed checkpoints to keep")
    gc.add_argument("--min-age", type=duration, default=3600.0, help="keep unreferenced chunks and parts younger than this (default 1h: a save may be running)")
    gc.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
