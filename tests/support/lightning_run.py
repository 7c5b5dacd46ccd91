"""A Lightning run on a tiny torch model, as a process: python -m tests.support.lightning_run CONFIG.

CONFIG is JSON: endpoints, dir (ModelCheckpoint's dirpath), log, batch_size, max_steps, every (a
checkpoint every N training steps), kill_at (a global step, or null), resume (a ckpt_path, or null),
and job (null: Lightning's own checkpoint files; a job name: ShardStreamCheckpointIO saves them
through the fleet at endpoints[0]). The run fits `ShardStreamDataModule(toy@1, column id)` and
appends one JSON line per training step to `log`, {"step": global step, "ids": [...]} (flushed).
After global step `kill_at` it kills itself with SIGKILL: no handler, no cleanup runs. A run that
ends writes {"end": sha256 of the final parameters}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

__all__ = ["start_run"]

from .training_runs import parameters_sha256, start_module_run


def main() -> None:
    import lightning.pytorch as pl
    import torch

    from shardstream.client.integrations.lightning import ShardStreamCheckpointIO, ShardStreamDataModule

    c = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    log = open(c["log"], "a")  # noqa: SIM115 — open until the process ends or is killed

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            ids = batch["id"]
            log.write(json.dumps({"step": self.global_step + 1, "ids": ids.tolist()}) + "\n")
            log.flush()
            x = torch.stack([(ids % k).float() / k for k in (2, 3, 5, 7)], dim=1)
            return torch.nn.functional.mse_loss(self.net(x).squeeze(1), (ids % 11).float() / 11)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    class KillAt(pl.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == c["kill_at"]:
                os.kill(os.getpid(), signal.SIGKILL)

    plugins = [ShardStreamCheckpointIO(c["endpoints"][:1], job=c["job"])] if c["job"] else []
    trainer = pl.Trainer(
        max_steps=c["max_steps"],
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        plugins=plugins,
        callbacks=[
            pl.callbacks.ModelCheckpoint(dirpath=c["dir"], every_n_train_steps=c["every"], save_top_k=-1),
            KillAt(),
        ],
    )
    model = Tiny()
    data = ShardStreamDataModule(c["endpoints"], "toy@1", batch_size=c["batch_size"], columns=["id"], epochs=None, seed=5)
    trainer.fit(model, datamodule=data, ckpt_path=c["resume"])
    log.write(json.dumps({"end": parameters_sha256(model)}) + "\n")
    log.close()


def start_run(config: dict[str, Any]) -> subprocess.Popen[str]:
    """This module as a process in its own session (so a test can kill its whole group)."""
    return start_module_run("tests.support.lightning_run", config)


if __name__ == "__main__":
    main()
