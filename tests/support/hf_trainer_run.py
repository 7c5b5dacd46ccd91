"""A Hugging Face Trainer run on a tiny GPT-2 made from a config, as a process: python -m tests.support.hf_trainer_run CONFIG.

CONFIG is JSON: endpoints, out (the Trainer's output_dir), log, batch_size, accumulate (gradient
accumulation steps), max_steps, save_steps, kill_at (a global step, or null), resume (bool). The run
trains `ShardStreamTrainer` on `toy@1` (column `id`; the input tokens are derived from it) and appends
one JSON line per micro-batch trained to `log`, {"step": global step it belongs to, "ids": [...]}
(flushed). After global step `kill_at` it kills itself with SIGKILL: no handler, no cleanup runs.
A run that ends writes {"end": sha256 of the final parameters, "read": batches its DataLoader read}.
Nothing is downloaded: the model is built from a GPT2Config with a 64-token vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["start_run"]

REPO = Path(__file__).resolve().parents[2]
VOCAB = 64
SEQ = 8


def main() -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments, set_seed

    from shardstream.client.integrations.hf_trainer import ShardStreamTrainer, TrainingStream

    c = json.loads(sys.argv[1])
    torch.set_num_threads(1)  # the same sums in every run: resumed parameters equal the whole run's
    set_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    model = GPT2LMHeadModel(config)
    log = open(c["log"], "a")  # noqa: SIM115 — open until the process ends or is killed
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
            if state.global_step == c["kill_at"]:
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
    digest = hashlib.sha256()
    for _, p in sorted(model.state_dict().items()):
        digest.update(p.detach().contiguous().numpy().tobytes())
    log.write(json.dumps({"end": digest.hexdigest(), "read": read[0]}) + "\n")
    log.close()
    stream.close()


def start_run(config: dict[str, Any]) -> subprocess.Popen[str]:
    """This module as a process in its own session (so a test can kill its whole group)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.hf_trainer_run", json.dumps(config)],
        start_new_session=True,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


if __name__ == "__main__":
    main()
