"""The real S3 server of the tests: SeaweedFS, started by loadtest/seaweed.py (the one launcher,
shared with the benchmarks; see its docstring for why it lives there), and private roots on it."""

from __future__ import annotations

import uuid

from loadtest.seaweed import ACCESS_KEY, BUCKET, SECRET_KEY, S3Server, start_seaweed, weed_binary

__all__ = ["ACCESS_KEY", "BUCKET", "SECRET_KEY", "S3Server", "private_root", "start_seaweed", "weed_binary"]


def private_root() -> str:
    """An empty registry root of its own in the test bucket."""
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}"
