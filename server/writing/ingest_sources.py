"""Sources of `shardstream ingest` whose schema is known up front: image folders, WebDataset tars, RL episodes.

Each reader checks the layout first (nothing is written when it is wrong), then yields Arrow record
batches of a fixed schema; `ingest` writes them with the same shard writer and registration path as
JSON Lines and Parquet, and records the source's `metadata` (its modality) in the manifest.

- images: `SRC/<class>/<file>.{jpg,jpeg,png,webp}` (files under a class folder at any depth), one row
  per image: `image` (the file's bytes, not decoded), `label` (int32, the class's index with classes
  sorted by name), `class`, `path` (relative to SRC). A file that is not an image (by extension and
  magic bytes), a file outside a class folder, or an empty class folder is refused.
- webdataset: `*.tar` files (SRC itself or under it); members are grouped into samples by key (the
  member name up to the first dot of its last path component, as WebDataset does), one binary column
  per extension (null where a sample lacks it) plus `__key__`.
- episodes: `*.npz` files, one per episode, each with arrays obs/action/reward/done of the same length
  T; one row per episode, each array a list of T steps (a fixed-size list per step for vectors and
  tensors), plus `episode` (int64, its index in file-name order) and `length` (int32).
Hidden files (a name starting with '.') are never read.
"""

from __future__ import annotations

import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from shardstream.errors import InvalidArgumentError
from shardstream.provenance import PROVENANCE_COLUMNS

__all__ = [
    "FORMATS",
    "IMAGE_SUFFIXES",
    "Source",
    "detect_format",
    "open_source",
]

FORMATS = ("jsonl", "parquet", "images", "webdataset", "episodes")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
TAR_SUFFIXES = (".tar",)
EPISODE_SUFFIXES = (".npz",)
EPISODE_ARRAYS = ("obs", "action", "reward", "done")
_BATCH_ROWS = 1024
_BATCH_BYTES = 32 << 20

Progress = Callable[[int], None]


@dataclass
class Source:
    """A reader's result: the fixed schema, the input size (for progress) and the rows, in batches."""

    schema: pa.Schema
    total_bytes: int
    files: int
    metadata: dict[str, Any]
    batches: Callable[[Progress], Iterator[pa.RecordBatch]]  # calls progress(bytes) as inputs are consumed


def _hidden(path: Path, src: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(src).parts)


def _files(src: Path) -> list[Path]:
    if src.is_file():
        return [src]
    return sorted(p for p in src.rglob("*") if p.is_file() and not _hidden(p, src))


