"""FAULT INJECTOR (not a mock), for machines where a test cannot mount a small tmpfs: a full disk.

Put on a real server's PYTHONPATH with SHARDSTREAM_TEST_DISK_BYTES=N and
SHARDSTREAM_TEST_DISK_ROOT=DIR, it makes files under DIR behave as on a filesystem of N bytes that
reports a full disk when a write is made durable (as ext4 with delayed allocation does): an
`os.fsync` of a file under DIR fails with ENOSPC while DIR holds more than N bytes. Removed files
free their bytes (DIR is measured at each fsync). tests/test_checkpoint_limits.py mounts a real
tmpfs instead wherever it can.
"""

from __future__ import annotations

import errno
import os

_BYTES = os.environ.get("SHARDSTREAM_TEST_DISK_BYTES")
_ROOT = os.environ.get("SHARDSTREAM_TEST_DISK_ROOT")

if _BYTES and _ROOT:
    _fsync = os.fsync
    _root = os.path.realpath(_ROOT)

    def _used() -> int:
        total = 0
        for dirpath, _, files in os.walk(_root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    pass
        return total

    def _full_fsync(fd: int) -> None:
        _fsync(fd)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if path.startswith(_root + os.sep) and os.path.isfile(path) and _used() > int(_BYTES):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    os.fsync = _full_fsync
