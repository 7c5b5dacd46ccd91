"""server/serving/thread_state.py: a Flight handler thread's Python thread state, held for a stream.

What it saves (a thread state made and freed a message by pyarrow's GeneratorStream on gRPC's
threads) shows in a server's system calls, not here; this checks that holding one is safe: let go
once, and only on the thread that took it. (A second release, or one on another thread, would drop
this thread's own count to 0 and free the thread state it runs on: the tests would crash.)"""

from __future__ import annotations

import ctypes
import threading

from shardstream.server.serving.thread_state import HeldThreadState

_api = ctypes.pythonapi
_api.PyGILState_GetThisThreadState.restype = ctypes.c_void_p


def test_a_held_state_is_let_go_once_on_its_own_thread() -> None:
    state = _api.PyGILState_GetThisThreadState()
    held = HeldThreadState()
    assert _api.PyGILState_GetThisThreadState() == state  # the same thread state, one more count
    held.release()
    held.release()  # once only
    assert _api.PyGILState_GetThisThreadState() == state


def test_a_release_on_another_thread_is_left_alone() -> None:
    taken: list[HeldThreadState] = []
    t = threading.Thread(target=lambda: taken.append(HeldThreadState()))
    t.start()
    t.join()
    taken[0].release()  # not this thread's: no count of this thread is dropped
    held = HeldThreadState()  # and this thread's own still work
    held.release()
