"""A model and optimizer as training leaves them, and one rank of a torchrun job saving them sharded.

    torchrun --nproc-per-node N -m tests.support.pull_rank ENDPOINT JOB STEP

`trained()` is a small MLP and its Adam after two steps; only elementwise ops touch the values (the
gradients are drawn, not computed), so every process gets the same bits whatever its thread count.
The rank saves `{"model": ..., "optim": ...}` through the fleet's DCP plugins with every tensor of
more than one dimension or element a DTensor sharded by rows over the N ranks (gloo on CPU), the
optimizer's step counts and param_groups as every rank holds them, and its Loader (toy@1, two
batches read) as the coordinator's Loader state.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch

__all__ = ["LOADER_BATCHES", "trained"]

LOADER_BATCHES = 2  # batches each rank's Loader reads before the save


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    draws = torch.Generator().manual_seed(seed + 1)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=draws)
        opt.step()
    return model, opt


def _sharded(value: Any, mesh: Any) -> Any:
    from torch.distributed.tensor import Shard, distribute_tensor

    if isinstance(value, torch.Tensor):
        return distribute_tensor(value, mesh, [Shard(0)]) if value.dim() else value
    if isinstance(value, dict):
        return {k: _sharded(v, mesh) for k, v in value.items()}
    return value


def main(argv: list[str]) -> int:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    from shardstream.client import Loader
    from shardstream.client.checkpoint import Checkpointer

    endpoint, job, step = argv[0], argv[1], int(argv[2])
    warnings.filterwarnings("ignore", category=UserWarning)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, opt = trained()
    state = {"model": _sharded(model.state_dict(), mesh), "optim": _sharded(opt.state_dict(), mesh)}
    with (
        Loader([endpoint], "toy@1", batch_size=4, seed=1) as loader,
        Checkpointer([endpoint], job=job) as ckpt,
    ):
        batches = iter(loader)
        for _ in range(LOADER_BATCHES):
            next(batches)
        dcp.save(state, storage_writer=ckpt.storage_writer(step, loader=loader))
    print(f"rank {dist.get_rank()} saved", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
