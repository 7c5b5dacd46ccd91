"""torch.distributed.checkpoint through the fleet: Checkpointer.storage_writer / storage_reader, and
load-time resharding to another world size under torchrun (gloo on CPU): 2 -> 1 and 1 -> 3."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardstream.client.checkpoint import Checkpointer
from shardstream.errors import InvalidArgumentError

from .support.processes import finish_group
from .support.servers import Servers, unused_port

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with Servers(data_root) as servers:
        yield servers.start(extra_args=("--checkpoint-root", str(tmp_path_factory.mktemp("dcp-checkpoints"))))


@pytest.fixture(autouse=True)
def _single_process_dcp() -> Iterator[None]:
    with warnings.catch_warnings():  # dcp says it assumes one process when none is initialized: it is one
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _torchrun(n: int, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-addr", "127.0.0.1",
        "--master-port", str(unused_port()), "-m", "tests.support.dcp_rank", *args,
    ]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return finish_group(proc, timeout_s=240)


def test_dcp_round_trip_in_one_process(server: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    with Checkpointer([server.target], job="dcp-one") as ck:
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, storage_writer=ck.storage_writer(1), no_dist=True)
        assert ck.steps() == [1]
        fresh = torch.nn.Linear(4, 3)
        into = {"model": fresh.state_dict()}
        dcp.load(into, storage_reader=ck.storage_reader("latest"), no_dist=True)
        assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
        ck.save(2, {"w": torch.ones(2)}, blocking=True)
        with pytest.raises(InvalidArgumentError, match="not through DCP"):
            ck.storage_reader(2)


def test_saved_by_two_ranks_loads_on_one(server: Any) -> None:
    from .support.dcp_rank import COLS, ROWS, expected_state

    run = _torchrun(2, server.target, "dcp-2to1", "5", "save")
    assert run.returncode == 0, run.stdout
    want = expected_state()
    with Checkpointer([server.target], job="dcp-2to1") as ck:
        assert ck.steps() == [5]
        into = {"w": torch.zeros(ROWS, COLS), "b": torch.zeros(3), "n": 0}
        dcp.load(into, storage_reader=ck.storage_reader(5), no_dist=True)
    assert torch.equal(into["w"], want["w"]) and torch.equal(into["b"], want["b"]) and into["n"] == 11


def test_saved_by_one_loads_on_three_ranks(server: Any) -> None:
    from .support.dcp_rank import expected_state

    with Checkpointer([server.target], job="dcp-1to3") as ck:
        dcp.save(expected_state(), storage_writer=ck.storage_writer(9), no_dist=True)
    run = _torchrun(3, server.target, "dcp-1to3", "9", "load")
    assert run.returncode == 0, run.stdout
    assert run.stdout.count("load ok") == 3, run.stdout
