"""A local-disk tier under the in-memory row-group cache, shared by the workers of a server.

`serve --cache-dir DIR` keeps every row group a worker reads from storage as an Arrow IPC file in DIR,
named by what makes it immutable — the shard's content hash (sha256, from the manifest), the row group,
the columns read and whether storage's bytes were checked against row-group checksums when read — so
any worker of the server (or a later run, or another server on the same disk) can use it, whatever
dataset version or name points at that shard. A memory miss looks here before storage; the file is
memory-mapped, so a hit costs no decode and no copy.

- Every file carries a checksum and its key, checked on every open (DESIGN §3): the Arrow IPC
  file's bytes are followed by a 32-byte trailer (`SSCB`, the crc32 of those bytes, their length,
  and the blake2b-128 of the file's name — its key: shard hash, row group, columns, checked or not;
  or a feature file's name). A file that fails it — a torn write, a flipped bit on the disk, a file
  changed by hand, two files swapped or one renamed (valid bytes, another key's: row group 1 must
  never be served as row group 0) — is deleted, counted in `shardstream_disk_cache_corrupt_total`
  and read again from storage (where it is checked in turn); it is never served. The check reads
  the whole file (crc32: ~4 GB/s on one core), which a hit then serves anyway. Files of the formats
  before this one are deleted, not counted as corrupt: `*.arrow` (no trailer) at start, and files
  with the 16-byte trailer that named no key (`SSCK`) when first opened.

- Writes are atomic: a temporary file in DIR, then `os.replace`; a reader sees a whole file or none.
- Misses coalesce across processes: a process that misses takes an exclusive `flock` on one of
  LOCK_STRIPES lock files (chosen by the row group's file name), looks again, and only then reads
  storage and writes the file; the others wait on the lock and find the file. So the workers of a
  server — and several servers sharing the directory on one host — read each row group from storage
  once. (Threads of one process are already coalesced by the in-memory cache.)
- A file that does not hold the rows the manifest says is deleted and read again from storage.
- Bounded by bytes: when the tier grows past its capacity, the least recently used files (by mtime,
  touched on every hit) are deleted down to 90%. `shardstream_disk_cache_bytes` is this process's
  count of the bytes on disk: a file deleted (evicted, corrupt, replaced) is taken off as one written
  is added, so rewriting corrupt files does not grow it. Workers delete concurrently; a file deleted while
  mapped stays readable until unmapped.
- Other kinds of file share the tier, its checksums, locks and bound (`get_or_make`): the feature
  cache's shared transform outputs (server/read/feature_cache.py) are files here too. Their hits and
  writes count in their own module's metrics; errors, corrupt files and evictions count here.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
from prometheus_client import Counter, Gauge

from shardstream.errors import InvalidArgumentError

__all__ = ["DEFAULT_SPILL_BYTES", "TRAILER_BYTES", "SpillTier"]

log = logging.getLogger(__name__)

DEFAULT_SPILL_BYTES = 8 << 30
SUFFIX = ".arrowc"  # an Arrow IPC file and its checksum trailer
LEGACY_SUFFIX = ".arrow"  # files written before the trailer existed: unchecked, deleted at start
# magic, crc32 of the Arrow bytes before it, their length, blake2b-128 of the file's name (its key)
_TRAILER = struct.Struct("<4sIQ16s")
TRAILER_BYTES = _TRAILER.size  # what follows a file's Arrow IPC bytes
_MAGIC = b"SSCB"
_OLD_TRAILER = struct.Struct("<4sIQ")  # the format before keys: magic, crc32, length
_OLD_MAGIC = b"SSCK"
STALE_TMP_S = 3600.0  # temporary files older than this are leftovers of a crash
LOCK_STRIPES = 1024  # lock files (fixed, so none accumulate); unrelated row groups rarely share one

SPILL_HITS = Counter("shardstream_disk_cache_hits_total", "Row groups read from the local-disk cache")
SPILL_WRITES = Counter("shardstream_disk_cache_writes_total", "Row groups written to the local-disk cache")
SPILL_EVICTIONS = Counter("shardstream_disk_cache_evictions_total", "Files deleted from the local-disk cache")
SPILL_ERRORS = Counter(
    "shardstream_disk_cache_errors_total", "Local-disk cache files unreadable, wrong or unwritable"
)
SPILL_CORRUPT = Counter(
    "shardstream_disk_cache_corrupt_total",
    "Local-disk cache files that failed their checksum (or were cut short) on open: deleted, read again "
    "from storage, never served (also counted in _errors_total; opens that passed: _hits_total)",
)
SPILL_BYTES = Gauge(
    "shardstream_disk_cache_bytes",
    "Bytes in the local-disk cache (shared by workers)",
    multiprocess_mode="max",
)


class SpillTier:
    def __init__(self, directory: str | os.PathLike[str], capacity_bytes: int = DEFAULT_SPILL_BYTES) -> None:
        self.dir = Path(directory)
        self.capacity_bytes = capacity_bytes
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".probe.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise InvalidArgumentError(f"cannot use --cache-dir {self.dir}: {exc.strerror or exc}") from exc
        self._lock = threading.Lock()
        self._bytes = self._scan(clean=True)

    def _path(self, sha256: str, group: int, columns: Sequence[str], checked: bool = True) -> Path:
        cols = hashlib.sha256("\0".join(columns).encode()).hexdigest()[:16]
        return self.dir / f"{sha256}-{group}-{cols}{'' if checked else '-u'}{SUFFIX}"

    def load(
        self, sha256: str, group: int, columns: Sequence[str], rows: int, *, checked: bool = True
    ) -> pa.Table | None:
        """The row group if a whole file whose checksum matches holds it, else None."""
        path = self._path(sha256, group, columns, checked)
        return self._load(path, lambda t: t.num_rows == rows and t.column_names == list(columns))

    def _load(self, path: Path, valid: Callable[[pa.Table], bool], *, count: bool = True) -> pa.Table | None:
        """The table of `path` if its checksum matches and `valid` accepts it, else None (a bad
        file is deleted)."""
        try:
            buf = pa.memory_map(str(path)).read_buffer()
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException) as exc:
            log.warning("disk cache file %s unreadable (%s): deleted", path.name, exc)
            return self._drop(path, corrupt=True)
        body, problem = _checked_body(buf, path.name)
        if body is None:
            if problem == _LEGACY:
                log.info("disk cache file %s is of the format before keys: deleted", path.name)
                return self._drop(path, error=False)
            log.warning("disk cache file %s %s: deleted, read again from storage", path.name, problem)
            return self._drop(path, corrupt=True)
        try:
            table = pa.ipc.open_file(body).read_all()
        except (OSError, pa.ArrowException) as exc:
            log.warning("disk cache file %s unreadable (%s): deleted", path.name, exc)
            return self._drop(path, corrupt=True)
        if not valid(table):
            log.warning("disk cache file %s holds other rows or columns: deleted", path.name)
            return self._drop(path)
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        if count:  # row groups; other files count in their own module's metrics
            SPILL_HITS.inc()
        return table

    def get_or_read(
        self,
        sha256: str,
        group: int,
        columns: Sequence[str],
        rows: int,
        read: Callable[[], pa.Table],
        *,
        checked: bool = True,
    ) -> pa.Table:
        """The row group from its file, or from `read()` (then stored) by exactly one process at a time.

        `checked`: whether `read()` checks storage's bytes against row-group checksums; files of
        checked and unchecked reads are kept apart.
        """
        path = self._path(sha256, group, columns, checked)
        table = self._get_or_make(
            path, read, lambda t: t.num_rows == rows and t.column_names == list(columns)
        )
        assert table is not None  # read() always gives a table
        return table

    def get_or_make(
        self, name: str, make: Callable[[], pa.Table | None], valid: Callable[[pa.Table], bool]
    ) -> pa.Table | None:
        """Another kind of file in the same tier (server/read/feature_cache.py): the table of file `name`
        (a fixed-length name that says what made it, e.g. a hash of its inputs) when its checksum
        matches and `valid` accepts it, else `make()`'s, then stored — made by one process at a time,
        as row groups are read. A `make()` that answers None stores nothing (None is returned).

        `make` runs holding one of the tier's locks: it must take none itself (read the row groups
        it needs before calling this), or two files sharing a lock stripe would wait on each other."""
        return self._get_or_make(self._named(name), make, valid, count=False)

    def load_file(self, name: str, valid: Callable[[pa.Table], bool]) -> pa.Table | None:
        """The table of file `name` (see get_or_make) if it is there, sound and `valid`; no lock."""
        return self._load(self._named(name), valid, count=False)

    def _named(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"not a disk cache file name: {name!r}")
        return self.dir / f"{name}{SUFFIX}"

    def _get_or_make(
        self,
        path: Path,
        make: Callable[[], pa.Table | None],
        valid: Callable[[pa.Table], bool],
        *,
        count: bool = True,
    ) -> pa.Table | None:
        held = self._load(path, valid, count=count)
        if held is not None:
            return held
        stripe = int(hashlib.blake2b(path.name.encode(), digest_size=4).hexdigest(), 16) % LOCK_STRIPES
        try:
            lock = open(self.dir / f".lock-{stripe:04d}", "a+b")  # noqa: SIM115 — held across the read
        except OSError as exc:  # no lock, no coalescing: still correct
            log.warning("disk cache lock unavailable (%s): reading without it", exc)
            lock = None
        with lock or contextlib.nullcontext():
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                # another process may have read it meanwhile
                held = self._load(path, valid, count=count)
                if held is not None:
                    return held
            table = make()
            if table is not None:
                self._store(path, table, count=count)
            return table

    def store(
        self, sha256: str, group: int, columns: Sequence[str], table: pa.Table, *, checked: bool = True
    ) -> None:
        self._store(self._path(sha256, group, columns, checked), table)

    def _store(self, path: Path, table: pa.Table, *, count: bool = True) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            # Written straight to the file (no buffer of its size to allocate and copy: half the
            # CPU of a cold write, measured on 6 MB row groups), then checksummed from the page
            # cache before the file is renamed into place.
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            mapped = pa.memory_map(str(tmp))
            try:
                body = mapped.read_buffer()
                trailer = _TRAILER.pack(_MAGIC, zlib.crc32(memoryview(body)), body.size, _key_digest(path.name))
                del body
            finally:
                mapped.close()
            with open(tmp, "ab") as f:
                f.write(trailer)
            size = tmp.stat().st_size
            replaced = _size(path)  # a file store() writes over (no lock) no longer counts
            os.replace(tmp, path)
        except (OSError, pa.ArrowException) as exc:  # a full disk costs the tier, never the stream
            SPILL_ERRORS.inc()
            log.warning("disk cache write of %s failed: %s", path.name, exc)
            tmp.unlink(missing_ok=True)
            return
        if count:
            SPILL_WRITES.inc()
        with self._lock:
            self._bytes += size - replaced
            over = self._bytes > self.capacity_bytes
        if over:
            self._evict()
        SPILL_BYTES.set(self._bytes)

    def _drop(self, path: Path, *, corrupt: bool = False, error: bool = True) -> None:
        """Delete a file that must not be served, taking its bytes off the tier's count."""
        if error:
            SPILL_ERRORS.inc()
        if corrupt:
            SPILL_CORRUPT.inc()
        size = _size(path)
        try:
            path.unlink()
        except FileNotFoundError:
            return None  # another worker deleted it (and counts it)
        with self._lock:
            self._bytes = max(0, self._bytes - size)
        SPILL_BYTES.set(self._bytes)
        return None

    def _scan(self, clean: bool = False) -> int:
        total = 0
        now = time.time()
        for entry in os.scandir(self.dir):
            try:
                st = entry.stat()
                if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                    total += st.st_size
                elif clean and entry.name.endswith(".tmp") and now - st.st_mtime > STALE_TMP_S:
                    os.unlink(entry.path)
                elif clean and entry.name.endswith(LEGACY_SUFFIX) and not entry.name.startswith("."):
                    os.unlink(entry.path)  # written before checksums: can never be checked
            except FileNotFoundError:
                pass
        SPILL_BYTES.set(total)
        return total

    def _evict(self) -> None:
        """Delete the least recently used files down to 90% of capacity (all workers' files count)."""
        with self._lock:
            files = []
            for entry in os.scandir(self.dir):
                if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                    try:
                        st = entry.stat()
                    except FileNotFoundError:
                        continue
                    files.append((st.st_mtime, st.st_size, entry.path))
            total = sum(size for _, size, _ in files)
            target = int(self.capacity_bytes * 0.9)
            for _, size, path in sorted(files):
                if total <= target:
                    break
                try:
                    os.unlink(path)
                    SPILL_EVICTIONS.inc()
                except FileNotFoundError:
                    pass  # another worker deleted it
                total -= size
            self._bytes = total


_LEGACY = "is of the format before keys"


def _key_digest(name: str) -> bytes:
    return hashlib.blake2b(name.encode(), digest_size=16).digest()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _checked_body(buf: pa.Buffer, name: str) -> tuple[pa.Buffer | None, str]:
    """The Arrow bytes of cache file `name` when its trailer matches them and names that file, else
    None and what is wrong (never trusted then)."""
    if buf.size >= _OLD_TRAILER.size:
        magic, _, length = _OLD_TRAILER.unpack(memoryview(buf)[buf.size - _OLD_TRAILER.size :])
        if magic == _OLD_MAGIC and length == buf.size - _OLD_TRAILER.size:
            return None, _LEGACY
    if buf.size < _TRAILER.size:
        return None, "is cut short"
    magic, crc, length, key = _TRAILER.unpack(memoryview(buf)[buf.size - _TRAILER.size :])
    if magic != _MAGIC or length != buf.size - _TRAILER.size:
        return None, "fails its checksum (no whole trailer)"
    body = buf.slice(0, length)
    if zlib.crc32(memoryview(body)) != crc:
        return None, "fails its checksum"
    if key != _key_digest(name):
        return None, "holds another key's data (swapped or renamed)"
    return body, ""
