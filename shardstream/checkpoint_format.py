"""The checkpoint format both sides agree on (DESIGN §13): names, storage keys, part and manifest records.

No I/O. The client builds part records (client/checkpoint/), the server checks them, stores them and
commits manifests from them (server/checkpoints/). Under a checkpoint root (`serve --checkpoint-root`):

    <job>/chunks/<h[:2]>/<h>             a chunk of tensor bytes, named by its sha256 `h` (content
                                         addressed: an incremental save re-sends only new chunks,
                                         and the name is the checksum a load verifies)
    <job>/parts/<step>/<rank>.json       one rank's part of a save: its tensors (dtype, shape, the
                                         chunks that hold their bytes), its non-tensor values, its
                                         Loader state
    <job>/manifests/<step>.json          the commit: written create-if-absent, LAST, once every
                                         rank's part and every chunk they name is durable; it holds
                                         all the parts (so a load reads one object)

`step` is written as 20 digits, `rank` as 6, so keys sort numerically. A step is **committed** when
its manifest exists; nothing else is ever listed, so a save killed at any point leaves the previous
committed step as `latest`. Parts of steps that never committed and chunks no remaining record names
are what `gc` reclaims.

A part's `objects` is the state's tree with every tensor replaced by a `TensorRef` (written
{"tensor": name}); other values are tagged so that they come back as they went in (a tuple stays a
tuple, an int dict key stays an int, a dict that happens to have a "tensor" key stays a dict): see
`encode_value` / `decode_value`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from shardstream.errors import InvalidArgumentError, excerpt
from shardstream.names import validate_name

__all__ = [
    "CHUNK_BYTES",
    "CHUNK_SCHEMA",
    "CHUNK_TICKET_PREFIX",
    "FORMAT",
    "MANIFEST_KIND",
    "MAX_RANKS",
    "MAX_SAVE_ID",
    "MAX_STEP",
    "PART_KIND",
    "TensorRef",
    "check_hash",
    "check_job",
    "check_part",
    "check_rank",
    "check_save_id",
    "check_step",
    "check_world_size",
    "chunk_hash",
    "chunks_of",
    "chunk_key",
    "decode_value",
    "encode_value",
    "manifest_key",
    "manifest_prefix",
    "part_key",
    "part_prefix",
    "parts_prefix",
    "signed_bytes",
    "step_of_manifest_key",
]

FORMAT = 1
PART_KIND = "shardstream.checkpoint.part"
MANIFEST_KIND = "shardstream.checkpoint"
# Tensor bytes are cut into chunks of this size: big enough that per-object costs (a storage PUT, a
# DoGet batch) are small against the bytes, small enough that one changed slice of a large tensor
# costs one chunk, and that 4 of them in flight per upload bound its memory (client/checkpoint/).
CHUNK_BYTES = 8 << 20
# The rows of a chunk DoPut and a chunk DoGet: one chunk a row, named by its sha256
CHUNK_SCHEMA = pa.schema([("hash", pa.string()), ("data", pa.binary())])
# The data plane's DoGet tickets of checkpoint chunks start with this (never the start of a ReadRequest)
CHUNK_TICKET_PREFIX = b"shardstream.checkpoint.chunks\n"
MAX_STEP = (1 << 63) - 1
MAX_RANKS = 1 << 20
MAX_SAVE_ID = 256  # characters of the id every rank's part of one save carries
_HASH_RE = re.compile(r"[0-9a-f]{64}", re.ASCII)
_TENSOR_NAME_RE = re.compile(r"[0-9]{1,9}", re.ASCII)


def signed_bytes(kind: str, body: bytes) -> bytes:
    """What a certificate caller's grant proof signs for a checkpoint call on the data plane: its
    kind and its bytes (a DoGet: its ticket), so a proof made for one call is worth nothing for another."""
    return f"shardstream.checkpoint.{kind}\n".encode() + body


def check_job(job: object) -> str:
    return validate_name(job, "checkpoint job")


def check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise InvalidArgumentError(f"a checkpoint step must be an int from 0 to {MAX_STEP}, got {excerpt(step)}")
    return step


def check_rank(rank: object) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < MAX_RANKS:
        raise InvalidArgumentError(f"a checkpoint rank must be an int from 0 to {MAX_RANKS - 1}, got {excerpt(rank)}")
    return rank


def check_world_size(world_size: object) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_RANKS:
        raise InvalidArgumentError(
            f"a checkpoint's world_size must be an int from 1 to {MAX_RANKS}, got {excerpt(world_size)}"
        )
    return world_size


def check_save_id(save_id: object) -> str:
    if not isinstance(save_id, str) or not 0 < len(save_id) <= MAX_SAVE_ID:
        raise InvalidArgumentError(
            f"a checkpoint's save_id must be a string of 1 to {MAX_SAVE_ID} characters, got {excerpt(save_id)}"
        )
    return save_id


def check_hash(h: object) -> str:
    if not isinstance(h, str) or not _HASH_RE.fullmatch(h):
        raise InvalidArgumentError(f"a chunk name must be 64 lowercase hex digits (sha256), got {excerpt(h)}")
    return h


def chunk_hash(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def chunk_key(job: str, h: str) -> str:
    return f"{check_job(job)}/chunks/{check_hash(h)[:2]}/{h}"


def manifest_prefix(job: str) -> str:
    return f"{check_job(job)}/manifests/"


def manifest_key(job: str, step: int) -> str:
    return f"{manifest_prefix(job)}{check_step(step):020d}.json"


def step_of_manifest_key(key: str) -> int | None:
    name = key.rpartition("/")[2]
    digits = name[: -len(".json")] if name.endswith(".json") else ""
    return int(digits) if len(digits) == 20 and digits.isascii() and digits.isdigit() else None


def parts_prefix(job: str) -> str:
    return f"{check_job(job)}/parts/"


def part_prefix(job: str, step: int) -> str:
    return f"{parts_prefix(job)}{check_step(step):020d}/"


def part_key(job: str, step: int, rank: int) -> str:
    return f"{part_prefix(job, step)}{rank:06d}.json"


# --- non-tensor values: a tagged JSON tree ----------------------------------------------------------
@dataclass(frozen=True)
class TensorRef:
    """Where a tensor stood in a state tree: its name in the part's `tensors`."""

    name: str


