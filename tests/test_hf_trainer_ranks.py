"""transformers.Trainer (client/integrations/hf_trainer.py) with 2 data-parallel ranks (issue #44): a job
whose ranks are all killed with SIGKILL mid-run and resumed from its last checkpoint trains, rank by
rank and step by step, on exactly the samples of an uninterrupted 2-rank job — no sample skipped or
repeated across the kill — and ends on its parameters, bit for bit.

Each rank is a process (tests/support/hf_trainer_run.py, start_ranks: gloo on CPU, a free port, one
process group), training a tiny GPT-2 made from a config through the session's two real servers. The
checkpoint holds rank 0's Loader state, which resumes both ranks (a Loader state is global).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from .support.hf_trainer_run import finish_ranks, start_ranks

pytest.importorskip("transformers")

WORLD, BATCH, ACCUMULATE, MAX_STEPS, SAVE_STEPS, KILL_AT = 2, 4, 2, 8, 3, 7
RUN_TIMEOUT_S = 240.0


def _lines(log: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    ends = [r for r in rows if "end" in r]
    return [r for r in rows if "step" in r], (ends[0] if ends else None)


def _output(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("rank*.out")))


def test_two_ranks_killed_together_resume_on_the_samples_of_an_uninterrupted_job(
    endpoints: list[str], tmp_path: Path
) -> None:
    def config(name: str, **kw: Any) -> dict[str, Any]:
        base = {
            "endpoints": endpoints,
            "out": str(tmp_path / name),
            "log": str(tmp_path / f"{name}.{{rank}}.jsonl"),
            "batch_size": BATCH,
            "accumulate": ACCUMULATE,
            "max_steps": MAX_STEPS,
            "save_steps": SAVE_STEPS,
            "kill_at": None,
            "resume": False,
        }
        return {**base, **kw}

    def logs(name: str) -> Path:
        (tmp_path / f"{name}-out").mkdir(exist_ok=True)
        return tmp_path / f"{name}-out"

    whole = start_ranks(config("whole"), WORLD, logs("whole"))
    killed = start_ranks(config("run", kill_at=KILL_AT), WORLD, logs("run"))
    whole_codes, killed_codes = finish_ranks(whole, RUN_TIMEOUT_S), finish_ranks(killed, RUN_TIMEOUT_S)
    assert whole_codes == [0] * WORLD, _output(logs("whole"))
    assert killed_codes == [-signal.SIGKILL] * WORLD, _output(logs("run"))

    expected = [_lines(tmp_path / f"whole.{r}.jsonl") for r in range(WORLD)]
    first = [_lines(tmp_path / f"run.{r}.jsonl")[0] for r in range(WORLD)]
    micro = [s for s in range(1, MAX_STEPS + 1) for _ in range(ACCUMULATE)]
    for rows, end in expected:
        assert end is not None and [r["step"] for r in rows] == micro
    # DDP kept the ranks' models equal
    assert len({end["end"] for _, end in expected if end is not None}) == 1
    # each rank its own share of every micro-batch step: the ranks' samples are disjoint
    for a, b in zip(*(rows for rows, _ in expected), strict=True):
        assert len(a["ids"]) == len(b["ids"]) == BATCH and not set(a["ids"]) & set(b["ids"])
    job = [i for rows, _ in expected for x in rows for i in x["ids"]]
    assert len(set(job)) == len(job) == WORLD * MAX_STEPS * ACCUMULATE * BATCH  # within one epoch: none twice
    # rank 0 killed the group after step KILL_AT; rank 1 was then at most one step further
    assert [r["step"] for r in first[0]] == micro[: KILL_AT * ACCUMULATE]
    assert micro[: KILL_AT * ACCUMULATE] == [r["step"] for r in first[1]][: KILL_AT * ACCUMULATE]
    assert all(r["step"] <= KILL_AT + 1 for r in first[1])

    # the newest checkpoint holds rank 0's cursor: past every rank's last micro-batch of its step
    last = KILL_AT // SAVE_STEPS * SAVE_STEPS
    state = json.loads((tmp_path / "run" / f"checkpoint-{last}" / "trainer_state.json").read_text())
    assert state["global_step"] == last
    loader = state["stateful_callbacks"]["ShardStreamCallback"]["attributes"]["loader_state"]["loader"]
    assert (loader["epoch"], loader["offset"], loader["steps"], loader["world_size"]) == (
        0, last * ACCUMULATE * BATCH * WORLD, last * ACCUMULATE, WORLD)  # fmt: skip

    whole_end = expected[0][1]
    resuming = start_ranks(config("run", resume=True), WORLD, logs("resumed"))
    assert finish_ranks(resuming, RUN_TIMEOUT_S) == [0] * WORLD, _output(logs("resumed"))
    for r in range(WORLD):
        rows, end = _lines(tmp_path / f"run.{r}.jsonl")
        resumed, whole_rows = rows[len(first[r]) :], expected[r][0]
        assert end is not None and whole_end is not None
        assert [x["step"] for x in resumed] == micro[last * ACCUMULATE :]
        # this rank's micro-batches up to the checkpoint, then the resumed job's: the uninterrupted job's
        trained = [x["ids"] for x in first[r] if x["step"] <= last] + [x["ids"] for x in resumed]
        assert trained == [x["ids"] for x in whole_rows], f"rank {r}"
        assert end["read"] == len(resumed), f"rank {r} read batches it did not train"
        # model, optimizer, scheduler and RNG came back with the data: the same parameters, bit for bit
        assert end["end"] == whole_end["end"], f"rank {r}"
