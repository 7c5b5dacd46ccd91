"""MkDocs hook (mkdocs.yml `hooks:`): the source tree mkdocstrings reads the API reference from.

pyproject.toml maps `shardstream.client` to client/ and `shardstream.server` to server/ (package-dir), so
the import tree is not a folder tree, and griffe reads folders. This keeps it, at each build, under
build/docs-src/shardstream/: a symlink to every entry of shardstream/, plus client -> client/ and
server -> server/. The reference is read from the sources, never by importing them (importing every
module of the package would run its `__main__`).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREE = REPO / "build" / "docs-src"
SUBPACKAGES = {"client": REPO / "client", "server": REPO / "server"}  # pyproject.toml's package-dir


def build_tree() -> Path:
    """Make TREE/shardstream the import tree (idempotent: a concurrent build sees a whole tree)."""
    pkg = TREE / "shardstream"
    pkg.mkdir(parents=True, exist_ok=True)
    want = {
        e.name: e for e in (REPO / "shardstream").iterdir() if e.name not in {*SUBPACKAGES, "__pycache__"}
    }
    want.update(SUBPACKAGES)
    for link in pkg.iterdir():
        if link.name not in want or not link.is_symlink() or link.readlink() != want[link.name]:
            link.unlink()
    for name, target in want.items():
        if not (pkg / name).is_symlink():
            (pkg / name).symlink_to(target, target_is_directory=target.is_dir())
    return TREE


def on_startup(command: str, dirty: bool) -> None:  # noqa: ARG001 (MkDocs' hook signature)
    build_tree()
