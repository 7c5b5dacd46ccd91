"""The dataset registry on a local directory (DESIGN §3).

Layout, beside the data:

    <root>/<name>/manifests/<version>.json   immutable, created only if absent (O_EXCL)
    <root>/<name>/tags/<tag>                 the version number a tag points at
    <root>/<name>/data/...                   shards, referenced by relative URI from manifests

A version is never rewritten. Two writers racing for the same name both succeed, with distinct
versions: each tries `latest + 1` with an exclusive create and moves on to the next on conflict.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from shardstream.errors import InvalidArgumentError, NotFoundError
from shardstream.manifest import DatasetRef, Manifest, validate_name

__all__ = ["Registry"]

_MAX_CREATE_ATTEMPTS = 1000


class Registry:
    """Dataset versions under one root directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        text = os.fspath(root)
        if "://" in text:
            raise InvalidArgumentError(
                f"--root {text!r}: only local directories are supported in this version"
            )
        self.root = Path(text)

    def __repr__(self) -> str:
        return f"Registry({str(self.root)!r})"

    # --- paths ---------------------------------------------------------------------------------
    def dataset_dir(self, name: str) -> Path:
        return self.root / validate_name(name)

    def shard_path(self, manifest: Manifest, uri: str) -> Path:
        return self.dataset_dir(manifest.name) / uri

    def _manifest_path(self, name: str, version: int) -> Path:
        return self.dataset_dir(name) / "manifests" / f"{version}.json"

    # --- reads ---------------------------------------------------------------------------------
    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if (p / "manifests").is_dir() and self.versions(p.name)
        )

    def versions(self, name: str) -> list[int]:
        d = self.dataset_dir(name) / "manifests"
        if not d.is_dir():
            return []
        return sorted(int(p.stem) for p in d.glob("*.json") if p.stem.isdigit())

    def latest(self, name: str) -> int | None:
        vs = self.versions(name)
        return vs[-1] if vs else None

    def resolve(self, ref: str | DatasetRef) -> Manifest:
        """The manifest for `name`, `name@N` or `name@tag`; NotFoundError naming what is missing."""
        r = DatasetRef.parse(ref) if isinstance(ref, str) else ref
        version = r.version
        if r.tag is not None:
            tag_file = self.dataset_dir(r.name) / "tags" / r.tag
            try:
                version = int(tag_file.read_text().strip())
            except FileNotFoundError:
                raise NotFoundError(f"dataset {r.name!r} has no tag {r.tag!r} under {self.root}") from None
        if version is None:
            version = self.latest(r.name)
            if version is None:
                raise NotFoundError(f"no dataset named {r.name!r} under {self.root}")
        path = self._manifest_path(r.name, version)
        try:
            text = path.read_text()
        except FileNotFoundError:
            known = self.versions(r.name)
            if not known:
                raise NotFoundError(f"no dataset named {r.name!r} under {self.root}") from None
            raise NotFoundError(
                f"dataset {r.name!r} has no version {version} (versions: {', '.join(map(str, known))})"
            ) from None
        return Manifest.loads(text, source=str(path))

    # --- writes --------------------------------------------------------------------------------
    def create_version(self, name: str, build: Callable[[int, int | None], Manifest]) -> Manifest:
        """Write a new version of `name`; `build(version, parent)` makes its manifest.

        The version number is taken by an exclusive create (atomic link), so concurrent writers never overwrite
        each other: the loser rebuilds its manifest for the next free number.
        """
        mdir = self.dataset_dir(name) / "manifests"
        mdir.mkdir(parents=True, exist_ok=True)
        for _ in range(_MAX_CREATE_ATTEMPTS):
            parent = self.latest(name)
            version = (parent or 0) + 1
            manifest = build(version, parent)
            if manifest.name != name or manifest.version != version:
                raise AssertionError("build() must return a manifest for the version it was given")
            path = self._manifest_path(name, version)
            # Write a private temp file, then hard-link it into place: link() is atomic and fails
            # when the name exists, so readers never see a half-written manifest.
            tmp = mdir / f".{version}.{os.getpid()}.{id(manifest)}.tmp"
            tmp.write_bytes(manifest.dumps().encode())
            try:
                os.link(tmp, path)
            except FileExistsError:
                continue
            finally:
                tmp.unlink()
            return manifest
        raise RuntimeError(f"could not allocate a version of {name!r} after {_MAX_CREATE_ATTEMPTS} attempts")
