"""Where datasets live: one small interface, a local directory and `s3://bucket/prefix` behind it.

Everything the registry and the server read or write goes through `Storage`, addressed by a *key*:
a relative, '/'-separated path under the storage's root. Keys are checked before any I/O
(`check_key`): no absolute paths, no '..' (also percent-encoded), no scheme, no backslash — so a
manifest or a command line can never make shardstream read outside its root.

    open_local_storage("/data/registry")    LocalStorage   (plain directory; O_EXCL creates)
    S3Storage("s3://bucket/prefix")         (shardstream.server.s3, aiobotocore; needs
                                            `shardstream[server]`; shardstream.server.roots opens
                                            either kind by URL)

All methods are blocking and thread-safe (the S3 backend runs its own event loop). Errors are
shardstream errors: a missing object is NotFoundError, an object changed since it was opened is
DataLossError, refused credentials are UnauthenticatedError/PermissionDeniedError, an unreachable
store is UnavailableError.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from shardstream.errors import InvalidArgumentError, NotFoundError

__all__ = ["LocalStorage", "ObjectInfo", "ObjectRef", "Storage", "check_key", "open_local_storage"]

CHUNK_BYTES = 1 << 20
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def check_key(key: str, what: str = "path") -> str:
    """`key` if it is a safe relative key under a root; InvalidArgumentError otherwise.

    Percent-encoding is decoded (repeatedly) before the checks, so `%2e%2e/` is caught as `../`.
    """
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"{what} must be a non-empty relative path, got {key!r}")
    decoded = key
    for _ in range(4):
        again = unquote(decoded)
        if again == decoded:
            break
        decoded = again
    bad = ""
    if "\x00" in decoded:
        bad = "contains a NUL byte"
    elif "\\" in decoded:
        bad = "contains a backslash"
    elif _SCHEME_RE.match(decoded) or "://" in decoded:
        bad = "is a URI, not a relative path"
    elif decoded.startswith(("/", "~")):
        bad = "is absolute"
    elif any(part in ("..", ".") for part in decoded.split("/")):
        bad = "has a '.' or '..' segment"
    elif "//" in decoded.rstrip("/"):
        bad = "has an empty segment"
    if bad:
        raise InvalidArgumentError(f"{what} {key!r} {bad}: only relative paths under the root are allowed")
    return key


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    etag: str  # changes whenever the object is rewritten (local: mtime, size and inode)


class Storage(ABC):
    """A flat key -> bytes store under one root (see the module docstring)."""

    url: str

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # noqa: B027 — optional
        """Release connections (idempotent)."""

    def url_of(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{check_key(key)}"

    @abstractmethod
    def check_root(self) -> None:
        """Raise a clear error when the root cannot be used (missing, unreachable, refused)."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo: ...

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    @abstractmethod
    def get_range(self, key: str, start: int, length: int, *, etag: str | None = None) -> bytes:
        """`length` bytes from `start`; with `etag`, DataLossError if the object changed since."""

    @abstractmethod
    def iter_chunks(self, key: str, *, etag: str | None = None) -> Iterator[bytes]:
        """The whole object, streamed in chunks (for hashing without holding it)."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write `data` at `key`, replacing it atomically (readers see old or new, never a mix)."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write only if `key` does not exist; False (nothing written) when it does."""

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every key under the directory `prefix` (recursive, sorted); [] when there is none."""

    @abstractmethod
    def children(self, prefix: str) -> list[str]:
        """Names of the immediate sub-directories of `prefix` ('' for the root), sorted."""

    def local_path(self, key: str) -> Path | None:
        """The file behind `key` when the storage is a local directory (fast paths), else None."""
        return None

    def digest(self, key: str, *, etag: str | None = None) -> tuple[int, str]:
        """(size, sha256 hex) of the object's content."""
        h = hashlib.sha256()
        size = 0
        for chunk in self.iter_chunks(key, etag=etag):
            h.update(chunk)
            size += len(chunk)
        return size, h.hexdigest()


@dataclass(frozen=True)
class ObjectRef:
    """One object of a storage: what the registry hands the server for a shard."""

    storage: Storage
    key: str

    def __str__(self) -> str:
        return self.storage.url_of(self.key)


class LocalStorage(Storage):
    """A local directory. Writes go through a private temp file; creates are exclusive (link)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        check_key(key)
        path = self.root / key
        # Symlinks must not lead outside the root either.
        real_root = self.root.resolve()
        real = path.resolve()
        if real != real_root and real_root not in real.parents:
            raise InvalidArgumentError(f"path {key!r} leads outside the root {self.root} (a symlink?)")
        return path

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def check_root(self) -> None:
        if not self.root.is_dir():
            raise InvalidArgumentError(f"--root {self.root}: no such directory")

    def head(self, key: str) -> ObjectInfo:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"{self.url_of(key)}: no such file") from None
        return ObjectInfo(st.st_size, f"{st.st_mtime_ns:x}-{st.st_size:x}-{st.st_ino:x}")

    def _check_etag(self, key: str, etag: str | None) -> None:
        if etag is not None and self.head(key).etag != etag:
            from shardstream.errors import DataLossError

            raise DataLossError(f"{self.url_of(key)} was overwritten while being read")

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"{self.url_of(key)}: no such file") from None

    def get_range(self, key: str, start: int, length: int, *, etag: str | None = None) -> bytes:
        try:
            with self._path(key).open("rb") as f:
                f.seek(start)
                data = f.read(length)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"{self.url_of(key)}: no such file") from None
        self._check_etag(key, etag)
        return data

    def iter_chunks(self, key: str, *, etag: str | None = None) -> Iterator[bytes]:
        try:
            f = self._path(key).open("rb")
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"{self.url_of(key)}: no such file") from None
        with f:
            yield from iter(lambda: f.read(CHUNK_BYTES), b"")
        self._check_etag(key, etag)

    def _tmp(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._tmp(path)
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic rename

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._tmp(path)
        tmp.write_bytes(data)
        try:
            os.link(tmp, path)  # atomic, fails when the name exists: readers never see half a file
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        return True

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        if target.resolve() == Path(path).resolve():
            return
        tmp = self._tmp(target)
        with Path(path).open("rb") as src, tmp.open("wb") as dst:
            for chunk in iter(lambda: src.read(CHUNK_BYTES), b""):
                dst.write(chunk)
        tmp.replace(target)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())

    def children(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir())


def open_local_storage(url: str | os.PathLike[str]) -> LocalStorage:
    """The storage for a local directory. An `s3://` root is opened by the server side
    (`shardstream.server.roots.open_storage`): this package never imports S3 code."""
    text = os.fspath(url)
    if text.startswith("s3://"):
        raise InvalidArgumentError(
            f"{text}: s3:// roots are opened by shardstream.server.roots.open_registry "
            "(pip install 'shardstream[server]')"
        )
    if _SCHEME_RE.match(text) and not re.match(r"^[A-Za-z]:[\\/]", text):
        raise InvalidArgumentError(
            f"{text!r}: unsupported location; use a local directory path or s3://bucket/prefix"
        )
    return LocalStorage(text)
