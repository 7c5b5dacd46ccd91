"""Rank and world size as the training launcher set them: torch.distributed, torchrun, or SLURM.

A Loader left at `rank=None, world_size=None` reads its slice of the job from here, so a script run
under `torchrun --nproc-per-node 8` or `srun` reads disjoint parts of the data without passing ranks
by hand. Sources, in order: an initialised `torch.distributed` process group; `RANK`/`WORLD_SIZE`
(torchrun, torch.distributed.launch); `SLURM_PROCID`/`SLURM_NTASKS`; else rank 0 of 1.

torch is never imported here: if the training script initialised torch.distributed, it is already
in `sys.modules`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from shardstream.errors import InvalidArgumentError

__all__ = ["Launch", "from_launcher", "resolve_rank_world"]

log = logging.getLogger("shardstream.client")

_ENV_PAIRS = (
    ("RANK", "WORLD_SIZE", "torchrun (RANK/WORLD_SIZE)"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM (SLURM_PROCID/SLURM_NTASKS)"),
)


@dataclass(frozen=True)
class Launch:
    """Where this process sits in the job, and who said so."""

    rank: int
    world_size: int
    source: str


def _torch_distributed() -> Launch | None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return Launch(int(dist.get_rank()), int(dist.get_world_size()), "torch.distributed")


def _env_int(env: Mapping[str, str], name: str, source: str) -> int:
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"{source}: {name}={text!r} is not an integer") from None


def from_launcher(env: Mapping[str, str] | None = None) -> Launch | None:
    """The launcher's rank and world size, or None outside a launcher."""
    found = _torch_distributed()
    if found is not None:
        return found
    env = os.environ if env is None else env
    for rank_var, world_var, source in _ENV_PAIRS:
        if rank_var in env and world_var in env:
            rank, world = _env_int(env, rank_var, source), _env_int(env, world_var, source)
            if world < 1 or not 0 <= rank < world:
                raise InvalidArgumentError(f"{source}: rank {rank} is not in [0, {world})")
            return Launch(rank, world, source)
    return None


def resolve_rank_world(
    rank: int | None, world_size: int | None, env: Mapping[str, str] | None = None
) -> tuple[int, int]:
    """(rank, world size): explicit values win; what is left unset comes from the launcher, else 0/1.

    An explicit `world_size=1` where the launcher says more logs one warning: every rank of such a
    job reads the whole dataset, which is rarely meant."""
    if rank is not None and world_size is not None:  # explicit: the launcher only informs a warning
        try:
            launch = from_launcher(env) if world_size == 1 else None
        except InvalidArgumentError:
            launch = None
    else:
        launch = from_launcher(env)
    if launch is not None and world_size == 1 and launch.world_size > 1:
        log.warning(
            "world_size=1 was given, but %s says this is rank %d of %d: every rank will read the whole "
            "dataset (leave rank and world_size unset to use the launcher's)",
            launch.source,
            launch.rank,
            launch.world_size,
        )
    if world_size is None:
        world_size = launch.world_size if launch is not None else 1
    if rank is None:
        if launch is not None and launch.world_size != world_size:
            raise InvalidArgumentError(
                f"world_size={world_size} was given but {launch.source} says {launch.world_size}: "
                "pass rank= too, or leave both unset"
            )
        rank = launch.rank if launch is not None else 0
    return rank, world_size
