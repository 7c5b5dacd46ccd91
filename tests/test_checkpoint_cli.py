"""`shardstream checkpoint list|show|verify|pull|gc` over a root a real server wrote."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardstream.checkpoint_format import chunk_key
from shardstream.cli import main
from shardstream.client.checkpoint import Checkpointer

from .support.servers import Servers

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def saved(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("cli-checkpoints")
    torch.manual_seed(0)
    state = {"model": {"w": torch.randn(300, 40), "b": torch.zeros(40, dtype=torch.bfloat16)}, "step": 0, "betas": (0.9, 0.99)}
    with Servers(data_root) as servers:
        server = servers.start(extra_args=("--checkpoint-root", str(root)))
        with Checkpointer([server.target], job="cli-job", chunk_bytes=16 << 10) as ck:
            for step in (10, 20, 30):
                state["model"]["w"][0, 0] = step
                state["step"] = step
                ck.save(step, state, blocking=True)
    yield root, state


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["checkpoint", *args])
    return code, capsys.readouterr().out


def test_list_show_verify(saved: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = saved
    code, out = _run(capsys, "list", "--checkpoint-root", str(root), "--json")
    assert code == 0 and json.loads(out) == {"jobs": [{"job": "cli-job", "steps": [10, 20, 30], "damaged": []}]}
    code, out = _run(capsys, "list", "--checkpoint-root", str(root), "--job", "cli-job")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == ["10", "20", "30"]
    code, out = _run(capsys, "show", "--checkpoint-root", str(root), "--job", "cli-job")
    assert code == 0 and "cli-job@30" in out and "model/w  float32[300, 40]" in out and "bfloat16[40]" in out
    code, out = _run(capsys, "verify", "--checkpoint-root", str(root), "--job", "cli-job", "--step", "20")
    assert code == 0 and "verified" in out


def test_pull_writes_a_directory_dcp_loads_without_shardstream(
    saved: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch.distributed.checkpoint as dcp

    root, state = saved
    code, _ = _run(capsys, "pull", "--checkpoint-root", str(root), "--job", "cli-job", "--to", str(tmp_path / "out"))
    assert code == 0
    into = {"model": {"w": torch.empty(300, 40), "b": torch.empty(40, dtype=torch.bfloat16)}, "step": -1, "betas": ()}
    with warnings.catch_warnings():  # dcp says it assumes one process: it is one
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(into, storage_reader=dcp.FileSystemReader(str(tmp_path / "out")), no_dist=True)
    assert torch.equal(into["model"]["w"], state["model"]["w"])
    assert torch.equal(into["model"]["b"], state["model"]["b"])
    assert into["step"] == 30 and into["betas"] == (0.9, 0.99)  # the saved tree at the top level
    code, _ = _run(capsys, "pull", "--checkpoint-root", str(root), "--job", "cli-job", "--to", str(tmp_path / "out"))
    assert code == 1  # not over an existing checkpoint


def test_verify_finds_a_flipped_byte_and_gc_keeps_the_newest(
    saved: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = saved
    code, out = _run(capsys, "show", "--checkpoint-root", str(root), "--job", "cli-job", "--step", "10", "--json")
    manifest = json.loads(out)
    w = next(t for t in manifest["parts"][0]["tensors"].values() if t["path"] == "model/w")
    # the chunk only step 10 names (its first: w[0, 0] differs per step)
    path = root / chunk_key("cli-job", w["chunks"][0][0])
    data = bytearray(path.read_bytes())
    data[5] ^= 1
    path.write_bytes(bytes(data))
    code, out = _run(capsys, "verify", "--checkpoint-root", str(root), "--job", "cli-job", "--step", "10")
    assert code == 1 and "'model/w' chunk 0" in out and "corrupt" in out
    code, out = _run(capsys, "gc", "--checkpoint-root", str(root), "--job", "cli-job", "--keep", "1", "--json")
    report = json.loads(out)
    assert code == 0 and report["kept_steps"] == [30] and report["removed_steps"] == [10, 20]
    assert report["removed_chunks"] >= 2
    code, out = _run(capsys, "verify", "--checkpoint-root", str(root), "--job", "cli-job")
    assert code == 0
    code, out = _run(capsys, "list", "--checkpoint-root", str(root), "--job", "cli-job", "--json")
    assert [c["step"] for c in json.loads(out)["checkpoints"]] == [30]
