"""torch.distributed.checkpoint (DCP) plugins over the fleet: `dcp.save`, `dcp.async_save` and
`dcp.load` with a job's checkpoints (DESIGN §13). Made by `Checkpointer.storage_writer` / `storage_reader`,
over its ChunkStore (chunks.py).

    dcp.save(state, storage_writer=ckpt.storage_writer(step))          # every rank
    dcp.load(state, storage_reader=ckpt.storage_reader(step))          # any world size: DCP reshards

Each rank's write items (tensors, shards of DTensors or ShardedTensors, pickled objects) are stored
as content-addressed chunks, as `Checkpointer.save` stores tensors (incremental, verified); DCP's
coordinator then writes one part record holding DCP's Metadata (where each item's bytes are) and
commits the step: committed = the manifest, written last, as for every checkpoint. Loading reads
the Metadata and hands DCP's planner what it asks for, so a checkpoint saved by W ranks loads on W'
ranks (DCP narrows the saved shards to the ones each rank now holds). With `loader=`, the
coordinator's Loader state goes into the commit and every rank's loader is positioned at load.

DCP's Metadata travels pickled (as DCP's own FileSystemWriter stores it): load only checkpoints of
jobs you trust, as with any DCP directory.
"""

from __future__ import annotations

import base64
import io
import pickle
import time
import uuid
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import Metadata, StorageReader, StorageWriter
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from shardstream.checkpoint_format import FORMAT, PART_KIND, check_step, encode_value
from shardstream.errors import DataLossError, InvalidArgumentError

from .chunks import ChunkStore
from .transport import chunk_batches

__all__ = ["FleetStorageReader", "FleetStorageWriter"]


def _bytes_of(t: torch.Tensor) -> memoryview:
    t = t.detach().to("cpu").contiguous()
    if not t.numel():
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


class FleetStorageWriter(StorageWriter):
    def __init__(self, chunks: ChunkStore, step: int, loader: Any = None) -> None:
        super().__init__()
        self.chunks = chunks
        self.step = check_step(step)
        self.loader = loader
        self.is_coordinator = False

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        views, described = [], []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                views.append(memoryview(data.getvalue()))
                described.append({"kind": "bytes", "dtype": "bytes", "shape": []})
            else:
                views.append(_bytes_of(data))
                described.append({"kind": "dcp", "dtype": str(data.dtype).removeprefix("torch."), "shape": list(data.shape)})
        sent: list[str] = []  # the chunks this rank sent (not those the server had)
        try:
            chunks, _, _ = self.chunks.store(views, sent)
        except BaseException:
            self.chunks.abort(sent)  # a failed save leaves nothing no committed step names (a full root frees them)
            raise
        mine = set(sent)
        results = [
            WriteResult(
                index=item.index,
                size_in_bytes=view.nbytes,
                # "sent": for the coordinator to remove them if the commit fails (not kept in the metadata)
                storage_data={**d, "chunks": c, "sent": [h for h, _ in c if h in mine]},
            )
            for item, view, d, c in zip(plan.items, views, described, chunks, strict=True)
        ]
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator's: one part with DCP's Metadata, then the commit. If either fails, the
        chunks every rank sent for this save are removed again (those no committed step names)."""
        sent = sorted({h for rank in results for wr in rank for h in wr.storage_data.pop("sent", ())})
        try:
            self._commit(metadata, results)
        except BaseException:
            if sent:
                self.chunks.abort(sent)
            raise

    def _commit(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {wr.index: wr.storage_data for rank in results for wr in rank}
        tensors = {}
        for i, (index, sd) in enumerate(sorted(metadata.storage_data.items(), key=lambda kv: str(kv[0]))):
            offset = list(index.offset) if index.offset is not None else []
            tensors[str(i)] = {
                "path": f"{index.fqn}{offset if offset else ''}",
                "kind": sd["kind"],
                "dtype": sd["dtype"],
                "shape": sd["shape"],
                "nbytes": sum(size for _, size in sd["chunks"]),
                "chunks": sd["chunks"],
            }
        save_id = uuid.uuid4().hex
        part = {
            "kind": PART_KIND,
            "format": FORMAT,
            "job": self.chunks.job,
            "step": self.step,
            "rank": 0,
            "world_size": 1,
            "save_id": save_id,
            "created_s": time.time(),
            "tensors": tensors,
            "objects": encode_value(None),
            "loader": self.loader.state_dict() if self.loader is not None else None,
            "dcp_metadata": base64.b64encode(pickle.dumps(metadata)).decode(),
        }
        self.chunks.session.action("checkpoint.put-part", {"job": self.chunks.job, "step": self.step, "rank": 0, "part": part})
        self.chunks.commit(self.step, save_id, 1, {})

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # made by Checkpointer.storage_writer only


class FleetStorageReader(StorageReader):
    def __init__(self, chunks: ChunkStore, step: int | str = "latest", loader: Any = None) -> None:
        super().__init__()
        self.chunks = chunks
        self.step = step
        self.loader = loader
        self.metadata: Metadata | None = None
        self._part: dict[str, Any] | None = None

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def _manifest_part(self) -> dict[str, Any]:
        if self._part is None:
            if self.step != "latest":
                check_step(self.step)
            manifest = self.chunks.session.action("checkpoint.manifest", {"job": self.chunks.job, "step": self.step})
            self.step = manifest["step"]
            part = manifest["parts"][0]
            if "dcp_metadata" not in part:
                raise InvalidArgumentError(
                    f"checkpoint {self.chunks.job}@{self.step} was saved by Checkpointer.save, not through DCP: "
                    "load it with Checkpointer.load"
                )
            self._part = part
        return self._part

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata: Metadata = pickle.loads(base64.b64decode(self._manifest_part()["dcp_metadata"]))
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.metadata = metadata
        if self.loader is not None:
            state = self._manifest_part().get("loader")
            if state is None:
                raise InvalidArgumentError(f"checkpoint {self.chunks.job}@{self.step} holds no Loader state")
            self.loader.load_state_dict(state)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        assert self.metadata is not None
        storage = self.metadata.storage_data
        wanted = list(dict.fromkeys(h for req in plan.items for h, _ in storage[req.storage_index]["chunks"]))
        got: dict[str, memoryview] = {}
        where = f"checkpoint {self.chunks.job}@{self.step}"

        def keep(h: str, buf: Any) -> None:
            got[h] = memoryview(buf).cast("B")

        def fetch(batch: list[str]) -> None:
            try:
                self.chunks.session.get_chunks(self.chunks.job, batch, keep)
            except DataLossError as exc:
                h = next((h for h in batch if h in str(exc)), batch[0])
                fqn = next(str(i.fqn) for i, sd in storage.items() if any(c[0] == h for c in sd["chunks"]))
                raise DataLossError(f"{where}: tensor {fqn!r} chunk {h}: {exc}") from exc

        batches = chunk_batches(wanted)
        for future in [self.chunks.pool.submit(fetch, b) for b in batches]:
            future.result()
        for req in plan.items:
            sd = storage[req.storage_index]
            raw = bytearray().join(got[h] for h, _ in sd["chunks"])
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(bytes(raw)))
                continue
            dtype = getattr(torch, sd["dtype"])
            saved = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            tensor = narrow_tensor_by_index(saved.reshape(sd["shape"]), req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise InvalidArgumentError(f"{where}: {req.storage_index.fqn} is {list(tensor.size())}, the target {list(target.size())}")
            target.copy_(tensor)
            planner.commit_tensor(req, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False
