"""PyTorch Lightning: a DataModule whose cursor rides in Lightning's checkpoints, and a CheckpointIO
that keeps those checkpoints on the fleet.

    import lightning as L
    from shardstream.client.integrations.lightning import ShardStreamCheckpointIO, ShardStreamDataModule

    data = ShardStreamDataModule(endpoints, "web@3", batch_size=32, epochs=None)   # Loader's arguments
    trainer = L.Trainer(max_steps=10_000, callbacks=[L.pytorch.callbacks.ModelCheckpoint(every_n_train_steps=500)])
    trainer.fit(model, datamodule=data, ckpt_path=path_or_none)   # resumes at the sample after the checkpoint's

**ShardStreamDataModule** trains on `DataLoader(TrainingStream(...), batch_size=None, num_workers=0)`
(handover.py: batches are made upstream, the Loader prefetches in a thread). Lightning's fetcher reads
one batch ahead of the training step; the module's `on_before_batch_transfer` hook — which Lightning
calls as each training batch goes to the step — moves the stream's cursor, so `state_dict()` is the
position after the last batch trained. Lightning saves it in every checkpoint (under the DataModule's
class name) and `load_state_dict()` puts it back before the first batch of a resumed fit is read: a
run killed after checkpoint k trains next on the batch an uninterrupted run trains after k. Resuming
from a checkpoint without that state is refused (FailedPreconditionError) rather than starting the
data over. Under DDP every rank reads its own slice (rank and world size from the process group);
the checkpoint holds rank 0's state, which resumes every rank. A LightningModule that also overrides
`on_before_batch_transfer` is not called for it (Lightning calls the DataModule's and warns); a
`training_step` that takes `dataloader_iter` bypasses the hook and is not supported. The stream has no
`len()`: set `max_steps`, or `epochs=E` on the Loader and `max_epochs=1` (one Lightning epoch is the
whole stream; a later one continues from the cursor).

**ShardStreamCheckpointIO** (`L.Trainer(plugins=[ShardStreamCheckpointIO(endpoints, job="run-42")])`)
saves each Lightning checkpoint through `Checkpointer` (DESIGN §13: content-addressed chunks, an
incremental save sends what changed, one atomic commit per step) as step `checkpoint["global_step"]`
of the job, from global rank 0 (Lightning saves there; the state is rank 0's under DDP), and returns
once it is committed. Paths are names only — nothing is written to the local filesystem — and map to
steps: loading reads the step in the path's `step=N` (Lightning's default file names carry it, e.g.
`epoch=0-step=500.ckpt`), or the newest committed one for `ShardStreamCheckpointIO.LATEST`
(`trainer.fit(..., ckpt_path=ShardStreamCheckpointIO.LATEST)`; Lightning's own "last" looks for local
files). A step is committed once: a second file name at the same global step (`last.ckpt` beside
`epoch=0-step=500.ckpt`) is the same commit and is not sent again. `remove_checkpoint` removes
nothing: ModelCheckpoint's `save_top_k` cannot delete a commit; `shardstream checkpoint gc --keep N`
reclaims old steps.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Any

from shardstream.errors import FailedPreconditionError, InvalidArgumentError

from ..checkpoint import Checkpointer
from .handover import TrainingStream

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins import CheckpointIO
    from torch.utils.data import DataLoader
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        f"shardstream.client.integrations.lightning needs lightning and torch ({exc}): "
        "pip install 'shardstream[lightning]'"
    ) from exc

__all__ = ["ShardStreamCheckpointIO", "ShardStreamDataModule", "TrainingStream"]

log = logging.getLogger("shardstream.client.integrations")

_STEP_IN_NAME = re.compile(r"(?:^|[^A-Za-z0-9])step=(\d+)")


class ShardStreamDataModule(pl.LightningDataModule):  # type: ignore[misc]
    """A LightningDataModule over one rank's Loader stream (module docstring). Arguments: the
    Loader's (`output` defaults to "torch"), checked here before any network call."""

    def __init__(self, endpoints: str | Sequence[str], dataset: Any, **loader_kwargs: Any) -> None:
        super().__init__()
        self.stream = TrainingStream(endpoints, dataset, **loader_kwargs)
        self._restored = False

    def train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        trainer = self.trainer
        if trainer is not None and trainer.ckpt_path and not self._restored:
            raise FailedPreconditionError(
                f"the checkpoint {trainer.ckpt_path} holds no state of {type(self).__qualname__} (saved "
                "without it, or by a DataModule of another class name): resuming would start the data over"
            )
        return DataLoader(self.stream, batch_size=None, num_workers=0)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is not None and trainer.training:
            self.stream.handed_over()  # this batch goes to training_step: the cursor moves past it
        return batch

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stream.load_state_dict(state_dict)
        self._restored = True

    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self.stream.close()


class ShardStreamCheckpointIO(CheckpointIO):  # type: ignore[misc]
    """Lightning's checkpoint I/O through the fleet (module docstring). Arguments: the
    Checkpointer's (endpoints, job, token=, tls=, chunk_bytes=); it saves as rank 0 of 1."""

    LATEST = "shardstream:latest"

    def __init__(self, endpoints: str | Sequence[str], job: str, **checkpointer_kwargs: Any) -> None:
        for key in ("rank", "world_size"):
            if key in checkpointer_kwargs:
                raise InvalidArgumentError(f"{key}: Lightning saves on global rank 0 only; the checkpoint is rank 0's")
        self._endpoints = endpoints
        self._job = job
        self._kwargs = checkpointer_kwargs
        self._ckpt: Checkpointer | None = None
        self._saved: dict[str, int] = {}  # path -> the step it names, for what this process saved

    @property
    def checkpointer(self) -> Checkpointer:
        if self._ckpt is None:
            self._ckpt = Checkpointer(self._endpoints, self._job, rank=0, world_size=1, **self._kwargs)
        return self._ckpt

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise InvalidArgumentError("ShardStreamCheckpointIO takes no storage_options")
        step = int(checkpoint["global_step"])
        if step not in self._saved.values() and step not in self.checkpointer.steps():
            self.checkpointer.save(step, checkpoint, blocking=True)
        self._saved[os.fspath(path)] = step

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        step = self.step_of(path)
        state = self.checkpointer.load(step)
        return dict(state)

    def remove_checkpoint(self, path: Any) -> None:
        step = self._saved.pop(os.fspath(path), None)
        if step is not None:
            log.info("checkpoint %s (step %d of %s) stays committed: `shardstream checkpoint gc --keep N` reclaims old steps", path, step, self._job)

    def step_of(self, path: Any) -> int | str:
        """The committed step a checkpoint path names: LATEST -> "latest", a name with `step=N` -> N."""
        name = os.fspath(path)
        if name == self.LATEST:
            return "latest"
        if name in self._saved:
            return self._saved[name]
        found = _STEP_IN_NAME.findall(os.path.basename(name))
        if not found:
            raise InvalidArgumentError(
                f"{name!r} names no step of checkpoint job {self._job!r}: give a path with 'step=N' in its "
                f"name (Lightning's default names have it) or {self.LATEST!r}"
            )
        return int(found[-1])

    def teardown(self) -> None:
        ckpt, self._ckpt = self._ckpt, None
        if ckpt is not None:
            ckpt.close()
