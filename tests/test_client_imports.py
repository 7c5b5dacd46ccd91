"""DESIGN §2: the client never imports the server, so a GPU host pulls none of its dependencies."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from shardstream.client import Loader
from shardstream.client.torch_dataset import ShardStreamDataset
ld = Loader(["127.0.0.1:1"], "images", batch_size=4, output="torch",
            transforms=[{"op": "image.decode", "size": [8, 8]}], on_error="skip")
ld.close()
# (grpc itself imports grpc_health/grpc_reflection when they are installed: not counted)
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("PIL", "av", "tiktoken", "aiobotocore", "botocore",
             "uvloop") or m.startswith("shardstream.server"))
print(",".join(bad))
"""


def test_the_client_imports_no_server_code_or_decoders() -> None:
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"the client imported: {r.stdout.strip()}"
