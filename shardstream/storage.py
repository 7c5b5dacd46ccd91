"""Where datasets live: one small interface, a local directory and `s3://bucket/prefix` behind it.

Everything the registry and the server read or write goes through `Storage`, addressed by a *key*:
a relative, '/'-separated path under the storage's root. Keys are checked before any I/O
(`check_key`): no absolute paths, no '..' (also percent-encoded), no scheme, no backslash — so a
manifest or a command line can never make shardstream read outside its root.

    open_local_storage("/data/registry")    LocalStorage   (plain directory; O_EXCL creates)
    S3Storage("s3://bucket/prefix")         (shardstream.server.backends.s3, aiobotocore; needs
                                            `shardstream[server]`; shardstream.server.backends.roots opens
                                            either kind by URL)

All methods are blocking and thread-safe (the S3 backend runs its own event loop). Errors are
shardstream errors: a missing object is NotFoundError, an object changed since it was opened is
DataLossError, refused credentials (or a local file the process may not read) are
UnauthenticatedError/PermissionDeniedError, an unreachable store is UnavailableError. Messages name
objects by their full location (useful on the command line); a server strips its root from them
before a client sees one (`locations`, shardstream.server.policy.redact).

Durability: LocalStorage's writes return once the data and the directory entries leading to it are
on disk (the file is fsynced, then each directory from its own up to the root); `sync(keys)` does the
same for files written by other means (ingest's shards, files to register). Its fsync helpers are the
only ones in shardstream. On S3 a completed PUT is durable: `sync` has nothing to do.

(A little over 400 lines: the interface and its local backend stay in one module, so that the only
code that fsyncs sits beside the writes it makes durable.)
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from shardstream.errors import (
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
)

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
    modified_s: float = 0.0  # last write, seconds since the epoch (local: mtime; S3: LastModified)


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
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write `data` at `key`, replacing it atomically (readers see old or new, never a mix)."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Write only if `key` does not exist; False (nothing written) when it does. A full root is
        ResourceExhaustedError (and leaves nothing behind)."""

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

    def list_info(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        """(key, info) of every object under the directory `prefix`, sorted by key."""
        return [(key, self.head(key)) for key in self.list(prefix)]

    def is_link(self, key: str) -> bool:
        """Whether `key` (a file or a directory) is a symbolic link; object stores have none."""
        check_key(key)
        return False

    def sync(self, keys: Iterable[str]) -> None:
        """Make the objects `keys`, written by other means than this storage's own writes, durable
        (a local directory: fsync them and their directories). Object stores: nothing to do."""
        for key in keys:
            check_key(key)

    def remove_empty_dirs(self, prefix: str, *, min_age_s: float, dry_run: bool = False) -> list[str]:
        """Remove the directory `prefix` and those below it that are empty and unmodified for
        `min_age_s` (deepest first); their keys. Object stores have no directories: []."""
        check_key(prefix)
        return []

    def locations(self) -> tuple[str, ...]:
        """The strings naming this storage's root, longest first (kept out of client-facing errors)."""
        return (self.url,)

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
    """A local directory. Writes go through a private temp file (`.<name>.<32 hex>.tmp`; one a killed
    writer leaves is removed by `datasets gc`), fsynced before it is renamed or linked into place,
    then the directories up to the root are fsynced; creates are exclusive (link)."""

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

    def locations(self) -> tuple[str, ...]:
        forms = {self.url, str(self.root), os.path.abspath(self.root), str(self.root.resolve())}
        return tuple(sorted((f for f in forms if f not in ("", ".", "/")), key=len, reverse=True))

    def is_link(self, key: str) -> bool:
        check_key(key)
        return (self.root / key.rstrip("/")).is_symlink()

    def check_root(self) -> None:
        if not self.root.is_dir():
            raise InvalidArgumentError(f"--root {self.root}: no such directory")

    # --- durability: the one place shardstream fsyncs ----------------------------------------
    @staticmethod
    def fsync_file(path: Path) -> None:
        """Flush a file's data to disk (also one written by another process: its dirty pages)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def fsync_dir(path: Path) -> None:
        """Flush a directory's entries (files created, renamed or linked into it) to disk."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _sync_dirs(self, dirs: Iterable[Path]) -> None:
        """fsync each of `dirs` and every directory above it up to the root (included), once each:
        the entries `mkdir(parents=True)` made on the way reach the disk too."""
        done: set[Path] = set()
        for d in sorted(set(dirs), key=lambda p: len(p.parts), reverse=True):
            while d not in done:
                self.fsync_dir(d)
                done.add(d)
                if d == self.root or self.root not in d.parents:
                    break
                d = d.parent

    def sync(self, keys: Iterable[str]) -> None:
        dirs = []
        for key in keys:
            path = self._path(key)
            if path.is_dir():
                dirs.append(path)
            elif path.exists():  # a missing one has nothing to flush (a reader reports it missing)
                self.fsync_file(path)
                dirs.append(path.parent)
        self._sync_dirs(dirs)

    # --- reads ---------------------------------------------------------------------------------
    def _missing(self, key: str) -> NotFoundError:
        return NotFoundError(f"{self.url_of(key)}: no such file")

    def _denied(self, key: str) -> PermissionDeniedError:
        return PermissionDeniedError(f"{self.url_of(key)}: permission denied (file mode or owner)")

    @staticmethod
    def _info(st: os.stat_result) -> ObjectInfo:
        return ObjectInfo(st.st_size, f"{st.st_mtime_ns:x}-{st.st_size:x}-{st.st_ino:x}", st.st_mtime)

    def head(self, key: str) -> ObjectInfo:
        try:
            return self._info(self._path(key).stat())
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(key) from None
        except PermissionError as exc:
            raise self._denied(key) from exc

    def _check_etag(self, key: str, etag: str | None) -> None:
        if etag is not None and self.head(key).etag != etag:
            raise DataLossError(f"{self.url_of(key)} was overwritten while being read")

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(key) from None
        except PermissionError as exc:
            raise self._denied(key) from exc

    def get_range(self, key: str, start: int, length: int, *, etag: str | None = None) -> bytes:
        try:
            with self._path(key).open("rb") as f:
                f.seek(start)
                data = f.read(length)
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(key) from None
        except PermissionError as exc:
            raise self._denied(key) from exc
        self._check_etag(key, etag)
        return data

    def iter_chunks(self, key: str, *, etag: str | None = None) -> Iterator[bytes]:
        try:
            f = self._path(key).open("rb")
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(key) from None
        except PermissionError as exc:
            raise self._denied(key) from exc
        with f:
            yield from iter(lambda: f.read(CHUNK_BYTES), b"")
        self._check_etag(key, etag)

    # --- writes --------------------------------------------------------------------------------
    def _tmp(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"

    def _write_tmp(self, path: Path, data: bytes | memoryview) -> Path:
        """`data` in a temporary file beside `path`, durable. A write that fails leaves nothing behind,
        and a full disk (or quota) is ResourceExhaustedError naming the root, not an OSError."""
        tmp = self._tmp(path)
        try:
            with tmp.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ResourceExhaustedError(
                    f"{self.url}: no space left ({os.strerror(exc.errno)}): free space or remove old data there"
                ) from exc
            raise
        return tmp

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        self._write_tmp(path, data).replace(path)  # atomic rename
        self._sync_dirs([path.parent])

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        path = self._path(key)
        tmp = self._write_tmp(path, data)
        try:
            os.link(tmp, path)  # atomic, fails when the name exists: readers never see half a file
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        self._sync_dirs([path.parent])
        return True

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        if target.resolve() == Path(path).resolve():
            self.sync([key])
            return
        tmp = self._tmp(target)
        with Path(path).open("rb") as src, tmp.open("wb") as dst:
            for chunk in iter(lambda: src.read(CHUNK_BYTES), b""):
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        tmp.replace(target)
        self._sync_dirs([target.parent])

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    # --- listing -------------------------------------------------------------------------------
    def _walk(self, prefix: str) -> Iterator[Path]:
        """Every file under the directory `prefix`, symlinked directories not entered; a directory
        that cannot be read is PermissionDeniedError, never silently skipped."""
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir():
            return

        def refuse(exc: OSError) -> None:
            if isinstance(exc, PermissionError):
                try:
                    where = Path(exc.filename).relative_to(self.root).as_posix()
                except (TypeError, ValueError):
                    where = prefix.strip("/") or "."
                raise self._denied(where) from exc

        for dirpath, _, files in os.walk(base, onerror=refuse):
            yield from (p for p in (Path(dirpath) / f for f in files) if p.is_file())

    def list(self, prefix: str) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self._walk(prefix))

    def list_info(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        out = []
        for p in self._walk(prefix):
            try:
                out.append((p.relative_to(self.root).as_posix(), self._info(p.stat())))
            except FileNotFoundError:  # removed since it was listed
                continue
        return sorted(out)

    def children(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir())

    def remove_empty_dirs(self, prefix: str, *, min_age_s: float, dry_run: bool = False) -> list[str]:
        base = self._path(prefix.rstrip("/"))
        if base.is_symlink() or not base.is_dir():
            return []
        now, removed = time.time(), []
        for dirpath, dirnames, filenames in os.walk(base, topdown=False):
            d = Path(dirpath)
            if filenames or any((d / n).exists() for n in dirnames):
                continue
            try:
                if now - d.stat().st_mtime < min_age_s:
                    continue
            except FileNotFoundError:
                continue
            if not dry_run:
                try:
                    d.rmdir()
                except OSError:  # written into meanwhile: not empty any more
                    continue
            removed.append(d.relative_to(self.root).as_posix())
        if removed and not dry_run:
            self._sync_dirs([base if base.exists() else base.parent])
        return sorted(removed)


def open_local_storage(url: str | os.PathLike[str]) -> LocalStorage:
    """The storage for a local directory. An `s3://` root is opened by the server side
    (`shardstream.server.backends.roots.open_storage`): this package never imports S3 code."""
    text = os.fspath(url)
    if text.startswith("s3://"):
        raise InvalidArgumentError(
            f"{text}: s3:// roots are opened by shardstream.server.backends.roots.open_registry "
            "(pip install 'shardstream[server]')"
        )
    if _SCHEME_RE.match(text) and not re.match(r"^[A-Za-z]:[\\/]", text):
        raise InvalidArgumentError(
            f"{text!r}: unsupported location; use a local directory path or s3://bucket/prefix"
        )
    return LocalStorage(text)
