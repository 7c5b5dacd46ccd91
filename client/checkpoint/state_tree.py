"""A state tree (nested dicts, lists, tuples, scalars; torch tensors or numpy arrays at the leaves)
staged to host memory, and put back.

`stage(state)` is what `Checkpointer.save` does before it returns: every tensor is copied to host
memory (a CUDA tensor into pinned memory, all copies issued before one synchronize; a CPU tensor
into a fresh buffer), so the training step may change its tensors as soon as `save` returns. Its
cost is the save's whole stall: one memory copy of the state.

`restore(tree, tensors, into)` puts a loaded checkpoint back: where `into` has a tensor at the same
path, the bytes are copied into it in place (a model's `state_dict()` tensors are its parameters);
anywhere else a new CPU tensor is made (an optimizer's state before its first step has none).

torch is optional: it is looked up only when the state holds torch tensors (sys.modules), so a
numpy-only state never imports it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.checkpoint_format import TensorRef
from shardstream.errors import InvalidArgumentError

__all__ = ["Staged", "StagedTensor", "new_array", "restore", "stage"]


@dataclass
class StagedTensor:
    path: str  # where it stood in the state ("model/layer.weight"), for messages and DCP
    kind: str  # "torch" or "numpy"
    dtype: str  # torch: "float32", "bfloat16", ...; numpy: its dtype.str ("<f4")
    shape: list[int]
    data: memoryview  # its bytes in host memory, C order
    holder: Any = None  # what keeps `data` alive (the staged tensor or array)


@dataclass
class Staged:
    tree: Any  # the state with TensorRef(str(i)) in place of tensor i
    tensors: list[StagedTensor]

    @property
    def nbytes(self) -> int:
        return sum(t.data.nbytes for t in self.tensors)


def _torch() -> Any:
    return sys.modules.get("torch")


def _is_torch(value: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def stage(state: Any, reuse: Mapping[str, StagedTensor] | None = None) -> Staged:
    """Copy every tensor of `state` to host memory; the rest of the tree as it is. A torch tensor is
    copied into `reuse[path]`'s buffer when it has the same dtype and shape (the last save's, whose
    upload is over): no fresh pages to fault in, which is most of a copy's cost into new memory."""
    tensors: list[StagedTensor] = []
    cuda: list[Any] = []
    reuse = reuse or {}

    def walk(value: Any, path: str) -> Any:
        if _is_torch(value):
            tensors.append(_stage_torch(value, path, cuda, reuse.get(path)))
            return TensorRef(str(len(tensors) - 1))
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise InvalidArgumentError(f"{path}: a numpy array of Python objects cannot be checkpointed")
            copy = np.ascontiguousarray(value).copy()
            tensors.append(StagedTensor(path, "numpy", copy.dtype.str, list(copy.shape), _bytes(copy), copy))
            return TensorRef(str(len(tensors) - 1))
        if isinstance(value, Mapping):
            return {k: walk(v, f"{path}/{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(walk(v, f"{path}/{i}") for i, v in enumerate(value))
        if isinstance(value, list):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(value)]
        return value

    tree = walk(state, "")
    if cuda:
        _torch().cuda.synchronize()  # every device-to-host copy was issued before this one wait
    return Staged(tree, tensors)


def _stage_torch(t: Any, path: str, cuda: list[Any], old: StagedTensor | None) -> StagedTensor:
    torch = _torch()
    if t.layout != torch.strided or t.is_quantized:
        raise InvalidArgumentError(f"{path}: only dense tensors can be checkpointed (got layout {t.layout})")
    src = t.detach()
    buffer = old.holder if old is not None and old.kind == "torch" else None
    if buffer is not None and buffer.dtype == src.dtype and buffer.shape == src.shape and (
        buffer.is_pinned() or not src.is_cuda
    ):
        buffer.copy_(src, non_blocking=src.is_cuda)
        if src.is_cuda:
            cuda.append(buffer)
        return StagedTensor(path, "torch", old.dtype, list(src.shape), old.data, buffer)
    if src.is_cuda:
        staged = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        staged.copy_(src, non_blocking=True)
        cuda.append(staged)
    else:
        staged = src.to("cpu").clone(memory_format=torch.contiguous_format)
    flat = staged.reshape(-1).view(torch.uint8) if staged.numel() else torch.empty(0, dtype=torch.uint8)
    dtype = str(src.dtype).removeprefix("torch.")
    return StagedTensor(path, "torch", dtype, list(src.shape), memoryview(flat.numpy()).cast("B"), staged)


def _bytes(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")


def new_array(kind: str, dtype: str, shape: list[int]) -> tuple[Any, memoryview]:
    """A new CPU tensor (or array) and a writable view of its bytes."""
    if kind == "numpy":
        array = np.empty(shape, dtype=np.dtype(dtype))
        return array, _bytes(array)
    torch = _torch()
    if torch is None:
        import torch  # a checkpoint of torch tensors, loaded by a process that has not imported torch yet
    t = torch.empty(shape, dtype=getattr(torch, dtype))
    flat = t.reshape(-1).view(torch.uint8) if t.numel() else None
    return t, memoryview(flat.numpy()).cast("B") if flat is not None else memoryview(bytearray())


def writable_view(target: Any, kind: str, dtype: str, shape: list[int], path: str) -> memoryview | None:
    """The bytes of `target` (a tensor of the checkpoint's `into`) to load into directly, when it is a
    contiguous CPU tensor of the right dtype and shape; None when it needs a copy (CUDA, strided).
    InvalidArgumentError when it cannot take the saved tensor at all."""
    if _is_torch(target):
        got = (str(target.dtype).removeprefix("torch."), list(target.shape))
        if got != (dtype, shape):
            raise InvalidArgumentError(
                f"{path}: the checkpoint holds {dtype}{shape}, the tensor to load into is {got[0]}{got[1]}"
            )
        if target.device.type == "cpu" and target.is_contiguous() and target.numel():
            return memoryview(target.detach().reshape(-1).view(_torch().uint8).numpy()).cast("B")
        return None
    if isinstance(target, np.ndarray):
        if (target.dtype.str, list(target.shape)) != (dtype, shape):
            raise InvalidArgumentError(f"{path}: the checkpoint holds {dtype}{shape}, into has {target.dtype.str}{list(target.shape)}")
        return _bytes(target) if target.flags.c_contiguous and target.flags.writeable and target.size else None
    return None


def find(into: Any, path: str) -> Any:
    """The value at `path` ("model/layer.weight") of `into`, or None."""
    node = into
    for part in path.split("/") if path else []:
        if isinstance(node, Mapping):
            key = next((k for k in node if str(k) == part), None)
            if key is None:
                return None
            node = node[key]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def restore(tree: Any, tensor: Callable[[str], Any]) -> Any:
    """`tree` with each TensorRef(name) replaced by `tensor(name)`."""
    if isinstance(tree, TensorRef):
        return tensor(tree.name)
    if isinstance(tree, Mapping):
        return {k: restore(v, tensor) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(restore(v, tensor) for v in tree)
    if isinstance(tree, list):
        return [restore(v, tensor) for v in tree]
    return tree
