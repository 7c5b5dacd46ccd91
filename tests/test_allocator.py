"""allocator.tune(): applied once per process, unless the user's environment says otherwise."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = "from shardstream import allocator; print(allocator.tune(), allocator.tune())"


def _tune(env: dict[str, str]) -> str:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "SHARDSTREAM_MALLOC_TUNE"
    }
    out = subprocess.run(
        [sys.executable, "-c", CODE], env={**clean, **env}, capture_output=True, text=True, check=True
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
