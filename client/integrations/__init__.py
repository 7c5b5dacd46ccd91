"""Training frameworks that keep the Loader's state in their own checkpoints (docs/frameworks.md).

    handover.py    TrainingStream: batches a framework reads ahead, a cursor that moves only as each
                   batch reaches the training step (what both integrations stand on; torch only)
    hf_trainer.py  Hugging Face `transformers.Trainer`: ShardStreamTrainer resumes the data where the
                   checkpoint left it, skipping no batches (`pip install 'shardstream[hf]'`)
    lightning.py   PyTorch Lightning: ShardStreamDataModule, its cursor in Lightning's checkpoints, and
                   ShardStreamCheckpointIO, Lightning's checkpoints saved through the fleet
                   (`pip install 'shardstream[lightning]'`)
    torchtitan.py  torchtitan: ShardStreamCheckpointManager, its CheckpointManager committing through the
                   fleet, and ShardStreamDataLoader, whose Loader state is in the same commit
                   (`pip install 'shardstream[torchtitan]'`, then torchtitan with --no-deps)

Nothing here is imported by `shardstream.client`: a client install needs none of the frameworks. Each
module imports its framework when it is imported itself, and says which extra to install if it is
missing.
"""
