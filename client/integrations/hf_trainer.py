"""Hugging Face `transformers.Trainer` on a shardstream Loader, resumed without skipping a batch.

    from transformers import TrainingArguments
    from shardstream.client.integrations.hf_trainer import ShardStreamTrainer, TrainingStream

    stream = TrainingStream(endpoints, "web@3", batch_size=8, columns=["input_ids", "labels"], epochs=None)
    args = TrainingArguments("out", max_steps=10_000, save_steps=500)    # max_steps: a stream has no len()
    trainer = ShardStreamTrainer(model=model, args=args, train_dataset=stream)
    trainer.train(resume_from_checkpoint=True if resuming else None)   # True: the newest out/checkpoint-*

What the Trainer does by default when it resumes on an iterable dataset: it reads every batch the
run had trained before it trains one (accelerate's skip_first_batches; transformers issue #11284),
so the time to resume grows with the run's length (loadtest/hf_resume_bench.py: the table is in
loadtest/README.md). ShardStreamTrainer instead:

- saves the Loader's state (a small JSON dict) with every checkpoint, in the checkpoint's
  trainer_state.json ("stateful_callbacks" → ShardStreamCallback), the file that also holds the
  global step: a checkpoint never pairs a step with another step's cursor. It is the cursor after the
  last micro-batch trained, however far the data was read ahead (TrainingStream, handover.py);
- on resume, loads it before the first batch is read, and sets `args.ignore_data_skip = True` (the
  Trainer would otherwise skip that many batches again). A checkpoint without that state is refused
  (FailedPreconditionError) rather than restarting the data from its beginning;
- trains on `DataLoader(stream, batch_size=None, num_workers=0)`: batches are made upstream and the
  Loader prefetches in a thread. The DataLoader is not handed to accelerate, which would read on rank
  0 and send each rank its part: each rank reads its own slice from the fleet (rank and world size
  from torch.distributed, as any Loader);
- calls `data_collator`, when one is given, on each ready batch (a dict of tensors) — to rename or
  derive columns — not on a list of samples.

Under several ranks the checkpoint holds rank 0's state, which resumes every rank (a Loader state
is global). Loader epochs: `epochs=None` streams a fresh order each epoch until max_steps; with
`epochs=E` training stops when they end, if max_steps comes later.

`ShardStreamCallback` is the half that saves and restores; a Trainer subclass of your own that
builds its DataLoader over a TrainingStream can add it instead (and set ignore_data_skip).
"""

from __future__ import annotations

from typing import Any

from shardstream.errors import FailedPreconditionError, InvalidArgumentError

from .handover import TrainingStream

try:
    from torch.utils.data import DataLoader
    from transformers import Trainer, TrainerCallback
    from transformers.trainer_callback import ExportableState
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        f"shardstream.client.integrations.hf_trainer needs transformers and torch ({exc}): "
        "pip install 'shardstream[hf]'"
    ) from exc

__all__ = ["ShardStreamCallback", "ShardStreamTrainer", "TrainingStream"]


class ShardStreamCallback(TrainerCallback, ExportableState):  # type: ignore[misc]
    """Keeps a TrainingStream's state in the Trainer's checkpoints and restores it on resume.

    The Trainer's train DataLoader must iterate a TrainingStream (its `.dataset`). Each micro-batch
    trained (on_substep_end, on_step_end) moves the stream's cursor; `state()` is what the Trainer
    writes into trainer_state.json when it saves; on_train_begin of a resumed run loads it. Takes no
    arguments, so `restore_callback_states_from_checkpoint=True` may rebuild it."""

    def __init__(self) -> None:
        self.stream: TrainingStream | None = None

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"loader_state": None if self.stream is None else self.stream.state_dict()}}

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
        stream = getattr(train_dataloader, "dataset", None)
        if not isinstance(stream, TrainingStream):
            raise InvalidArgumentError(
                f"ShardStreamCallback needs a train DataLoader over a TrainingStream, got {type(stream).__name__}"
            )
        self.stream = stream
        if state.global_step == 0:
            return  # a fresh run: the stream starts where it is
        saved = state.stateful_callbacks.get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        loader_state = ((saved or {}).get("attributes") or {}).get("loader_state")
        if loader_state is None:
            raise FailedPreconditionError(
                f"the checkpoint at global step {state.global_step} holds no shardstream Loader state (it was "
                "saved without ShardStreamCallback): resuming would start the data over"
            )
        stream.load_state_dict(loader_state)

    def _trained(self) -> None:
        if self.stream is not None:
            self.stream.handed_over()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._trained()  # a micro-batch trained, gradients accumulating

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._trained()  # the step's last micro-batch trained; a checkpoint may follow


def _as_is(batch: Any) -> Any:
    return batch


class ShardStreamTrainer(Trainer):  # type: ignore[misc]
    """`transformers.Trainer` whose `train_dataset` is a TrainingStream (module docstring): the same
    arguments, with `data_collator` applied to each ready batch. Needs `args.max_steps`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._batch_fn = kwargs.get("data_collator") or _as_is
        super().__init__(*args, **kwargs)
        self.args.ignore_data_skip = True  # the Loader resumes itself; skipping would drop batches again
        if not any(isinstance(cb, ShardStreamCallback) for cb in self.callback_handler.callbacks):
            self.add_callback(ShardStreamCallback())

    def get_train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        stream = self.train_dataset
        if not isinstance(stream, TrainingStream):
            raise InvalidArgumentError(
                f"ShardStreamTrainer trains on a TrainingStream, got train_dataset={type(stream).__name__}"
            )
        self.args.ignore_data_skip = True
        return DataLoader(stream, batch_size=None, num_workers=0, collate_fn=self._batch_fn)
