"""A Flight handler thread keeps its Python thread state for the length of a Read stream.

pyarrow's `GeneratorStream` asks the generator for each message from one of gRPC's threads, which
have no Python thread state of their own: every message, `PyGILState_Ensure` made one and
`PyGILState_Release` freed it again — the thread state, the first chunk of its frame stack (an
`mmap` and a `munmap` of 16 KiB: two system calls a message, strace of a server), its
`threading` dummy thread. `HeldThreadState()` takes one more `PyGILState_Ensure` for the stream,
on its handler thread, and releases it when the stream ends: in between, Flight's own Release only
lets the GIL go. A stream that ends on another thread (its generator collected elsewhere) leaves
its count taken: that thread state lives until its thread ends (one 16 KiB chunk).
"""

from __future__ import annotations

import ctypes
import threading

__all__ = ["HeldThreadState"]

_api = ctypes.pythonapi
_api.PyGILState_Ensure.restype = ctypes.c_int
_api.PyGILState_Release.argtypes = [ctypes.c_int]
_api.PyGILState_Release.restype = None


class HeldThreadState:
    """This thread's Python thread state, kept (not made anew a message) until `release()` on it."""

    def __init__(self) -> None:
        self._ident: int | None = threading.get_ident()
        self._state = _api.PyGILState_Ensure()  # the GIL is held already: this counts, it does not wait

    def release(self) -> None:
        """Let it go, once, if this is its thread (else it lives until its thread ends)."""
        if self._ident == threading.get_ident():
            _api.PyGILState_Release(self._state)
        self._ident = None