def _kind(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES or suffix in PARQUET_SUFFIXES:
        return "table"
    if suffix in TAR_SUFFIXES:
        return "webdataset"
    if suffix in EPISODE_SUFFIXES:
        return "episodes"
    if suffix in IMAGE_SUFFIXES:
        return "images"
    return None


def detect_format(src: Path) -> str:
    """ "table" (JSON Lines and/or Parquet, today's path) or one of the other FORMATS, from the files."""
    if not src.exists():
        raise InvalidArgumentError(f"{src}: no such file or directory")
    kinds = {k for k in map(_kind, _files(src)) if k is not None}
    if len(kinds) > 1:
        raise InvalidArgumentError(
            f"{src}: mixed inputs ({', '.join(sorted(kinds))}); pass --format to say which to read"
        )
    return kinds.pop() if kinds else "table"  # no inputs at all: the table path says so


def open_source(fmt: str, src: Path) -> Source:
    if not src.exists():
        raise InvalidArgumentError(f"{src}: no such file or directory")
    if fmt == "images":
        return _images(src)
    if fmt == "webdataset":
        return _webdataset(src)
    if fmt == "episodes":
        return _episodes(src)
    raise InvalidArgumentError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


def _chunks(rows: Iterator[tuple[list[Any], int]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Rows (column values, bytes) gathered into record batches of up to _BATCH_ROWS / _BATCH_BYTES."""
    cols: list[list[Any]] = [[] for _ in schema]
    size = 0
    for values, nbytes in rows:
        for col, v in zip(cols, values, strict=True):
            col.append(v)
        size += nbytes
        if len(cols[0]) >= _BATCH_ROWS or size >= _BATCH_BYTES:
            yield pa.RecordBatch.from_arrays(
                [pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)], schema=schema
            )
            cols = [[] for _ in schema]
            size = 0
    if cols[0]:
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)], schema=schema
        )


# --- images ------------------------------------------------------------------------------------
IMAGE_SCHEMA = pa.schema(
    [
        pa.field("image", pa.binary(), nullable=False),
        pa.field("label", pa.int32(), nullable=False),
        pa.field("class", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
    ]
)


def _is_image(data: bytes) -> bool:
    return (
        data.startswith(b"\x89PNG\r\n\x1a\n")
        or data.startswith(b"\xff\xd8\xff")
        or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")
    )


def _images(src: Path) -> Source:
    if not src.is_dir():
        raise InvalidArgumentError(f"{src}: an image dataset is a folder with one sub-folder per class")
    files = _files(src)
    outside = [p for p in files if p.parent == src]
    if outside:
        raise InvalidArgumentError(
            f"{src}: {len(outside)} file(s) outside a class folder (e.g. {outside[0].name}); "
            "images go in SRC/<class>/"
        )
    not_images = [p for p in files if p.suffix.lower() not in IMAGE_SUFFIXES]
    if not_images:
        raise InvalidArgumentError(
            f"{src}: {len(not_images)} file(s) are not images (e.g. {not_images[0].relative_to(src)}); "
            f"only {', '.join(IMAGE_SUFFIXES)} are accepted — move them out, nothing was registered"
        )
    classes = sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise InvalidArgumentError(f"{src}: no class folders (expected SRC/<class>/<image>)")
    by_class: dict[str, list[Path]] = {c: [] for c in classes}
    for p in files:
        by_class[p.relative_to(src).parts[0]].append(p)
    empty = [c for c, ps in by_class.items() if not ps]
    if empty:
        raise InvalidArgumentError(f"{src}: class folder(s) without images: {', '.join(empty[:5])}")

    def rows(progress: Progress) -> Iterator[tuple[list[Any], int]]:
        for label, cls in enumerate(classes):
            for p in by_class[cls]:
                try:
                    data = p.read_bytes()
                except OSError as exc:
                    raise InvalidArgumentError(f"{p}: unreadable ({exc.strerror or exc})") from exc
                if not _is_image(data):
                    raise InvalidArgumentError(f"{p}: not a JPEG, PNG or WebP image (bad magic bytes)")
                progress(len(data))
                yield [data, label, cls, p.relative_to(src).as_posix()], len(data)

    return Source(
        schema=IMAGE_SCHEMA,
        total_bytes=sum(p.stat().st_size for p in files),
        files=len(files),
        metadata={"modality": "image", "classes": classes},
        batches=lambda progress: _chunks(rows(progress), IMAGE_SCHEMA),
    )


# --- WebDataset --------------------------------------------------------------------------------
def _split_member(name: str) -> tuple[str, str]:
    """(key, extension): the key runs up to the first dot of the last path component."""
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem or not ext:
        raise ValueError(name)
    return (f"{head}/{stem}" if head else stem), ext


def _tar_members(path: Path) -> list[tarfile.TarInfo]:
    try:
        with tarfile.open(path, "r:") as tar:
            return [m for m in tar.getmembers() if m.isfile()]
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InvalidArgumentError(f"{path}: not a readable tar file ({exc})") from exc


def _webdataset(src: Path) -> Source:
    tars = [p for p in _files(src) if p.suffix.lower() in TAR_SUFFIXES]
    if not tars:
        raise InvalidArgumentError(f"{src}: no WebDataset shards (expected *.tar)")
    members: dict[Path, list[tarfile.TarInfo]] = {}
    extensions: set[str] = set()
    for tar in tars:
        kept = []
        for m in _tar_members(tar):
            if any(part.startswith(".") for part in m.name.split("/")):
                continue
            try:
                extensions.add(_split_member(m.name)[1])
            except ValueError:
                raise InvalidArgumentError(
                    f"{tar}: member {m.name!r} has no key.extension name (WebDataset samples are KEY.EXT)"
                ) from None
            kept.append(m)
        members[tar] = kept
    if not extensions:
        raise InvalidArgumentError(f"{src}: the tar file(s) hold no samples")
    exts = sorted(extensions)
    bad = [e for e in exts if e in PROVENANCE_COLUMNS or e == "__key__"]
    if bad:
        raise InvalidArgumentError(f"{src}: extension(s) {bad} clash with reserved column names")
    schema = pa.schema(
        [pa.field("__key__", pa.string(), nullable=False)] + [pa.field(e, pa.binary()) for e in exts]
    )
    col = {e: i + 1 for i, e in enumerate(exts)}

    def rows(progress: Progress) -> Iterator[tuple[list[Any], int]]:
        for path, infos in members.items():
            samples: dict[str, list[Any]] = {}
            try:
                with tarfile.open(path, "r:") as tar:
                    for m in infos:
                        key, ext = _split_member(m.name)
                        row = samples.setdefault(key, [key] + [None] * len(exts))
                        if row[col[ext]] is not None:
                            raise InvalidArgumentError(f"{path}: sample {key!r} has two {ext!r} members")
                        f = tar.extractfile(m)
                        assert f is not None  # a regular file
                        row[col[ext]] = f.read()
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise InvalidArgumentError(f"{path}: not a readable tar file ({exc})") from exc
            progress(path.stat().st_size)
            for row in samples.values():
                yield row, sum(len(v) for v in row[1:] if v is not None)

    return Source(
        schema=schema,
        total_bytes=sum(p.stat().st_size for p in tars),
        files=len(tars),
        metadata={"modality": "webdataset", "extensions": exts},
        batches=lambda progress: _chunks(rows(progress), schema),
    )


# --- RL episodes -------------------------------------------------------------------------------
def _load_episode(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in EPISODE_ARRAYS if k not in npz.files]
            if missing:
                raise InvalidArgumentError(
                    f"{path}: missing array(s) {missing} (an episode has {', '.join(EPISODE_ARRAYS)})"
                )
            arrays = {k: npz[k] for k in EPISODE_ARRAYS}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, InvalidArgumentError):
            raise
        raise InvalidArgumentError(f"{path}: not a readable .npz file ({exc})") from exc
    lengths = {k: (a.shape[0] if a.ndim else None) for k, a in arrays.items()}
    if len(set(lengths.values())) != 1 or None in lengths.values():
        shown = ", ".join(f"{k}: {v if v is not None else 'scalar'}" for k, v in lengths.items())
        raise InvalidArgumentError(
            f"{path}: arrays differ in length ({shown}); each needs one entry per step"
        )
    for k, a in arrays.items():
        if a.dtype.kind not in "iufb":
            raise InvalidArgumentError(f"{path}: array {k!r} has dtype {a.dtype}; numbers or booleans only")
    return arrays


def _step_type(dtype: np.dtype, shape: tuple[int, ...]) -> pa.DataType:
    t = pa.bool_() if dtype.kind == "b" else pa.from_numpy_dtype(dtype)
    for d in reversed(shape):
        t = pa.list_(t, d)  # a fixed-size list per step dimension
    return t


def _episodes_column(arrays: list[np.ndarray], step: pa.DataType, shape: tuple[int, ...]) -> pa.Array:
    flat = pa.array(np.concatenate([a.reshape(-1) for a in arrays]) if arrays else [], _step_leaf(step))
    values: pa.Array = flat
    for d in reversed(shape):
        values = pa.FixedSizeListArray.from_arrays(values, d)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _step_leaf(t: pa.DataType) -> pa.DataType:
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def _episodes(src: Path) -> Source:
    files = [p for p in _files(src) if p.suffix.lower() in EPISODE_SUFFIXES]
    if not files:
        raise InvalidArgumentError(f"{src}: no episodes (expected *.npz files)")
    first = _load_episode(files[0])
    dtypes = {k: a.dtype for k, a in first.items()}
    shapes = {k: tuple(a.shape[1:]) for k, a in first.items()}
    steps = {k: _step_type(dtypes[k], shapes[k]) for k in EPISODE_ARRAYS}
    schema = pa.schema(
        [pa.field("episode", pa.int64(), nullable=False)]
        + [pa.field(k, pa.list_(steps[k])) for k in EPISODE_ARRAYS]
        + [pa.field("length", pa.int32(), nullable=False)]
    )

    def conformed(path: Path) -> dict[str, np.ndarray]:
        arrays = first if path == files[0] else _load_episode(path)
        for k, a in arrays.items():
            if a.shape[1:] != shapes[k]:
                raise InvalidArgumentError(
                    f"{path}: {k} has per-step shape {list(a.shape[1:])}, {files[0].name} has {list(shapes[k])}"
                )
            if a.dtype != dtypes[k]:
                if not np.can_cast(a.dtype, dtypes[k], "same_kind"):
                    raise InvalidArgumentError(
                        f"{path}: {k} is {a.dtype}, {files[0].name} has {dtypes[k]} (no safe conversion)"
                    )
                arrays[k] = a.astype(dtypes[k])
        return arrays

    def batches(progress: Progress) -> Iterator[pa.RecordBatch]:
        group: list[dict[str, np.ndarray]] = []
        size = 0
        index = 0
        for path in files:
            arrays = conformed(path)
            group.append(arrays)
            size += sum(a.nbytes for a in arrays.values())
            progress(path.stat().st_size)
            if len(group) >= _BATCH_ROWS or size >= _BATCH_BYTES:
                yield batch(group, index)
                index += len(group)
                group, size = [], 0
        if group:
            yield batch(group, index)

    def batch(group: list[dict[str, np.ndarray]], start: int) -> pa.RecordBatch:
        cols: list[pa.Array] = [pa.array(np.arange(start, start + len(group), dtype=np.int64))]
        for k in EPISODE_ARRAYS:
            cols.append(_episodes_column([g[k] for g in group], steps[k], shapes[k]))
        cols.append(pa.array(np.array([len(g["obs"]) for g in group], dtype=np.int32)))
        return pa.RecordBatch.from_arrays(cols, schema=schema)

    meta: dict[str, Any] = {"modality": "rl_episodes", "episodes": len(files)}
    for k in EPISODE_ARRAYS:
        meta[f"{k}_shape"] = list(shapes[k])
        meta[f"{k}_dtype"] = str(dtypes[k])
    return Source(
        schema=schema,
        total_bytes=sum(p.stat().st_size for p in files),
        files=len(files),
        metadata=meta,
        batches=batches,
    )
