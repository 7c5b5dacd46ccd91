"""torchtitan: its CheckpointManager committing through the fleet, and a data loader whose Loader
state is saved in the same commit.

    from shardstream.client.integrations.torchtitan import ShardStreamCheckpointManager, ShardStreamDataLoader

    config = Trainer.Config(            # torchtitan's own Trainer.Config, two fields swapped
        ...,
        dataloader=ShardStreamDataLoader.Config(endpoints=["fleet:50051"], dataset="web@3", column="tokens"),
        checkpoint=ShardStreamCheckpointManager.Config(
            enable=True, interval=500, endpoints=["fleet:50051"], job="run-42", last_save_model_only=False
        ),
    )

or by hand, with what torchtitan's Trainer passes to the two `build()` calls:

    data = ShardStreamDataLoader.Config(endpoints=eps, dataset="web@3").build(
        dp_world_size=W, dp_rank=r, local_batch_size=8)
    ckpt = ShardStreamCheckpointManager.Config(enable=True, interval=100, endpoints=eps, job="run-42").build(
        dataloader=data, model_parts=[model], optimizers=optimizers, lr_schedulers=lr_schedulers,
        states={"train_state": train_state}, sd_adapter=None)
    ckpt.load()                                  # the newest committed step, if any: model, optimizer, data
    for step, (inputs, labels) in enumerate(data, start=train_state.step + 1):
        ...
        ckpt.save(step, last_step=step == steps)

**ShardStreamCheckpointManager** is torchtitan's `CheckpointManager` (torchtitan 0.3.0), whose
`dcp.save` / `dcp.async_save` / `dcp.load` go through `Checkpointer.storage_writer(step)` /
`storage_reader(step)` (client/checkpoint/dcp.py) instead of `checkpoint.folder`: step N of the
job is one atomic commit holding everything torchtitan saves — model, optimizers, lr schedulers,
`states` (the Trainer's step) and the data loader's state — on every rank, resharded on load to any
world size. Nothing is written locally: `folder` becomes the name `shardstream:<job>`. `load()`
reads the newest committed step (or `load_step`); with none committed it is torchtitan's first load
(`initial_load_path`, HF weights, or a fresh start), from where torchtitan reads it. Refused in the
Config, each with a ValueError saying why: `keep_latest_k` other than 0 (a commit is never deleted
by training: `shardstream checkpoint gc --keep N` reclaims old steps), `last_save_in_hf` (HF files
are a local export), and `async_mode="async_with_pinned_mem"` (it pickles the storage writer, with
its gRPC channel, into another process); `async_mode="async"` saves in a thread, as torchtitan does.

**ShardStreamDataLoader** is a torchtitan `BaseDataLoader` over one rank's Loader (`output="torch"`,
rank and world size from the Trainer's `dp_rank` / `dp_world_size`, `local_batch_size` samples a
step). Each batch's `column` (token ids, `[batch, seq_len + 1]`) becomes torchtitan's
`({"input": tokens[:, :-1]}, tokens[:, 1:])`; `to_batch=` maps a batch any other way. The Trainer
takes one batch per microbatch as it trains (no read-ahead), so the Loader's cursor at `save()` is
the step's end. Its `state_dict()` is the Loader state as one JSON string (`STATE_KEY`). A Loader
state carries no rank (its position is the stream's: it resumes any world size and batch size), so
the ranks of a step save one value and DCP keeps one copy; being one opaque value, a saved state
never has to match a fresh Loader's keys at load. `async_save` stages it in the caller's thread: the
commit holds the step's position, not a later one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardstream.errors import InvalidArgumentError

from ..checkpoint import Checkpointer
from ..loader import Loader

try:
    import torch
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpoint import MODEL, AsyncMode, CheckpointManager
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.tools.utils import GarbageCollection
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        f"shardstream.client.integrations.torchtitan needs torchtitan and torch ({exc}): "
        "pip install 'shardstream[torchtitan]' && pip install --no-deps torchtitan==0.3.0"
    ) from exc

__all__ = ["ShardStreamCheckpointManager", "ShardStreamDataLoader"]

FOLDER_PREFIX = "shardstream:"  # the manager's `folder`: a name, never a local directory
_STEP_IN_ID = re.compile(r"^shardstream:.*/step-(\d+)$")

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


class ShardStreamDataLoader(BaseDataLoader):  # type: ignore[misc]
    """One rank's Loader as torchtitan's data loader (module docstring)."""

    STATE_KEY = "shardstream_loader"  # its state_dict's one key: the Loader state, JSON with sorted keys

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):  # type: ignore[misc]
        endpoints: list[str] = field(default_factory=list)
        """The fleet's endpoints (`dataset` is a name@version the fleet serves)."""

        column: str = "tokens"
        """The column of token ids, `seq_len + 1` per sample: inputs and shifted labels."""

        loader_options: dict[str, Any] = field(default_factory=dict)
        """More Loader arguments (seed, shuffle, epochs, transforms, ...); not rank, world_size,
        batch_size or output, which come from the Trainer."""

        to_batch: Callable[[Any], Batch] | None = None
        """Maps a Loader batch to torchtitan's (input_dict, labels); None: the `column` shift."""

        def __post_init__(self) -> None:
            if not self.endpoints or not self.dataset:
                raise ValueError(
                    f"endpoints and dataset are needed, got {self.endpoints!r} and {self.dataset!r}"
                )
            taken = sorted(
                {"rank", "world_size", "batch_size", "output", "job", "resume"} & set(self.loader_options)
            )
            if taken:
                raise ValueError(
                    f"loader_options {taken}: the Trainer sets these (job cursors: the checkpoint holds the state)"
                )

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int = 1,
        dp_rank: int = 0,
        local_batch_size: int,
        **trainer_kwargs: Any,  # tokenizer, seq_len, snapshot_every_n_steps: the servers tokenize, the state is the Loader's
    ) -> None:
        self.config = config
        self.loader = Loader(
            config.endpoints, config.dataset, rank=dp_rank, world_size=dp_world_size,
            batch_size=local_batch_size, output="torch", **config.loader_options,
        )  # fmt: skip

    def __iter__(self) -> Iterator[Batch]:
        to_batch = self.config.to_batch or self._shifted
        for batch in self.loader:
            yield to_batch(batch)

    def _shifted(self, batch: Mapping[str, Any]) -> Batch:
        tokens = batch[self.config.column]
        return {"input": tokens[:, :-1]}, tokens[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {self.STATE_KEY: json.dumps(self.loader.state_dict(), sort_keys=True)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.STATE_KEY not in state_dict:
            raise InvalidArgumentError(
                f"no {self.STATE_KEY!r} in the data loader's saved state: not a ShardStreamDataLoader's"
            )
        self.loader.load_state_dict(json.loads(state_dict[self.STATE_KEY]))

    def close(self) -> None:
        self.loader.close()


class ShardStreamCheckpointManager(CheckpointManager):  # type: ignore[misc]
    """torchtitan's CheckpointManager, saving and loading commits of a fleet job (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):  # type: ignore[misc]
        endpoints: list[str] = field(default_factory=list)
        """The fleet's endpoints."""

        job: str = ""
        """The checkpoint job: step N of the training is step N of the job."""

        checkpointer_options: dict[str, Any] = field(default_factory=dict)
        """More Checkpointer arguments: token, tls, chunk_bytes."""

        keep_latest_k: int = 0
        """0: the fleet keeps every commit (`shardstream checkpoint gc --keep N` reclaims)."""

        def __post_init__(self) -> None:
            CheckpointManager.Config.__post_init__(self)
            if self.enable and (not self.endpoints or not self.job):
                raise ValueError(f"endpoints and job are needed, got {self.endpoints!r} and {self.job!r}")
            if self.keep_latest_k:
                raise ValueError(
                    f"keep_latest_k={self.keep_latest_k}: training deletes no commit; "
                    "`shardstream checkpoint gc --keep N` reclaims old steps"
                )
            if self.last_save_in_hf:
                raise ValueError("last_save_in_hf: HF safetensors are a local export, not a fleet commit")
            if self.async_mode == "async_with_pinned_mem":
                raise ValueError(
                    "async_mode='async_with_pinned_mem' saves from another process, which cannot take the "
                    "storage writer's gRPC channel: use 'async' (a thread) or 'disabled'"
                )
            taken = sorted({"rank", "world_size"} & set(self.checkpointer_options))
            if taken:
                raise ValueError(
                    f"checkpointer_options {taken}: every rank saves through DCP, its rank is the process group's"
                )

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.fleet: Checkpointer | None = None  # this rank's session with the job's checkpoints
        if self.enable:
            self.folder = FOLDER_PREFIX + config.job
            self.fleet = Checkpointer(config.endpoints, config.job, **config.checkpointer_options)

    def _fleet_step(self, checkpoint_id: str) -> int | None:
        found = _STEP_IN_ID.match(str(checkpoint_id))
        return int(found.group(1)) if found else None

    def _session(self) -> Checkpointer:
        if self.fleet is None:
            raise RuntimeError("this checkpoint manager is closed")
        return self.fleet

    def dcp_save(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        async_mode: AsyncMode,
        enable_garbage_collection: bool = False,
        to_hf: bool = False,
    ) -> Any:
        step = self._fleet_step(checkpoint_id)
        if step is None or to_hf:  # pragma: no cover - every id this manager makes is a fleet step's
            raise InvalidArgumentError(
                f"{checkpoint_id!r} is not a step of checkpoint job {self._session().job!r}"
            )
        writer = self._session().storage_writer(step)
        if async_mode == AsyncMode.ASYNC:
            ret = dcp.async_save(state_dict, storage_writer=writer, process_group=self.pg)
        else:
            ret = dcp.save(state_dict, storage_writer=writer)
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return ret

    def dcp_load(
        self, state_dict: dict[str, Any], checkpoint_id: str, from_hf: bool, from_quantized: bool
    ) -> None:
        step = self._fleet_step(checkpoint_id)
        if step is None:  # torchtitan's first load: initial_load_path or HF weights, where they are
            super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
            return
        dcp.load(state_dict, storage_reader=self._session().storage_reader(step))
        if MODEL in self.states:  # torchtitan flattens the model's state into the top level (as it loads it)
            self.states[MODEL].load_state_dict(state_dict)

    def _load(self, step: int = -1) -> bool:
        fleet = self._session()
        if step == -1:
            latest = fleet.latest()
            step = -1 if latest is None else latest
        elif step not in fleet.steps():
            raise FileNotFoundError(
                f"load_step={step} is not a committed step of checkpoint job {fleet.job!r}"
            )
        if step == -1:
            return bool(super()._load(-1))  # no local `folder`: torchtitan's initial load, or a fresh start
        # as torchtitan's own _load for a step in its folder: step 0 is a model-only seed checkpoint
        self.dcp_load(self._states_to_load(step == 0), self._create_checkpoint_id(step), False, False)
        GarbageCollection.collect("GC collection for checkpoint loading.")
        return True

    def _should_purge(self) -> bool:
        return False  # keep_latest_k is 0 (Config)

    def _close(self) -> None:
        super()._close()
        ckpt, self.fleet = self.fleet, None
        if ckpt is not None:
            ckpt.close()
