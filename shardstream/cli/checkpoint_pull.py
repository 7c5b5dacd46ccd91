"""`shardstream checkpoint pull`: a committed checkpoint as a plain torch.distributed.checkpoint directory.

The directory is the one `dcp.save` writes for the state the job saved: the saved tree at its top
level, so the `dcp.load` a DCP user writes reads it, without shardstream, on any world size:

    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, storage_reader=FileSystemReader(DIR))

Plus one reserved top-level key, LOADER_KEY ("shardstream_loader"): a JSON string (one DCP object,
so a load needs no knowledge of its fields) holding {"job", "step", "world_size", "ranks"}, `ranks`
being the Loader state each rank saved, by rank (null where a rank saved none). Any of them positions
a Loader of any world size, as `Checkpointer.load` does:

    extra = {LOADER_KEY: ""}
    dcp.load(extra, storage_reader=FileSystemReader(DIR))
    loader.load_state_dict(json.loads(extra[LOADER_KEY])["ranks"][0])

A state that already has a top-level key of that name is refused (it would be shadowed).

Checkpoints of several ranks, by how they were saved:

- **Through the DCP plugins** (`dcp.save(state, storage_writer=ckpt.storage_writer(step))`, any
  number of ranks, DTensor/ShardedTensor shards): not consolidated. The directory keeps the saved
  layout — DCP's own Metadata, each saved shard written as DCP's FileSystemWriter writes it (this
  module drives a FileSystemWriter with the saved shards as its plan) — so `dcp.load` reshards it
  to the loading world size exactly as a directory DCP wrote itself, one process included. The pull
  holds one shard in memory at a time: a state larger than the host's memory pulls too. Their
  Loader state is the coordinator's (the only one such a save keeps). `--rank` does not apply.
- **By `Checkpointer.save`** on N ranks: each rank's part is a whole tree (the same tree, for a
  data-parallel job), not a shard. The directory holds one rank's tree: `--rank R`, rank 0 by
  default; when other ranks saved different values (told apart by their chunk names and encoded
  values, nothing read), a note names where. Every rank's Loader state goes under LOADER_KEY.

Every chunk read is verified against its name (a flipped byte is DataLossError naming the
checkpoint and the tensor); a pull that fails removes what it wrote.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shardstream.checkpoint_format import decode_value
from shardstream.client.checkpoint.state_tree import new_array, restore
from shardstream.errors import DataLossError, InvalidArgumentError

__all__ = ["LOADER_KEY", "Pulled", "pull", "rank_state"]

LOADER_KEY = "shardstream_loader"


@dataclass(frozen=True)
class Pulled:
    """What a pull wrote: for the summary line and `--json`."""

    job: str
    step: int
    to: str
    bytes: int  # tensor bytes of the checkpoint read
    saved_by: str  # "dcp": through the DCP plugins; "checkpointer": Checkpointer.save
    world_size: int  # parts of the manifest (1 for a DCP save, whatever its world size)
    rank: int | None  # the rank whose tree was written (None for a DCP save: every rank's shards)
    differing: tuple[str, ...]  # paths where other ranks saved something else than `rank`


def rank_state(store: Any, job: str, part: Mapping[str, Any]) -> Any:
    """The state tree a rank saved with Checkpointer.save, its tensors read from the root and verified."""
    tensors = {}
    for name, t in part["tensors"].items():
        tensor, view = new_array(t["kind"], t["dtype"], t["shape"])
        offset = 0
        for h, size in t["chunks"]:
            view[offset : offset + size] = _chunk(store, job, part["step"], t["path"], h)
            offset += size
        tensors[name] = tensor
    return restore(decode_value(part["objects"]), tensors.__getitem__)


def _chunk(store: Any, job: str, step: int, path: str, h: str) -> bytes:
    """A chunk, verified; DataLossError naming the checkpoint and the tensor when it is missing or corrupt."""
    try:
        data: bytes = store.read_chunk(job, h)
    except DataLossError as exc:
        raise DataLossError(f"checkpoint {job}@{step}: tensor {path!r}: {exc}") from exc
    return data


def pull(store: Any, job: str, step: int, to: Path, rank: int | None = None) -> Pulled:
    """Write checkpoint `job@step` of `store` (a server CheckpointStore) to `to`, new or empty."""
    manifest = store.manifest(job, step)
    parts = {p["rank"]: p for p in manifest["parts"]}
    where = f"checkpoint {job}@{step}"
    dcp_saved = "dcp_metadata" in parts[0]
    if dcp_saved and rank is not None:
        raise InvalidArgumentError(
            f"--rank: {where} was saved through torch.distributed.checkpoint, and its directory holds every "
            "rank's shards (dcp.load reshards them); --rank picks a rank of a Checkpointer.save checkpoint"
        )
    chosen = 0 if rank is None else rank
    if not dcp_saved and chosen not in parts:
        raise InvalidArgumentError(
            f"--rank {chosen}: {where} was saved by ranks 0..{manifest['world_size'] - 1}"
        )
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise InvalidArgumentError(f"--to {to}: not an empty directory (pull writes a new one)")
    loader = json.dumps(
        {
            "job": job,
            "step": step,
            "world_size": manifest["world_size"],
            "ranks": [parts[r].get("loader") for r in sorted(parts)],
        },
        sort_keys=True,
    )
    dcp = _dcp()
    if not dcp_saved:  # checked before a byte is read
        _check_tree(decode_value(parts[chosen]["objects"]), where)
    created = not to.exists()
    differing: tuple[str, ...] = ()
    try:
        if dcp_saved:
            _write_dcp_save(dcp, store, job, parts[0], to, loader, where)
        else:
            differing = _differing(parts, chosen)
            with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
                warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
                state = {**rank_state(store, job, parts[chosen]), LOADER_KEY: loader}
                # dcp.save itself: its planner names the keys as it does for every DCP user
                dcp.save(state, storage_writer=dcp.FileSystemWriter(str(to)), no_dist=True)
    except BaseException:
        _remove_written(to, created)
        raise
    return Pulled(
        job=job,
        step=step,
        to=str(to),
        bytes=int(manifest["bytes"]),
        saved_by="dcp" if dcp_saved else "checkpointer",
        world_size=int(manifest["world_size"]),
        rank=None if dcp_saved else chosen,
        differing=differing,
    )


def _remove_written(to: Path, created: bool) -> None:
    if created:
        shutil.rmtree(to, ignore_errors=True)
        return
    for child in to.iterdir() if to.is_dir() else ():  # it was empty: everything in it is the pull's
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _differing(parts: Mapping[int, Mapping[str, Any]], chosen: int) -> tuple[str, ...]:
    """Paths where another rank saved something else than `chosen` (chunk names and encoded values
    compared: nothing is read); "non-tensor values" when their trees differ."""

    def tensors(part: Mapping[str, Any]) -> dict[str, list[Any]]:
        return {t["path"]: t["chunks"] for t in part["tensors"].values()}

    mine = tensors(parts[chosen])
    out: set[str] = set()
    objects = False
    for r, part in parts.items():
        if r == chosen:
            continue
        theirs = tensors(part)
        out |= {p for p in mine.keys() | theirs.keys() if mine.get(p) != theirs.get(p)}
        objects |= _shape(part["objects"]) != _shape(parts[chosen]["objects"])
    return (*sorted(out), *(["non-tensor values"] if objects else []))


def _shape(objects: Any) -> Any:
    """An encoded tree with its tensor names blanked: ranks number their tensors alike only by chance."""
    if isinstance(objects, Mapping):
        return {k: None if k == "tensor" else _shape(v) for k, v in objects.items()}
    if isinstance(objects, list):
        return [_shape(v) for v in objects]
    return objects


def _dcp() -> Any:
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError as exc:
        raise InvalidArgumentError(
            f"checkpoint pull writes a torch.distributed.checkpoint directory: pip install torch ({exc})"
        ) from exc
    return dcp


def _check_tree(tree: Any, where: str) -> None:
    """A Checkpointer.save tree pull can write: a dict (a DCP directory's top level) without LOADER_KEY."""
    if not isinstance(tree, Mapping):
        raise InvalidArgumentError(
            f"{where} saved a {type(tree).__name__}, and a DCP directory's top level is a dict: pull writes "
            "checkpoints whose state is a dict ({'model': ..., 'optim': ...})"
        )
    if any(str(k) == LOADER_KEY for k in tree):
        raise InvalidArgumentError(
            f"{where}: its state has a top-level {LOADER_KEY!r}, the key pull reserves for the Loader states"
        )


def _write_dcp_save(
    dcp: Any, store: Any, job: str, part: Mapping[str, Any], to: Path, loader: str, where: str
) -> None:
    """A DCP save, written shard by shard as DCP's FileSystemWriter writes a save of these shards:
    the saved Metadata with each shard's place in the files, and LOADER_KEY added."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        MetadataIndex,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        SavePlanner,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    # DCP's Metadata, pickled by FleetStorageWriter (as DCP's own .metadata file is: trust the job)
    saved = pickle.loads(base64.b64decode(part["dcp_metadata"]))
    kept: dict[Any, dict[str, Any]] = saved.storage_data  # MetadataIndex -> the shard's chunks
    if any(f == LOADER_KEY or f.startswith(f"{LOADER_KEY}.") for f in saved.state_dict_metadata):
        raise InvalidArgumentError(
            f"{where}: its state has a top-level {LOADER_KEY!r}, the key pull reserves for the Loader states"
        )

    items, storage = [], {}
    for index, sd in sorted(kept.items(), key=lambda kv: (kv[0].fqn, list(kv[0].offset or []))):
        md = saved.state_dict_metadata[index.fqn]
        if sd["kind"] == "bytes":
            items.append(WriteItem(index=index, type=WriteItemType.BYTE_IO))
        else:
            chunk = ChunkStorageMetadata(
                offsets=torch.Size(index.offset or [0] * len(sd["shape"])), sizes=torch.Size(sd["shape"])
            )
            whole = list(chunk.sizes) == list(md.size)
            data = TensorWriteData(chunk=chunk, properties=md.properties, size=md.size)
            items.append(
                WriteItem(
                    index=index, type=WriteItemType.TENSOR if whole else WriteItemType.SHARD, tensor_data=data
                )
            )
        storage[index] = sd
    loader_index = MetadataIndex(LOADER_KEY)
    items.append(WriteItem(index=loader_index, type=WriteItemType.BYTE_IO))

    class Shards(SavePlanner):
        """Hands the writer each saved shard as it asks for it, read from the root then."""

        def set_up_planner(self, *args: Any, **kwargs: Any) -> None:
            pass

        def create_local_plan(self) -> SavePlan:
            raise NotImplementedError

        def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Any]:
            raise NotImplementedError

        def finish_plan(self, new_plan: SavePlan) -> SavePlan:
            return new_plan

        def resolve_data(self, write_item: WriteItem) -> Any:
            if write_item.index == loader_index:
                out = io.BytesIO()
                torch.save(loader, out)
                return out
            sd = storage[write_item.index]
            fqn = write_item.index.fqn
            buf = bytearray().join(_chunk(store, job, part["step"], fqn, h) for h, _ in sd["chunks"])
            if sd["kind"] == "bytes":
                return io.BytesIO(bytes(buf))  # DCP's own bytes (torch.save of the object), as saved
            tensor, view = new_array("torch", sd["dtype"], sd["shape"])
            view[:] = buf
            return tensor

    writer = dcp.FileSystemWriter(str(to))
    writer.set_up_storage_writer(True, rank=0, use_collectives=True)
    plan = writer.prepare_local_plan(SavePlan(items))
    [plan] = writer.prepare_global_plan([plan])
    results = writer.write_data(plan, Shards()).wait()
    metadata = replace(
        saved,
        state_dict_metadata={**saved.state_dict_metadata, LOADER_KEY: BytesStorageMetadata()},
        planner_data={**saved.planner_data, LOADER_KEY: (LOADER_KEY,)}
        if isinstance(saved.planner_data, Mapping)
        else saved.planner_data,
    )
    writer.finish(metadata, [results])
