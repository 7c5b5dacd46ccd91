"""One rank of a torchrun job that saves or loads a sharded state through the fleet's DCP plugins.

    torchrun --nproc-per-node N -m tests.support.dcp_rank ENDPOINT JOB STEP save|load

`save`: the state is `expected_state()` with "w" a DTensor sharded by rows over the N ranks (gloo on
CPU), "b" a plain tensor every rank holds, "n" an int. `load`: the same shapes, zeroed, sharded over
the N ranks of this job (any N: DCP reshards), loaded and checked against `expected_state()`; a
mismatch exits 1.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from shardstream.client.checkpoint import Checkpointer

__all__ = ["expected_state"]

ROWS, COLS = 12, 5


def expected_state() -> dict[str, Any]:
    return {"w": torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS), "b": torch.full((3,), 7.0), "n": 11}


def main(argv: list[str]) -> int:
    endpoint, job, step, mode = argv[0], argv[1], int(argv[2]), argv[3]
    warnings.filterwarnings("ignore", category=UserWarning)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    want = expected_state()
    with Checkpointer([endpoint], job=job) as ckpt:
        if mode == "save":
            state = {"w": distribute_tensor(want["w"], mesh, [Shard(0)]), "b": want["b"], "n": want["n"]}
            dcp.save(state, storage_writer=ckpt.storage_writer(step))
            ok = True
        else:
            into = {"w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(0)]), "b": torch.zeros(3), "n": 0}
            dcp.load(into, storage_reader=ckpt.storage_reader(step))
            full = into["w"].full_tensor()
            ok = torch.equal(full, want["w"]) and torch.equal(into["b"], want["b"]) and into["n"] == want["n"]
    dist.destroy_process_group()
    print(f"rank {dist.get_rank() if dist.is_initialized() else '-'} {mode} {'ok' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
