"""allocator.tune(): applied once per process, unless the user's environment says otherwise."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

CODE = "from shardstream import allocator; print(allocator.tune(), allocator.tune())"


def _clean_env() -> dict[str, str]:
    """This environment without the allocator settings a user could have set."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MALLOC_") and k not in ("SHARDSTREAM_MALLOC_TUNE", "JE_ARROW_MALLOC_CONF")
    }


def _tune(env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", CODE], env={**_clean_env(), **env}, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_applied_by_default_on_glibc() -> None:
    assert _tune({}) == "True True"


@pytest.mark.parametrize(
    "env",
    [
        {"SHARDSTREAM_MALLOC_TUNE": "0"},
        {"MALLOC_TRIM_THRESHOLD_": "1000000"},
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
    ],
)
def test_the_users_settings_win(env: dict[str, str]) -> None:
    assert _tune(env) == "False False"


# --- Arrow's jemalloc on transparent huge pages (allocator.arrow_huge_pages) ---------------------
def _default_conf(cpus: int) -> str:
    return f"thp:always,narenas:{cpus}"


@pytest.mark.parametrize(
    ("env", "expect", "asks"),
    [
        ({}, _default_conf(3), True),
        ({"JE_ARROW_MALLOC_CONF": "thp:default"}, "thp:default", False),  # the user's value wins
        ({"JE_ARROW_MALLOC_CONF": "narenas:2"}, "narenas:2", False),
        ({"JE_ARROW_MALLOC_CONF": "narenas:4,thp:always"}, "narenas:4,thp:always", True),
        ({"SHARDSTREAM_MALLOC_TUNE": "0"}, None, False),
    ],
)
def test_arrow_huge_pages_in_an_environment(env: dict[str, str], expect: str | None, asks: bool) -> None:
    from shardstream import allocator

    environ = dict(env)
    assert allocator.arrow_huge_pages(environ, 3) is asks
    assert environ.get("JE_ARROW_MALLOC_CONF") == expect


# One process: the setting (or not) before pyarrow loads, then 64 MiB from Arrow's jemalloc, touched.
# Prints the bytes of its mappings that carry the kernel's huge-page advice (VmFlags `hg`): that
# jemalloc advised them is what the setting controls; whether the kernel backs them is its own choice.
HUGE_CODE = """
import os, sys
from shardstream import allocator
if sys.argv[1] == "set":
    allocator.arrow_huge_pages(os.environ, 2)
import pyarrow as pa
pa.set_memory_pool(pa.jemalloc_memory_pool())
buf = pa.allocate_buffer(64 << 20)
memoryview(buf).cast("B")[::4096] = bytes(len(range(0, 64 << 20, 4096)))
advised = size = 0
for line in open("/proc/self/smaps"):
    if line.startswith("Size:"):
        size = int(line.split()[1]) << 10
    elif line.startswith("VmFlags:") and "hg" in line.split()[1:]:
        advised += size
print(advised)
"""


def _advised_bytes(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", HUGE_CODE, mode], env=_clean_env(), capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_arrow_jemalloc_advises_huge_pages_when_set_before_pyarrow_loads() -> None:
    import pyarrow as pa

    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow is built without jemalloc")
    assert _advised_bytes("set") >= 64 << 20
    assert _advised_bytes("unset") < 64 << 20


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads Linux's /proc/PID/environ")
@pytest.mark.parametrize(("env", "expect"), [({}, None), ({"JE_ARROW_MALLOC_CONF": "thp:never"}, "thp:never")])
def test_a_served_worker_starts_with_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expect: str | None
) -> None:
    """`shardstream serve` sets it before pyarrow loads; its workers inherit it; the user's value wins.
    (/proc/PID/environ shows what a process was started with: the workers', not the supervisor's own
    setting.)"""
    from shardstream.server.local_fleet import LocalServer
    from shardstream.server.serving.cpus import usable_cpus

    expect = expect or _default_conf(usable_cpus())  # one arena per CPU the server may use
    monkeypatch.delenv("JE_ARROW_MALLOC_CONF", raising=False)
    monkeypatch.delenv("SHARDSTREAM_MALLOC_TUNE", raising=False)
    with LocalServer(str(tmp_path), workers=2, env=env) as server:
        assert len(server.worker_pids) == 2 and server.pid not in server.worker_pids
        assert [_environ(pid).get("JE_ARROW_MALLOC_CONF") for pid in server.worker_pids] == [expect] * 2
