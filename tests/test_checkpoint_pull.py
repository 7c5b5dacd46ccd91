"""`shardstream checkpoint pull` writes what `dcp.load` reads: checkpoints a real server stored, saved by
one rank, by two ranks with Checkpointer.save, and by two torchrun ranks through the DCP plugins
(sharded), loaded into a fresh model and optimizer with DCP's own FileSystemReader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.checkpoint_format import chunk_key, manifest_key
from shardstream.cli import main
from shardstream.cli.checkpoint_pull import LOADER_KEY
from shardstream.client import Loader
from shardstream.client.checkpoint import Checkpointer

from .support.processes import finish_group, run_cli
from .support.servers import Servers, unused_port

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fleet(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """One server keeping checkpoints under a private root, and that root (what pull reads)."""
    root = tmp_path_factory.mktemp("pull-checkpoints")
    with Servers(data_root) as servers:
        yield servers.start(extra_args=("--checkpoint-root", str(root))), root


@pytest.fixture(autouse=True)
def _single_process_dcp() -> Iterator[None]:
    with warnings.catch_warnings():  # dcp says it assumes one process when none is initialized: it is one
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _pull(capsys: pytest.CaptureFixture[str], root: Path, *args: str) -> tuple[int, str, str]:
    code = main(["checkpoint", "pull", "--checkpoint-root", str(root), *args])
    out, err = capsys.readouterr()
    return code, out, err


def _fresh() -> tuple[Any, Any]:
    """Another model and an Adam whose state tensors exist (zeros): a fresh Adam has none until its first
    step, and dcp.load fills the tensors the target has. A zero gradient moves no parameter."""
    from .support.pull_rank import trained

    model, _ = trained(seed=99)
    opt = torch.optim.Adam(model.parameters(), lr=0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for s in opt.state.values():
        for v in s.values():
            v.zero_()
    return model, opt


def _load(directory: Path) -> tuple[Any, Any, dict[str, Any]]:
    """dcp.load of a pulled directory into a fresh model and optimizer, as DCP's docs write it; and the
    Loader states under the reserved key."""
    model, opt = _fresh()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(directory)), no_dist=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    extra = {LOADER_KEY: ""}
    dcp.load(extra, storage_reader=dcp.FileSystemReader(str(directory)), no_dist=True)
    return model, opt, json.loads(extra[LOADER_KEY])


def _assert_same(model: Any, opt: Any, want_model: Any, want_opt: Any) -> None:
    got, want = model.state_dict(), want_model.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    got_o, want_o = opt.state_dict(), want_opt.state_dict()
    assert got_o["param_groups"] == want_o["param_groups"]
    assert got_o["state"].keys() == want_o["state"].keys()
    for i, s in want_o["state"].items():
        assert got_o["state"][i].keys() == s.keys()
        for k, v in s.items():
            assert torch.equal(got_o["state"][i][k], v), (i, k)


def _read(loader: Any, n: int) -> None:
    batches = iter(loader)
    for _ in range(n):
        next(batches)


def test_one_rank_pulls_into_a_fresh_model_and_optimizer(
    fleet: tuple[Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from .support.pull_rank import trained

    server, root = fleet
    model, opt = trained()
    with (
        Loader([server.target], "toy@1", batch_size=4, seed=1) as loader,
        Checkpointer([server.target], job="pull-one") as ck,
    ):
        _read(loader, 3)
        saved_loader = loader.state_dict()
        ck.save(7, {"model": model.state_dict(), "optim": opt.state_dict()}, loader=loader, blocking=True)
    code, out, err = _pull(capsys, root, "--job", "pull-one", "--to", str(tmp_path / "one"))
    assert code == 0 and err == "" and "pull-one@7" in out and LOADER_KEY in out
    got_model, got_opt, loaders = _load(tmp_path / "one")
    _assert_same(got_model, got_opt, model, opt)
    assert loaders == {"job": "pull-one", "step": 7, "world_size": 1, "ranks": [saved_loader]}
    # the Loader state resumes a Loader: the next batch is the one the saving run would have read
    with (
        Loader([server.target], "toy@1", batch_size=4, seed=1) as resumed,
        Loader([server.target], "toy@1", batch_size=4, seed=1) as straight,
    ):
        resumed.load_state_dict(loaders["ranks"][0])
        _read(straight, 3)
        assert np.array_equal(np.asarray(next(iter(resumed))["id"]), np.asarray(next(iter(straight))["id"]))


def test_two_checkpointer_ranks_pull_one_tree_and_both_loader_states(
    fleet: tuple[Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from .support.pull_rank import trained

    server, root = fleet
    model, opt = trained()  # data parallel: both ranks hold the same model and optimizer
    loaders = [Loader([server.target], "toy@1", batch_size=4, rank=r, world_size=2, seed=1) for r in range(2)]
    ranks = [Checkpointer([server.target], job="pull-two", rank=r, world_size=2) for r in range(2)]
    try:
        saves = []
        for r in range(2):
            _read(loaders[r], 2)
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "rank": r}
            saves.append(ranks[r].save(4, state, loader=loaders[r]))
        assert [s.result(60) for s in saves] == [4, 4]
        saved_loaders = [ld.state_dict() for ld in loaders]
    finally:
        for c in ranks:
            c.close()
        for ld in loaders:
            ld.close()

    code, out, err = _pull(capsys, root, "--job", "pull-two", "--to", str(tmp_path / "r0"))
    assert code == 0 and "rank 0's state of 2" in out
    assert "note:" in err and "non-tensor values" in err and "model/" not in err  # only "rank" differs
    got_model, got_opt, got_loaders = _load(tmp_path / "r0")
    _assert_same(got_model, got_opt, model, opt)
    assert got_loaders["world_size"] == 2 and got_loaders["ranks"] == saved_loaders
    rank = {"rank": -1}
    dcp.load(rank, storage_reader=dcp.FileSystemReader(str(tmp_path / "r0")), no_dist=True)
    assert rank["rank"] == 0

    code, out, _ = _pull(
        capsys, root, "--job", "pull-two", "--rank", "1", "--to", str(tmp_path / "r1"), "--json"
    )
    assert code == 0 and json.loads(out)["rank"] == 1
    dcp.load(rank, storage_reader=dcp.FileSystemReader(str(tmp_path / "r1")), no_dist=True)
    assert rank["rank"] == 1
    code, _, err = _pull(capsys, root, "--job", "pull-two", "--rank", "2", "--to", str(tmp_path / "r2"))
    assert code == 1 and err.count("\n") == 1 and "--rank 2" in err and not (tmp_path / "r2").exists()


def _torchrun(n: int, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-addr", "127.0.0.1",
        "--master-port", str(unused_port()), "-m", "tests.support.pull_rank", *args,
    ]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return finish_group(proc, timeout_s=240)


def test_two_rank_dcp_save_pulls_as_shards_dcp_loads_on_one_process(
    fleet: tuple[Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from .support.pull_rank import LOADER_BATCHES, trained

    server, root = fleet
    run = _torchrun(2, server.target, "pull-dcp", "12")
    assert run.returncode == 0, run.stdout
    assert run.stdout.count("saved") == 2, run.stdout
    code, out, _ = _pull(capsys, root, "--job", "pull-dcp", "--to", str(tmp_path / "dcp"))
    assert code == 0 and "every rank's shards" in out
    # the saved layout is kept: the weight of the first layer is there as two row shards
    metadata = dcp.FileSystemReader(str(tmp_path / "dcp")).read_metadata()
    assert len(metadata.state_dict_metadata["model.0.weight"].chunks) == 2
    got_model, got_opt, loaders = _load(tmp_path / "dcp")
    model, opt = trained()
    _assert_same(got_model, got_opt, model, opt)
    assert loaders["step"] == 12 and len(loaders["ranks"]) == 1  # the coordinator's
    assert loaders["ranks"][0]["steps"] == LOADER_BATCHES
    code, _, err = _pull(capsys, root, "--job", "pull-dcp", "--rank", "1", "--to", str(tmp_path / "r1"))
    assert code == 1 and err.count("\n") == 1 and "every rank's shards" in err


def test_a_bad_job_step_or_target_is_one_line(
    fleet: tuple[Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, root = fleet
    with Checkpointer([server.target], job="pull-bad") as ck:
        ck.save(1, {"model": {"w": torch.ones(3)}}, blocking=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for args, words in [
        (("--job", "pull-nobody"), "has no committed checkpoint"),
        (("--job", "pull-bad", "--step", "2"), "pull-bad@2 does not exist"),
        (("--job", "pull-bad", "--step", "-1"), "a checkpoint step must be"),
        (("--job", "no/such job"), "checkpoint job"),
        (("--job", "pull-bad", "--to", str(tmp_path / "full")), "not an empty directory"),
    ]:
        to = () if "--to" in args else ("--to", str(tmp_path / "out"))
        code, out, err = _pull(capsys, root, *args, *to)
        assert code == 1 and out == "" and err.count("\n") == 1 and err.startswith("shardstream: error:"), (
            args,
            err,
        )
        assert words in err, (args, err)
        assert not (tmp_path / "out").exists()
    # a corrupt chunk: DataLossError naming the tensor, and nothing left behind
    manifest = json.loads((root / manifest_key("pull-bad", 1)).read_text())
    ((h, _),) = manifest["parts"][0]["tensors"]["0"]["chunks"]
    chunk = root / chunk_key("pull-bad", h)
    chunk.write_bytes(b"x" + chunk.read_bytes()[1:])
    code, _, err = _pull(capsys, root, "--job", "pull-bad", "--to", str(tmp_path / "out"))
    assert code == 1 and err.count("\n") == 1 and "tensor 'model/w'" in err and "corrupt" in err, err
    assert not (tmp_path / "out").exists()
    # through the command line itself: one line on stderr, no traceback
    run = run_cli(
        "checkpoint",
        "pull",
        "--checkpoint-root",
        str(root),
        "--job",
        "pull-bad",
        "--step",
        "9",
        "--to",
        str(tmp_path / "o"),
        cwd=tmp_path,
    )
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert "pull-bad@9 does not exist" in run.stderr
