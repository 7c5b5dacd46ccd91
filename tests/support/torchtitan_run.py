"""A torchtitan training run on a tiny model, as a process: python -m tests.support.torchtitan_run CONFIG.

CONFIG is JSON: endpoints, job (the checkpoint job), log, batch_size, steps, interval (a checkpoint
every N steps) and kill_at (a step, or null). The loop is torchtitan's Trainer.train in small:
`ShardStreamCheckpointManager.load()`, then per step one batch of ShardStreamDataLoader(toy@1),
forward, backward, torchtitan's OptimizersContainer and LRSchedulersContainer, `save(step)`. The model
is built from a config (TinyLM.Config: nothing downloaded). It appends one JSON line per step to
`log`, {"step": N, "ids": [...]} (flushed), and after step `kill_at` kills itself with SIGKILL: no
handler, no cleanup runs. A run that ends writes {"end": sha256 of the final parameters}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = ["start_run"]

from .training_runs import parameters_sha256, start_module_run

SEQ = 6  # tokens per sample: SEQ - 1 inputs, shifted labels


def main() -> None:
    import torch
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw

    from shardstream.client.integrations.torchtitan import ShardStreamCheckpointManager, ShardStreamDataLoader

    c = json.loads(sys.argv[1])
    warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)  # one process: it is
    torch.set_num_threads(1)
    torch.manual_seed(0)
    log = open(c["log"], "a")  # noqa: SIM115 — open until the process ends or is killed

    class TinyLM(torch.nn.Module):
        @dataclass(kw_only=True)
        class Config:
            vocab_size: int = 32
            dim: int = 8

        def __init__(self, config: TinyLM.Config) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(config.vocab_size, config.dim)
            self.out = torch.nn.Linear(config.dim, config.vocab_size)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.out(torch.tanh(self.embed(tokens)))

    class TrainState:  # what torchtitan's Trainer saves as states={"train_state": self}
        step = 0

        def state_dict(self) -> dict[str, Any]:
            return {"step": torch.tensor(self.step)}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.step = int(state["step"])

    seen: list[list[int]] = []

    def to_batch(batch: dict[str, Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        ids = batch["id"]
        seen.append(ids.tolist())
        tokens = torch.stack([(ids * (k + 3) + k) % 32 for k in range(SEQ)], dim=1)
        return {"input": tokens[:, :-1]}, tokens[:, 1:]

    model = TinyLM(TinyLM.Config())
    optimizers = default_adamw(lr=1e-2).build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
        optimizers=optimizers, training_steps=c["steps"]
    )
    data = ShardStreamDataLoader.Config(
        endpoints=c["endpoints"], dataset="toy@1", loader_options={"columns": ["id"], "epochs": None, "seed": 5},
        to_batch=to_batch,
    ).build(dp_world_size=1, dp_rank=0, local_batch_size=c["batch_size"])  # fmt: skip
    state = TrainState()
    ckpt = ShardStreamCheckpointManager.Config(
        enable=True, interval=c["interval"], endpoints=c["endpoints"][:1], job=c["job"], last_save_model_only=False
    ).build(
        dataloader=data, model_parts=[model], optimizers=optimizers, lr_schedulers=lr_schedulers,
        states={"train_state": state}, sd_adapter=None,
    )  # fmt: skip
    ckpt.load()
    batches = iter(data)
    while state.step < c["steps"]:
        state.step += 1
        inputs, labels = next(batches)
        log.write(json.dumps({"step": state.step, "ids": seen[-1]}) + "\n")
        log.flush()
        logits = model(inputs["input"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        loss.backward()
        optimizers.step()
        lr_schedulers.step()
        optimizers.zero_grad()
        ckpt.save(state.step, last_step=state.step == c["steps"])
        if state.step == c["kill_at"]:
            os.kill(os.getpid(), signal.SIGKILL)
    ckpt.close()
    data.close()
    log.write(json.dumps({"end": parameters_sha256(model)}) + "\n")
    log.close()


def start_run(config: dict[str, Any]) -> subprocess.Popen[str]:
    """This module as a process in its own session (so a test can kill its whole group)."""
    return start_module_run("tests.support.torchtitan_run", config)


if __name__ == "__main__":
    main()
