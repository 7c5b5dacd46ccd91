"""A Hugging Face Trainer run on a tiny GPT-2 made from a config, as a process: python -m tests.support.hf_trainer_run CONFIG.

CONFIG is JSON: endpoints, out (the Trainer's output_dir), log, batch_size, accumulate (gradient
accumulation steps), max_steps, save_steps, kill_at (a global step, or null), resume (bool). The run
trains `ShardStreamTrainer` on `toy@1` (column `id`; the input tokens are derived from it) and appends
one JSON line per micro-batch trained to `log`, {"step": global step it belongs to, "ids": [...]}
(flushed). After global step `kill_at` it kills itself with SIGKILL: no handler, no cleanup runs.
A run that ends writes {"end": sha256 of the final parameters, "read": batches its DataLoader read}.
Nothing is downloaded: the model is built from a GPT2Config with a 64-token vocabulary.

`start_ranks` runs it as W data-parallel ranks (one process each, gloo on CPU, all in one process
group): each rank logs to `log` with "{rank}" replaced by its rank, and after `kill_at` rank 0 kills
the whole group with SIGKILL, every rank wherever it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["finish_ranks", "start_ranks", "start_run"]

from .training_runs import REPO, parameters_sha256, start_module_run

VOCAB = 64
SEQ = 8


def main() -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments, set_seed

    from shardstream.client.integrations.hf_trainer import ShardStreamTrainer, TrainingStream

    c = json.loads(sys.argv[1])
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)  # the same sums in every run: resumed parameters equal the whole run's
    set_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    model = GPT2LMHeadModel(config)
    log = open(c["log"].replace("{rank}", str(rank)), "a")  # noqa: SIM115 — open until the process ends or is killed
    read = [0]

    def tokens(batch: dict[str, Any]) -> dict[str, Any]:
        read[0] += 1
        ids = batch["id"]
        input_ids = (ids[:, None] + torch.arange(SEQ)) % VOCAB
        return {"input_ids": input_ids, "labels": input_ids, "sample_id": ids}

    class LoggedTrainer(ShardStreamTrainer):
        def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            ids = inputs.pop("sample_id")
            log.write(json.dumps({"step": self.state.global_step + 1, "ids": ids.tolist()}) + "\n")
            log.flush()
            return super().compute_loss(model, inputs, *args, **kwargs)

    class KillAt(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == c["kill_at"] and rank == 0:
                if world > 1:
                    os.killpg(os.getpgid(0), signal.SIGKILL)  # every rank at once (start_ranks: one group)
                os.kill(os.getpid(), signal.SIGKILL)

    args = TrainingArguments(
        output_dir=c["out"],
        max_steps=c["max_steps"],
        save_strategy="steps",
        save_steps=c["save_steps"],
        gradient_accumulation_steps=c["accumulate"],
        per_device_train_batch_size=c["batch_size"],
        learning_rate=1e-2,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    stream = TrainingStream(c["endpoints"], "toy@1", batch_size=c["batch_size"], columns=["id"], epochs=None, seed=3)
    trainer = LoggedTrainer(model=model, args=args, train_dataset=stream, data_collator=tokens, callbacks=[KillAt()])
    trainer.train(resume_from_checkpoint=True if c["resume"] else None)
    log.write(json.dumps({"end": parameters_sha256(model), "read": read[0]}) + "\n")
    log.close()
    stream.close()


def start_run(config: dict[str, Any]) -> subprocess.Popen[str]:
    """This module as a process in its own session (so a test can kill its whole group)."""
    return start_module_run("tests.support.hf_trainer_run", config)


def start_ranks(config: dict[str, Any], world: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    """This module as `world` data-parallel ranks, as torchrun would start them (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT on a free port; gloo on loopback), all in one new process group, the group of
    rank 0's pid (so that rank 0, or a test, kills them all with one killpg). Each rank's output goes to
    `logs`/rank{r}.out (files: no pipe fills while another rank is waited on)."""
    from .servers import unused_port

    env = {
        **os.environ, "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(unused_port()), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for r in range(world):
            with open(logs / f"rank{r}.out", "ab") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "tests.support.hf_trainer_run", json.dumps(config)],
                    env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                    process_group=0 if r == 0 else procs[0].pid,
                    cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                ))  # fmt: skip
    except BaseException:
        finish_ranks(procs, 0.0)
        raise
    return procs


def finish_ranks(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int | None]:
    """Wait for every rank until `timeout_s` has passed in all; then kill whatever of their process
    group is still running. Their return codes (None: killed here, it had not ended)."""
    deadline = time.monotonic() + timeout_s
    codes: list[int | None] = []
    try:
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        if procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(procs[0].pid, signal.SIGKILL)
        for p in procs:
            p.wait()
    return codes


if __name__ == "__main__":
    main()
