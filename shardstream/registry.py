"""The dataset registry, beside the data, on any `Storage` (DESIGN §3).

Layout under the root (a local directory or `s3://bucket/prefix`):

    <name>/manifests/<version>.json   immutable, created only if absent (local: exclusive link;
                                      S3: conditional put `If-None-Match: *`)
    <name>/tags/<tag>                 the version number a tag points at (replaced atomically)
    <name>/data/...                   shards, referenced by relative URI from manifests

A version is never rewritten. Two writers racing for the same name both succeed, with distinct
versions: each tries `latest + 1` with an exclusive create and moves on to the next on conflict.
Before writing, the new version's change (claimed, or inferred when not) is checked against its
parent (`lineage.check_change`): a false claim writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from shardstream.errors import InvalidArgumentError, NotFoundError
from shardstream.lineage import CLAIMS, check_change, infer_change, renamed_fields
from shardstream.manifest import DatasetRef, Manifest, validate_name
from shardstream.storage import ObjectRef, Storage, check_key, open_local_storage

__all__ = ["Registry"]

_MAX_CREATE_ATTEMPTS = 1000


def validate_tag(tag: str) -> str:
    validate_name(tag, "tag")
    if tag.isdigit():
        raise InvalidArgumentError(f"tag {tag!r} is a number: NAME@{tag} would mean version {tag}")
    return tag


class Registry:
    """Dataset versions under one root: a Storage, or a local directory path.

    An `s3://bucket/prefix` root is opened by `shardstream.server.roots.open_registry` (S3 code lives
    on the server side)."""

    def __init__(self, root: str | os.PathLike[str] | Storage) -> None:
        self.storage = root if isinstance(root, Storage) else open_local_storage(root)
        self.root = self.storage.url

    def __repr__(self) -> str:
        return f"Registry({self.root!r})"

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.storage.close()

    # --- keys ----------------------------------------------------------------------------------
    @staticmethod
    def shard_key(manifest: Manifest, uri: str) -> str:
        return f"{validate_name(manifest.name)}/{check_key(uri, 'shard uri')}"

    def shard_path(self, manifest: Manifest, uri: str) -> Path | ObjectRef:
        """Where a shard lives: a local file path, or an object of a remote storage."""
        key = self.shard_key(manifest, uri)
        local = self.storage.local_path(key)
        return local if local is not None else ObjectRef(self.storage, key)

    @staticmethod
    def _manifest_key(name: str, version: int) -> str:
        return f"{validate_name(name)}/manifests/{version}.json"

    @staticmethod
    def _tag_key(name: str, tag: str) -> str:
        return f"{validate_name(name)}/tags/{validate_tag(tag)}"

    # --- reads ---------------------------------------------------------------------------------
    def names(self) -> list[str]:
        out = []
        for name in self.storage.children(""):
            try:
                validate_name(name)
            except InvalidArgumentError:
                continue
            if self.versions(name):
                out.append(name)
        return out

    def versions(self, name: str) -> list[int]:
        base = f"{validate_name(name)}/manifests/"
        found = []
        for key in self.storage.list(base):
            stem = key[len(base) :]
            if stem.endswith(".json") and stem[:-5].isdigit() and "/" not in stem:
                found.append(int(stem[:-5]))
        return sorted(found)

    def latest(self, name: str) -> int | None:
        vs = self.versions(name)
        return vs[-1] if vs else None

    def tags(self, name: str) -> dict[str, int]:
        """Every tag of `name` and the version it points at."""
        base = f"{validate_name(name)}/tags/"
        out = {}
        for key in self.storage.list(base):
            tag = key[len(base) :]
            if "/" in tag or tag.startswith("."):
                continue
            try:
                out[tag] = int(self.storage.get(key).decode().strip())
            except (NotFoundError, ValueError):
                continue
        return dict(sorted(out.items()))

    def resolve(self, ref: str | DatasetRef) -> Manifest:
        """The manifest for `name`, `name@N` or `name@tag`; NotFoundError naming what is missing."""
        r = DatasetRef.parse(ref) if isinstance(ref, str) else ref
        version = r.version
        if r.tag is not None:
            try:
                text = self.storage.get(self._tag_key(r.name, r.tag)).decode().strip()
            except NotFoundError:
                raise NotFoundError(f"dataset {r.name!r} has no tag {r.tag!r} under {self.root}") from None
            if not text.isdigit():
                raise InvalidArgumentError(f"tag {r.name}@{r.tag} is malformed ({text[:40]!r})")
            version = int(text)
        if version is None:
            version = self.latest(r.name)
            if version is None:
                raise NotFoundError(f"no dataset named {r.name!r} under {self.root}")
        key = self._manifest_key(r.name, version)
        try:
            text_bytes = self.storage.get(key)
        except NotFoundError:
            known = self.versions(r.name)
            if not known:
                raise NotFoundError(f"no dataset named {r.name!r} under {self.root}") from None
            raise NotFoundError(
                f"dataset {r.name!r} has no version {version} (versions: {', '.join(map(str, known))})"
            ) from None
        m = Manifest.loads(text_bytes, source=self.storage.url_of(key))
        if m.name != r.name or m.version != version:
            raise InvalidArgumentError(f"{self.storage.url_of(key)} holds {m.ref}, not {r.name}@{version}")
        return m

    # --- writes --------------------------------------------------------------------------------
    def create_version(
        self, name: str, build: Callable[[int, int | None], Manifest], *, change: str | None = None
    ) -> Manifest:
        """Write a new version of `name`; `build(version, parent)` makes its manifest.

        The registry sets the manifest's lineage: `parent` is the latest version, and `change` is the
        claimed one (one of `lineage.CLAIMS`), checked against the parent's manifest, or the most
        specific one that holds when `change` is None; a first version is a `create`. A false claim
        raises InvalidArgumentError naming what contradicts it, and nothing is written.

        The version number is taken by an exclusive create, so concurrent writers never overwrite
        each other: the loser rebuilds (and rechecks) its manifest for the next free number.
        """
        validate_name(name)
        if change is not None and change not in CLAIMS:
            raise InvalidArgumentError(f"unknown change {change!r}: one of {', '.join(CLAIMS)}")
        for _ in range(_MAX_CREATE_ATTEMPTS):
            parent = self.latest(name)
            version = (parent or 0) + 1
            manifest = build(version, parent)
            if manifest.name != name or manifest.version != version:
                raise AssertionError("build() must return a manifest for the version it was given")
            manifest = self._with_lineage(manifest, parent, change)
            if self.storage.put_if_absent(self._manifest_key(name, version), manifest.dumps().encode()):
                return manifest
        raise RuntimeError(f"could not allocate a version of {name!r} after {_MAX_CREATE_ATTEMPTS} attempts")

    def _with_lineage(self, m: Manifest, parent: int | None, change: str | None) -> Manifest:
        if parent is None:
            if change not in (None, "replace"):
                raise InvalidArgumentError(
                    f"{m.name} has no version yet: {m.ref} would be its first (a 'create'), not "
                    f"{change!r}, which needs a parent version"
                )
            return replace(m, parent=None, change="create", renamed={})
        before = self.resolve(DatasetRef(m.name, parent))
        kind = change if change is not None else infer_change(before, m)
        check_change(before, m, kind)
        renamed = renamed_fields(before, m) if kind == "rename_columns" else {}
        return replace(m, parent=parent, change=kind, renamed=renamed)

    def set_tag(self, ref: str | DatasetRef, tag: str) -> Manifest:
        """Point `tag` at the version `ref` names (replacing where it pointed); atomic."""
        m = self.resolve(ref)
        self.storage.put(self._tag_key(m.name, tag), f"{m.version}\n".encode())
        return m
