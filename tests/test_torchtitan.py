"""torchtitan (client/integrations/torchtitan.py): a run killed with SIGKILL after step KILL_AT and
resumed by ShardStreamCheckpointManager.load() trains on exactly the samples of an uninterrupted run,
to the same parameters bit for bit; each checkpoint is one commit of the fleet job holding the model,
the optimizer, the lr scheduler, the step and the data loader's Loader state.

Through a real server process; each run is a fresh process (tests/support/torchtitan_run.py) with
torchtitan's CheckpointManager, OptimizersContainer and LRSchedulersContainer on a tiny model built
from a config. The uninterrupted and the killed run go side by side, then the resumed one.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardstream.client.checkpoint import Checkpointer

from .support.processes import finish_group
from .support.servers import Servers
from .support.torchtitan_run import start_run
from .support.training_runs import read_run_log

pytest.importorskip("torchtitan")

BATCH, STEPS, INTERVAL, KILL_AT = 4, 12, 4, 10
LAST = KILL_AT // INTERVAL * INTERVAL  # the newest commit when the run is killed
RUN_TIMEOUT_S = 240.0


def _run_all(configs: dict[str, dict[str, Any]]) -> None:
    procs = {name: start_run(config) for name, config in configs.items()}
    for name, proc in procs.items():
        done = finish_group(proc, RUN_TIMEOUT_S)
        want = -signal.SIGKILL if configs[name]["kill_at"] is not None else 0
        assert done.returncode == want, (name, done.stderr[-3000:])


@pytest.fixture(scope="module")
def runs(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("torchtitan")
    with Servers(data_root) as servers:
        server = servers.start(extra_args=("--checkpoint-root", str(tmp / "checkpoints")))

        def config(name: str, **kw: Any) -> dict[str, Any]:
            base = {
                "endpoints": [server.target],
                "job": f"titan-{name}",
                "log": str(tmp / f"{name}.jsonl"),
                "batch_size": BATCH,
                "steps": STEPS,
                "interval": INTERVAL,
                "kill_at": None,
            }
            return {**base, **kw}

        _run_all({"whole": config("whole"), "killed": config("killed", kill_at=KILL_AT)})
        killed = read_run_log(tmp / "killed.jsonl")[0]
        with Checkpointer([server.target], "titan-killed") as ckpt:
            committed_at_kill = ckpt.steps()
            manifest = ckpt.manifest(LAST)
        _run_all({"resumed": config("killed")})  # the same run again: load() finds the newest commit
        with Checkpointer([server.target], "titan-killed") as ckpt:
            committed = ckpt.steps()
        yield {
            "tmp": tmp,
            "killed": killed,
            "at_kill": committed_at_kill,
            "committed": committed,
            "manifest": manifest,
        }


def test_a_killed_run_resumes_on_the_uninterrupted_runs_samples(runs: dict[str, Any]) -> None:
    expected, whole_end = read_run_log(runs["tmp"] / "whole.jsonl")
    assert whole_end is not None and [r["step"] for r in expected] == list(range(1, STEPS + 1))
    first = runs["killed"]
    assert [r["step"] for r in first] == list(range(1, KILL_AT + 1))
    rows, end = read_run_log(runs["tmp"] / "killed.jsonl")
    resumed = rows[len(first) :]
    assert [r["step"] for r in resumed] == list(range(LAST + 1, STEPS + 1))
    # steps 1..LAST of the killed run, then the resumed run's: the uninterrupted run's samples
    trained = [r["ids"] for r in first if r["step"] <= LAST] + [r["ids"] for r in resumed]
    assert trained == [r["ids"] for r in expected]
    assert end == whole_end  # model, optimizer and lr scheduler came back with the data


def test_each_checkpoint_is_one_commit_with_the_data_loaders_state(runs: dict[str, Any]) -> None:
    assert runs["at_kill"] == list(range(INTERVAL, KILL_AT + 1, INTERVAL))
    assert runs["committed"] == list(range(INTERVAL, STEPS + 1, INTERVAL))
    paths = {t["path"] for part in runs["manifest"]["parts"] for t in part["tensors"].values()}
    for key in ("embed.weight", "out.bias", "optimizer.state.out.bias.exp_avg", "lr_scheduler.last_epoch",
                "train_state.step", "dataloader.shardstream_loader"):  # fmt: skip
        assert any(p.startswith(key) for p in paths), (key, sorted(paths))
    assert not list(Path.cwd().glob("shardstream:*"))  # nothing written locally
