"""A trainer that saves checkpoints and is killed with SIGKILL at a chosen point of one save.

    python -m tests.support.checkpoint_saver ENDPOINT JOB FIRST LAST CRASH_STEP CRASH_CALL [RANK WORLD]

saves steps FIRST..LAST of `state_at(step)` (a numpy state: no torch import, so each run starts fast);
during the save of CRASH_STEP it kills itself with SIGKILL just before its CRASH_CALL-th call to the
server (0: the first `has`; then each DoPut of chunks, the part, each commit), and, with CRASH_CALL
-1, in the middle of a DoPut after half its chunks were written. The process really dies by SIGKILL:
no handler, no flush, no cleanup runs. As RANK of WORLD (default 0 of 1) it saves its part of each
step, `{"rank": RANK}` and a tensor of its own added to the state; its save id comes from
$TORCHELASTIC_RUN_ID, as under torchrun.

The calls of a save are counted, so each save must make the same calls whatever the other ranks do:
the ranks' states share most tensors, and a rank whose every chunk another rank had already stored
would skip its DoPut (its part would become call 1 and its commit call 2). The rank's own tensor,
new every step, keeps one DoPut in each save.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import numpy as np

from shardstream.client.checkpoint import Checkpointer
from shardstream.client.checkpoint.transport import CheckpointSession

__all__ = ["state_at"]

CHUNK_BYTES = 1 << 14


def state_at(step: int) -> dict[str, Any]:
    """The state a job holds at `step`: one tensor changes every step, one every other step, one never."""
    rng = np.random.default_rng(step)
    return {
        "model": {
            "frozen": np.arange(20_000, dtype=np.float32),
            "slow": np.full(12_000, step // 2, dtype=np.int64),
            "fast": rng.standard_normal(9_000).astype(np.float32),
        },
        "step": step,
        "lr": 0.1 / (1 + step),
    }


def main(argv: list[str]) -> None:
    endpoint, job = argv[0], argv[1]
    first, last, crash_step, crash_call = (int(a) for a in argv[2:6])
    rank, world = (int(a) for a in argv[6:8]) if len(argv) >= 8 else (0, 1)
    calls = [0]
    saving = [0]

    def die() -> None:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def counted(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if saving[0] == crash_step:
                if calls[0] == crash_call:
                    die()
                calls[0] += 1
            return fn(*args, **kwargs)

        return call

    put_chunks = CheckpointSession.put_chunks

    def put_half(self: CheckpointSession, job: str, chunks: Any) -> Any:
        if saving[0] == crash_step and crash_call == -1 and len(chunks) > 1:
            put_chunks(self, job, chunks[: len(chunks) // 2])
            die()
        return put_chunks(self, job, chunks)

    CheckpointSession.action = counted(CheckpointSession.action)  # type: ignore[method-assign]
    CheckpointSession.put_chunks = counted(put_half)  # type: ignore[method-assign]
    with Checkpointer([endpoint], job=job, rank=rank, world_size=world, chunk_bytes=CHUNK_BYTES) as ckpt:
        for step in range(first, last + 1):
            saving[0] = step
            state = state_at(step)
            own = np.full(256, step * world + rank, dtype=np.int64)  # chunks no other rank or step has
            state["model"] = {**state["model"], f"rank{rank}": own}
            ckpt.save(step, {**state, "rank": rank}, blocking=True)
            print(f"committed {step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
