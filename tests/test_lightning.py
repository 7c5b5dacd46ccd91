"""PyTorch Lightning (client/integrations/lightning.py): a fit killed with SIGKILL and resumed from its
last checkpoint trains on exactly the samples of an uninterrupted fit — with Lightning's own checkpoint
files, and with ShardStreamCheckpointIO keeping them on the fleet; a checkpoint without the
DataModule's state is refused.

Through a real server process; each fit is a fresh process (tests/support/lightning_run.py) training a
tiny torch model. Lightning takes ~10 s to import, so the fits run side by side: the uninterrupted one
and both killed ones, then both resumed ones with one from a checkpoint stripped of the state.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardstream.client.checkpoint import Checkpointer

from .support.lightning_run import start_run
from .support.processes import finish_group
from .support.servers import Servers
from .support.training_runs import read_run_log

torch = pytest.importorskip("torch")

BATCH, MAX_STEPS, EVERY, KILL_AT = 4, 12, 4, 10
LAST = KILL_AT // EVERY * EVERY  # the newest checkpoint when the fit is killed
RUN_TIMEOUT_S = 240.0


def _run_all(configs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Start every fit at once; each exits 0, or is killed (kill_at), or fails (a "fails" key); their stderr."""
    procs = {name: start_run(config) for name, config in configs.items()}
    done = {name: finish_group(proc, RUN_TIMEOUT_S) for name, proc in procs.items()}
    for name, config in configs.items():
        code = done[name].returncode
        if config.get("fails"):
            assert code not in (0, -signal.SIGKILL), (name, done[name].stderr[-3000:])
        else:
            want = -signal.SIGKILL if config["kill_at"] is not None else 0
            assert code == want, (name, done[name].stderr[-3000:])
    return {name: d.stderr for name, d in done.items()}


@pytest.fixture(scope="module")
def fits(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The uninterrupted fit, then two fits killed after step KILL_AT and resumed: "files" from
    Lightning's checkpoint file of step LAST, "fleet" (ShardStreamCheckpointIO) from the latest commit."""
    tmp = tmp_path_factory.mktemp("lightning")
    with Servers(data_root) as servers:
        server = servers.start(extra_args=("--checkpoint-root", str(tmp / "checkpoints")))
        endpoints = [server.target]

        def config(name: str, **kw: Any) -> dict[str, Any]:
            base = {"endpoints": endpoints, "dir": str(tmp / name), "log": str(tmp / f"{name}.jsonl"),
                    "batch_size": BATCH, "max_steps": MAX_STEPS, "every": EVERY, "kill_at": None, "resume": None,
                    "job": None}
            return {**base, **kw}

        runs = {"whole": config("whole"), "files": config("files"), "fleet": config("fleet", job="lightning-fleet")}
        _run_all({"whole": runs["whole"], **{k: {**runs[k], "kill_at": KILL_AT} for k in ("files", "fleet")}})
        killed = {k: read_run_log(tmp / f"{k}.jsonl")[0] for k in ("files", "fleet")}
        # the checkpoint file without the DataModule's state: refused, never trained from the data's start
        ckpt_file = tmp / "files" / f"epoch=0-step={LAST}.ckpt"
        bare = torch.load(ckpt_file, weights_only=True)
        del bare["ShardStreamDataModule"]
        (tmp / "stateless").mkdir()
        torch.save(bare, tmp / "stateless" / ckpt_file.name)
        stderr = _run_all({
            "files": {**runs["files"], "resume": str(ckpt_file)},
            "fleet": {**runs["fleet"], "resume": "shardstream:latest"},  # ShardStreamCheckpointIO.LATEST
            "stateless": config("stateless", resume=str(tmp / "stateless" / ckpt_file.name), fails=True),
        })
        with Checkpointer(endpoints, "lightning-fleet") as ckpt:
            committed, saved = ckpt.steps(), ckpt.load(LAST)
        yield {"tmp": tmp, "runs": runs, "killed": killed, "committed": committed, "saved": saved, "stderr": stderr}


def _check_resumed(fits: dict[str, Any], name: str) -> None:
    expected, whole_end = read_run_log(Path(fits["runs"]["whole"]["log"]))
    assert whole_end is not None and [r["step"] for r in expected] == list(range(1, MAX_STEPS + 1))
    first = fits["killed"][name]
    assert [r["step"] for r in first] == list(range(1, KILL_AT + 1))
    rows, end = read_run_log(Path(fits["runs"][name]["log"]))
    resumed = rows[len(first):]
    assert [r["step"] for r in resumed] == list(range(LAST + 1, MAX_STEPS + 1))
    # steps 1..LAST of the killed fit, then the resumed fit's: the uninterrupted fit's samples
    trained = [r["ids"] for r in first if r["step"] <= LAST] + [r["ids"] for r in resumed]
    assert trained == [r["ids"] for r in expected]
    assert end == whole_end  # model and optimizer came back with the data: the same parameters, bit for bit


def test_a_killed_fit_resumes_from_lightnings_checkpoint_file_on_the_uninterrupted_samples(
    fits: dict[str, Any],
) -> None:
    _check_resumed(fits, "files")


def test_checkpoints_through_the_fleet_resume_a_killed_fit_on_the_uninterrupted_samples(fits: dict[str, Any]) -> None:
    _check_resumed(fits, "fleet")
    assert not list((fits["tmp"] / "fleet").glob("*.ckpt"))  # nothing written locally
    assert fits["committed"] == list(range(EVERY, MAX_STEPS + 1, EVERY))
    data = fits["saved"]["ShardStreamDataModule"]["loader"]  # the DataModule's cursor, committed with the model
    assert (data["epoch"], data["offset"], data["steps"]) == (0, LAST * BATCH, LAST)


def test_a_checkpoint_without_the_datamodules_state_is_refused(fits: dict[str, Any]) -> None:
    assert "holds no state of ShardStreamDataModule" in fits["stderr"]["stateless"]
    assert (fits["tmp"] / "stateless.jsonl").read_text() == ""  # not one batch trained