def encode_value(value: Any, path: str = "state") -> Any:
    """`value` (None, bool, int, float, str, list, tuple, dict with such keys; tensors already
    replaced by TensorRefs) as JSON that `decode_value` turns back into the same value."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return {"list": [encode_value(v, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, TensorRef):
        return {"tensor": value.name}
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if k is not None and not isinstance(k, (bool, int, str, float)):
                raise InvalidArgumentError(f"{path}: a dict key of type {type(k).__name__} cannot be checkpointed")
            items.append([encode_value(k, path), encode_value(v, f"{path}[{k!r}]")])
        return {"dict": items}
    raise InvalidArgumentError(
        f"{path}: a value of type {type(value).__name__} cannot be checkpointed (tensors, numbers, strings, "
        "lists, tuples and dicts can)"
    )


def decode_value(tree: Any, tensor: Any = None) -> Any:
    """The value `encode_value` encoded; {"tensor": name} leaves become `tensor(name)`."""
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, Mapping) and len(tree) == 1:
        (tag, body), = tree.items()
        if tag == "tensor":
            return tensor(body) if tensor is not None else TensorRef(body)
        if tag == "float":
            return float(body)
        if tag == "tuple":
            return tuple(decode_value(v, tensor) for v in body)
        if tag == "list":
            return [decode_value(v, tensor) for v in body]
        if tag == "dict":
            return {decode_value(k): decode_value(v, tensor) for k, v in body}
    raise InvalidArgumentError(f"not an encoded checkpoint value: {excerpt(tree)}")


# --- part records -------------------------------------------------------------------------------------
def check_part(part: object, *, job: str, step: int, rank: int | None = None) -> dict[str, Any]:
    """`part` if it is a well-formed part record of `job` at `step` (of `rank` when given)."""
    where = f"checkpoint {job}@{step}: part"
    if not isinstance(part, Mapping) or part.get("kind") != PART_KIND:
        raise InvalidArgumentError(f"{where} is not a checkpoint part record")
    if part.get("format") != FORMAT:
        raise InvalidArgumentError(f"{where} has format {excerpt(part.get('format'))}; this side reads {FORMAT}")
    if part.get("job") != job or part.get("step") != step:
        raise InvalidArgumentError(f"{where} names {excerpt(part.get('job'))}@{excerpt(part.get('step'))}")
    world = part.get("world_size")
    r = part.get("rank")
    if not (isinstance(world, int) and isinstance(r, int) and 0 <= r < world <= MAX_RANKS):
        raise InvalidArgumentError(f"{where}: rank {excerpt(r)} of world size {excerpt(world)} is out of range")
    if rank is not None and r != rank:
        raise InvalidArgumentError(f"{where}: rank {r} sent as rank {rank}")
    if not isinstance(part.get("save_id"), str):
        raise InvalidArgumentError(f"{where}: save_id must be a string")
    tensors = part.get("tensors")
    if not isinstance(tensors, Mapping):
        raise InvalidArgumentError(f"{where}: tensors must be a mapping")
    for name, t in tensors.items():
        if not isinstance(name, str) or not _TENSOR_NAME_RE.fullmatch(name) or not isinstance(t, Mapping):
            raise InvalidArgumentError(f"{where}: bad tensor entry {excerpt(name)}")
        chunks = t.get("chunks")
        if not isinstance(chunks, list) or not all(
            isinstance(c, list) and len(c) == 2 and isinstance(c[1], int) and c[1] >= 0 for c in chunks
        ):
            raise InvalidArgumentError(f"{where}: tensor {name}: chunks must be [[sha256, bytes], ...]")
        for h, _ in chunks:
            check_hash(h)
        if sum(c[1] for c in chunks) != t.get("nbytes"):
            raise InvalidArgumentError(f"{where}: tensor {name}: its chunks do not add up to its nbytes")
        if not isinstance(t.get("path"), str) or not isinstance(t.get("dtype"), str):
            raise InvalidArgumentError(f"{where}: tensor {name}: path and dtype must be strings")
        shape = t.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise InvalidArgumentError(f"{where}: tensor {name}: shape must be a list of sizes")
    loader = part.get("loader")
    if loader is not None and not isinstance(loader, Mapping):
        raise InvalidArgumentError(f"{where}: loader must be a Loader state dict or null")
    return dict(part)


def chunks_of(record: Mapping[str, Any]) -> set[str]:
    """Every chunk a part record (or a manifest: all its parts) names."""
    parts = record.get("parts", [record]) if record.get("kind") == MANIFEST_KIND else [record]
    return {h for p in parts for t in p.get("tensors", {}).values() for h, _ in t.get("chunks", ())}
