"""The digest of what deploy/Dockerfile copies into the image (deploy/Dockerfile.dockerignore's list):
names and bytes of every file under them, but bytecode and built extensions. Stdlib only.

deploy/image/build.sh passes it as SOURCES_DIGEST: podman 4.3 (buildah 1.28) keys the final stage's
install step on the step's text alone, not on the wheels it mounts, and would keep an image's old
shardstream after the sources changed; the step names the digest, so it runs again when they do. The
image carries it as the label io.shardstream.sources (tests/test_image.py compares).

    python3 deploy/image/sources_digest.py        # from the repository root: prints the hex digest
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

COPIED = ("pyproject.toml", "README.md", "shardstream", "client", "server")  # as the Dockerfile's COPY lines
SKIPPED_SUFFIXES = (".pyc", ".so")  # the ignore file's **/*.pyc, **/*.so


def sources_digest(root: Path) -> str:
    h = hashlib.sha256()
    for top in COPIED:
        base = root / top
        paths = [base] if base.is_file() else sorted(_files(base))
        for path in paths:
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _files(base: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]  # the ignore file's **/__pycache__
        found += [Path(dirpath) / f for f in filenames if not f.endswith(SKIPPED_SUFFIXES)]
    return found


if __name__ == "__main__":
    print(sources_digest(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()))
