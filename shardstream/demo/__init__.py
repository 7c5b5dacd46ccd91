"""`shardstream demo`: the whole loop on one machine, with nothing to set up.

1. make a small classification dataset as JSON Lines and ingest it;
2. start two shard-reader servers as subprocesses;
3. train a tiny torch model on 2 ranks (processes), batch 32, and "preempt" them mid-epoch after
   saving a checkpoint: model replicas averaged, plus the Loader state (one global offset);
4. resume on 3 ranks with batch 24 from that checkpoint and finish the epoch;
5. prove that every sample was seen exactly once;
6. server-side decode: ingest a folder of PNG images, train a small CNN on batches the fleet decoded,
   cropped and normalised (image.decode) — the trainer decodes nothing — and shut the servers down.

Each rank is a process of its own (`python -m shardstream.demo rank …`, rank.py) with its own Loader, like a
real training job; the ranks train model replicas that are averaged at each checkpoint (local SGD),
so no torch.distributed setup is needed.

The package: run.py (the orchestration), rank.py (one rank's training loop), images.py (phase 6).
"""

from .run import run_demo

__all__ = ["run_demo"]
