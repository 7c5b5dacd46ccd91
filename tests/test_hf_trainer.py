"""transformers.Trainer (client/integrations/hf_trainer.py): a run killed with SIGKILL and resumed from
its last checkpoint trains on exactly the samples of an uninterrupted run, reading no batch twice; a
checkpoint without the Loader's state is refused.

Through the session's two real servers; each run is a fresh process (tests/support/hf_trainer_run.py)
training a tiny GPT-2 made from a config.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

from .support.hf_trainer_run import start_run
from .support.processes import finish_group

BATCH, ACCUMULATE, MAX_STEPS, SAVE_STEPS, KILL_AT = 4, 2, 12, 4, 10
RUN_TIMEOUT_S = 240.0


def _lines(log: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    ends = [r for r in rows if "end" in r]
    return [r for r in rows if "step" in r], (ends[0] if ends else None)


def test_a_killed_trainer_resumes_on_the_samples_an_uninterrupted_run_trains(
    endpoints: list[str], tmp_path: Path
) -> None:
    def config(name: str, **kw: Any) -> dict[str, Any]:
        base = {"endpoints": endpoints, "out": str(tmp_path / name), "log": str(tmp_path / f"{name}.jsonl"),
                "batch_size": BATCH, "accumulate": ACCUMULATE, "max_steps": MAX_STEPS, "save_steps": SAVE_STEPS,
                "kill_at": None, "resume": False}
        return {**base, **kw}

    whole = start_run(config("whole"))
    killed = start_run(config("run", kill_at=KILL_AT))
    done_whole = finish_group(whole, RUN_TIMEOUT_S)
    done_killed = finish_group(killed, RUN_TIMEOUT_S)
    assert done_whole.returncode == 0, done_whole.stderr[-3000:]
    assert done_killed.returncode == -signal.SIGKILL, done_killed.stderr[-3000:]

    expected, whole_end = _lines(tmp_path / "whole.jsonl")
    first, first_end = _lines(tmp_path / "run.jsonl")
    assert whole_end is not None and first_end is None
    assert [r["step"] for r in expected] == [s for s in range(1, MAX_STEPS + 1) for _ in range(ACCUMULATE)]
    assert [r["step"] for r in first] == [s for s in range(1, KILL_AT + 1) for _ in range(ACCUMULATE)]

    # the newest checkpoint holds the cursor after its last micro-batch, beside its global step
    last = KILL_AT // SAVE_STEPS * SAVE_STEPS
    state = json.loads((tmp_path / "run" / f"checkpoint-{last}" / "trainer_state.json").read_text())
    assert state["global_step"] == last
    loader = state["stateful_callbacks"]["ShardStreamCallback"]["attributes"]["loader_state"]["loader"]
    assert (loader["epoch"], loader["offset"], loader["steps"]) == (0, last * ACCUMULATE * BATCH, last * ACCUMULATE)

    # a copy of the checkpoint without the Loader state: refused, never trained from the data's start
    shutil.copytree(tmp_path / "run", tmp_path / "stateless")
    bare = tmp_path / "stateless" / f"checkpoint-{last}" / "trainer_state.json"
    bare.write_text(json.dumps({**state, "stateful_callbacks": {
        k: v for k, v in state["stateful_callbacks"].items() if k != "ShardStreamCallback"}}))

    resuming, refused = start_run(config("run", resume=True)), start_run(config("stateless", resume=True))
    done, not_done = finish_group(resuming, RUN_TIMEOUT_S), finish_group(refused, RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not_done.returncode != 0 and "FailedPreconditionError" in not_done.stderr, not_done.stderr[-3000:]
    assert "holds no shardstream Loader state" in not_done.stderr
    assert (tmp_path / "stateless.jsonl").read_text() == ""  # not one batch trained
    resumed, resumed_end = _lines(tmp_path / "run.jsonl")
    resumed = resumed[len(first):]
    assert resumed_end is not None
    assert [r["step"] for r in resumed] == [s for s in range(last + 1, MAX_STEPS + 1) for _ in range(ACCUMULATE)]
    # the micro-batches of steps 1..8 of the killed run, then the resumed run's: the uninterrupted run's
    trained = [r["ids"] for r in first if r["step"] <= last] + [r["ids"] for r in resumed]
    assert trained == [r["ids"] for r in expected]
    # no batch skipped by reading it: the resumed run read only what it trained
    assert resumed_end["read"] == len(resumed)
    # model, optimizer, scheduler and RNG came back with the data: the same final parameters, bit for bit
    assert resumed_end["end"] == whole_end["end"]
