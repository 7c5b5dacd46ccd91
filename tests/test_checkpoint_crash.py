"""Crash safety of checkpoint saves (DESIGN §13): a trainer killed with SIGKILL at any point of a save
leaves the previous commit as `latest`, complete and loadable; nothing partial is listed; the job
resumed saves on; `gc` reclaims what the dead save left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.checkpoint_format import chunks_of
from shardstream.client.checkpoint import Checkpointer
from shardstream.server.checkpoints import collect, open_checkpoint_store

from .support.checkpoint_saver import state_at
from .support.processes import finish_group
from .support.servers import Servers

REPO = Path(__file__).resolve().parent.parent
LAST = 4


@pytest.fixture(scope="module")
def ckpt_server(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    root = tmp_path_factory.mktemp("crash-checkpoints")
    with Servers(data_root) as servers:
        yield servers.start(extra_args=("--checkpoint-root", str(root))), root


def _start(target: str, job: str, first: int, crash_step: int, crash_call: int, *rank: int, run: str = "") -> subprocess.Popen[str]:
    args = [target, job, str(first), str(LAST), str(crash_step), str(crash_call), *map(str, rank)]
    env = {**os.environ, "TORCHELASTIC_RUN_ID": run} if run else None
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.checkpoint_saver", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _until_line(proc: subprocess.Popen[str], line: str, timeout_s: float) -> bool:
    """Whether `proc` prints `line` within `timeout_s` (its stdout read up to that line)."""
    found = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for got in proc.stdout:
            if got.strip() == line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return found.wait(timeout_s)


def _saver(target: str, job: str, first: int, crash_step: int, crash_call: int) -> subprocess.CompletedProcess[str]:
    return finish_group(_start(target, job, first, crash_step, crash_call), timeout_s=120)


def _loads_exactly(ck: Checkpointer, step: int) -> None:
    got = ck.load(step)
    want = state_at(step)
    assert got["step"] == want["step"] and got["lr"] == want["lr"]
    assert got["rank"] == ck.rank
    for name, value in want["model"].items():
        assert got["model"][name].dtype == value.dtype and np.array_equal(got["model"][name], value), name


@pytest.mark.parametrize("crash_step", [1, 3])
@pytest.mark.parametrize("crash_call", [-1, 0, 1, 2, 3])  # mid-DoPut, before has / DoPut / part / commit
def test_a_save_killed_anywhere_leaves_the_previous_commit(ckpt_server: Any, crash_step: int, crash_call: int) -> None:
    server, root = ckpt_server
    job = f"crash-{crash_step}-{crash_call + 1}"
    killed = _saver(server.target, job, 1, crash_step, crash_call)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with Checkpointer([server.target], job=job) as ck:
        assert ck.steps() == list(range(1, crash_step))  # nothing partial listed
        if crash_step > 1:
            assert ck.latest() == crash_step - 1
            _loads_exactly(ck, crash_step - 1)
        resumed = _saver(server.target, job, crash_step, 0, 0)  # the job restarted: saves on
        assert resumed.returncode == 0, resumed.stderr
        assert ck.steps() == list(range(1, LAST + 1))
        for step in ck.steps():
            _loads_exactly(ck, step)
    store = open_checkpoint_store(root)
    report = collect(store, job, keep=1, min_age_s=0)
    assert store.steps(job) == [LAST] and report.removed_steps == list(range(1, LAST))
    assert store.storage.list(f"{job}/parts/") == []
    left = {k.rpartition("/")[2] for k in store.storage.list(f"{job}/chunks/")}
    assert left == chunks_of(store.manifest(job, LAST))  # the dead save's and the old steps' chunks: gone
    assert store.verify(job, LAST) == []


@pytest.mark.parametrize("crash_call", [0, 2, 3])  # before its has / its part / its commit
def test_a_rank_killed_mid_save_leaves_the_step_uncommitted_for_every_rank(ckpt_server: Any, crash_call: int) -> None:
    server, _ = ckpt_server
    job = f"crash-ranks-{crash_call}"
    # run "a": rank 1 dies during the save of step 3; the launcher then kills the whole job (rank 0
    # waits for rank 1's part in its commit meanwhile)
    ranks = [_start(server.target, job, 1, 0 if r == 0 else 3, crash_call, r, 2, run="a") for r in range(2)]
    try:
        ranks[1].wait(timeout=120)
        assert ranks[1].returncode == -signal.SIGKILL, ranks[1].stderr.read() if ranks[1].stderr else ""
        if crash_call == 3:
            # rank 1's part landed before it died: rank 0's next commit poll commits the step, and the
            # launcher's kill comes after that (killing at once raced rank 0's poll)
            assert _until_line(ranks[0], "committed 3", timeout_s=120), "rank 0 never committed step 3"
    finally:
        for proc in ranks:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    # rank 1 killed after its part was stored (before its own commit call): rank 0's commit finds
    # every part and commits step 3, complete; killed before: rank 0's part alone is never listed
    committed = [1, 2, 3] if crash_call == 3 else [1, 2]
    with Checkpointer([server.target], job=job, rank=0, world_size=2) as ck:
        assert ck.steps() == committed
        _loads_exactly(ck, committed[-1])
    # run "b" resumes from the latest: both ranks save the next steps up to 4 (other save ids)
    resumed = [_start(server.target, job, committed[-1] + 1, 0, 0, r, 2, run="b") for r in range(2)]
    try:
        for proc in resumed:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
    finally:
        for proc in resumed:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for r in range(2):
        with Checkpointer([server.target], job=job, rank=r, world_size=2) as ck:
            assert ck.steps() == [1, 2, 3, 4]
            for step in ck.steps():
                _loads_exactly(ck, step)
