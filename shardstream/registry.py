"""The dataset registry, beside the data, on any `Storage` (DESIGN §3).

Layout under the root (a local directory or `s3://bucket/prefix`):

    <name>/manifests/<version>.json   immutable, created only if absent (local: exclusive link;
                                      S3: conditional put `If-None-Match: *`)
    <name>/tags/<tag>                 the version number a tag points at (replaced atomically)
    <name>/data/...                   shards, referenced by relative URI from manifests

A version is never rewritten. Two writers racing for the same name both succeed, with distinct
versions: each tries `latest + 1` with an exclusive create and moves on to the next on conflict.
Before writing, the new version's change (claimed, or inferred when not) is checked against its
parent (`lineage.check_change`): a false claim writes nothing. The shards a new version adds are made
durable (`Storage.sync`) before its manifest is written, and the manifest before it is returned.

One bad entry never wedges the rest (DESIGN §3). An entry that cannot be read — a manifest that is
truncated or not JSON, not a manifest, holds another version, fails its fingerprint, is a symbolic
link or leads outside the root, or cannot be read for its permissions; a dataset directory that is a
symbolic link (never followed: a version must not change under its readers, and gc must never reach
another dataset's files through it) — is a `BadEntry`:

- resolving that version is DataLossError naming `name@version` and the reason, never a path or an
  exception text (a client may see it); other versions and other datasets resolve as before;
- `name` (latest) or a tag on a bad version fails the same way: the registry never falls back to an
  older version silently;
- `listing()` returns the latest version of every readable dataset and the bad entries apart;
- a new version of a dataset whose latest manifest is bad is refused before anything is written (its
  lineage cannot be checked); the version number is not reused while the bad file is there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa

from shardstream.errors import (
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from shardstream.lineage import CLAIMS, check_change, infer_change, renamed_fields
from shardstream.manifest import Manifest
from shardstream.names import DatasetRef, is_version_text, validate_name, validate_tag
from shardstream.storage import ObjectRef, Storage, check_key, open_local_storage

__all__ = ["BadEntry", "Listing", "Registry"]

_MAX_CREATE_ATTEMPTS = 1000
LINKED_DIRECTORY = "its directory is a symbolic link (not followed)"


@dataclass(frozen=True)
class BadEntry:
    """A registry entry that cannot be read: one version's manifest, or a whole dataset directory."""

    name: str
    version: int | None  # None: the dataset's directory itself
    reason: str  # short, and safe to show a client: names no path and no exception text
    key: str = ""  # the entry's storage key (for operators)
    cause: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def ref(self) -> str:
        return self.name if self.version is None else f"{self.name}@{self.version}"

    @property
    def detail(self) -> str:
        """The underlying error, for operators (command line, server log): may name files."""
        if self.cause is None:
            return ""
        text = str(self.cause)
        return (
            text if isinstance(self.cause, InvalidArgumentError) else f"{type(self.cause).__name__}: {text}"
        )

    def error(self) -> DataLossError:
        return DataLossError(f"dataset {self.ref}: {self.reason}")


@dataclass(frozen=True)
class Listing:
    """The latest version of every readable dataset, and the entries that could not be read."""

    manifests: list[Manifest]
    bad: list[BadEntry]


class Registry:
    """Dataset versions under one root: a Storage, or a local directory path.

    An `s3://bucket/prefix` root is opened by `shardstream.server.backends.roots.open_registry` (S3 code lives
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
        """Where a shard lives: a local file path, or an object of a remote storage. A shard whose
        path leads out of the root (a symbolic link) is DataLossError naming version and shard."""
        key = self.shard_key(manifest, uri)
        try:
            local = self.storage.local_path(key)
        except InvalidArgumentError as exc:  # the key itself was checked: a symlink leads out
            raise DataLossError(
                f"{manifest.ref}: shard {uri}: leads outside the registry root (a symbolic link?)"
            ) from exc
        return local if local is not None else ObjectRef(self.storage, key)

    @staticmethod
    def _manifest_key(name: str, version: int) -> str:
        return f"{validate_name(name)}/manifests/{version}.json"

    @staticmethod
    def _tag_key(name: str, tag: str) -> str:
        return f"{validate_name(name)}/tags/{validate_tag(tag)}"

    # --- reads ---------------------------------------------------------------------------------
    def dataset_dirs(self) -> list[str]:
        """Every directory under the root with a valid dataset name (with versions or not)."""
        out = []
        for name in self.storage.children(""):
            try:
                out.append(validate_name(name))
            except InvalidArgumentError:
                continue
        return out

    def names(self) -> list[str]:
        """Every dataset with at least one version whose directory can be read (see `listing`)."""
        out = []
        for name in self.dataset_dirs():
            found = self._versions_or_bad(name)
            if isinstance(found, list) and found:
                out.append(name)
        return out

    def versions(self, name: str) -> list[int]:
        """The version numbers of `name` (readable or not); DataLossError if they cannot be listed."""
        found = self._versions_or_bad(name)
        if isinstance(found, BadEntry):
            raise found.error() from found.cause
        return found

    def _versions_or_bad(self, name: str) -> list[int] | BadEntry:
        if self.storage.is_link(name):
            return BadEntry(name, None, LINKED_DIRECTORY, name)
        base = f"{validate_name(name)}/manifests/"
        try:
            keys = self.storage.list(base)
        except (InvalidArgumentError, PermissionDeniedError, OSError) as exc:
            return BadEntry(name, None, "its versions cannot be listed", base, exc)
        found = []
        for key in keys:
            stem = key[len(base) :]
            if stem.endswith(".json") and is_version_text(stem[:-5]):
                found.append(int(stem[:-5]))
        return sorted(found)

    def latest(self, name: str) -> int | None:
        vs = self.versions(name)
        return vs[-1] if vs else None

    def tags(self, name: str) -> dict[str, int]:
        """Every readable tag of `name` and the version it points at."""
        base = f"{validate_name(name)}/tags/"
        out = {}
        for key in self.storage.list(base):
            tag = key[len(base) :]
            if "/" in tag or tag.startswith("."):
                continue
            try:
                text = self.storage.get(key).decode().strip()
            except (NotFoundError, InvalidArgumentError, PermissionDeniedError, OSError, ValueError):
                continue
            if is_version_text(text):
                out[tag] = int(text)
        return dict(sorted(out.items()))

    def load(self, name: str, version: int) -> Manifest | BadEntry:
        """The manifest of `name@version`, or the BadEntry saying why it cannot be read;
        NotFoundError when there is no such file."""
        key = self._manifest_key(name, version)

        def bad(reason: str, cause: BaseException | None = None) -> BadEntry:
            return BadEntry(name, version, reason, key, cause)

        if self.storage.is_link(name):
            return BadEntry(name, None, LINKED_DIRECTORY, name)
        if self.storage.is_link(key):
            return bad("its manifest is a symbolic link (not followed)")
        try:
            data = self.storage.get(key)
        except InvalidArgumentError as exc:  # a symlink above it leads out of the root
            return bad("its manifest leads outside the registry root", exc)
        except PermissionDeniedError as exc:
            return bad("its manifest cannot be read (permission denied)", exc)
        except OSError as exc:
            return bad("its manifest cannot be read (I/O error)", exc)
        try:
            d = json.loads(data)
        except (ValueError, RecursionError) as exc:
            return bad("its manifest is not valid JSON (truncated or overwritten?)", exc)
        if not isinstance(d, dict):
            return bad("its manifest is not a JSON object")
        try:
            m = Manifest.from_json(d, source=f"{name}@{version}")
        except InvalidArgumentError as exc:
            text = str(exc)
            if "fingerprint" in text:
                return bad("its manifest does not match its stored fingerprint (edited?)", exc)
            if "unsupported manifest format" in text:
                return bad("its manifest has an unsupported format", exc)
            return bad("its manifest is not a valid shardstream manifest (fields missing or malformed)", exc)
        except (TypeError, KeyError, AttributeError, RecursionError, pa.ArrowException) as exc:
            return bad("its manifest is not a valid shardstream manifest (fields missing or malformed)", exc)
        if m.name != name or m.version != version:
            return bad(f"its manifest holds {m.ref}")
        return m

    def manifests(self, name: str) -> list[Manifest | BadEntry]:
        """Every version of `name`, oldest first: each one's manifest, or why it cannot be read."""
        out: list[Manifest | BadEntry] = []
        for v in self.versions(name):
            try:
                out.append(self.load(name, v))
            except NotFoundError:  # removed since it was listed
                continue
        return out

    def listing(self) -> Listing:
        """The latest version of every dataset (ListDatasets, `datasets list`), the bad entries apart:
        a dataset whose latest manifest is bad is reported, not listed with an older version."""
        good: list[Manifest] = []
        bad: list[BadEntry] = []
        for name in self.dataset_dirs():
            found = self._versions_or_bad(name)
            if isinstance(found, BadEntry):
                bad.append(found)
                continue
            for version in reversed(found):
                try:
                    loaded = self.load(name, version)
                except NotFoundError:  # removed since it was listed
                    continue
                (good if isinstance(loaded, Manifest) else bad).append(loaded)  # type: ignore[arg-type]
                break
        return Listing(good, bad)

    def resolve(self, ref: str | DatasetRef) -> Manifest:
        """The manifest for `name`, `name@N` or `name@tag`; NotFoundError naming what is missing,
        DataLossError naming the version when its manifest cannot be read."""
        r = DatasetRef.parse(ref) if isinstance(ref, str) else ref
        version = self.version_of(r)
        try:
            loaded = self.load(r.name, version)
        except NotFoundError:
            known = self.versions(r.name)
            if not known:
                raise NotFoundError(f"no dataset named {r.name!r} under {self.root}") from None
            raise NotFoundError(
                f"dataset {r.name!r} has no version {version} (versions: {', '.join(map(str, known))})"
            ) from None
        if isinstance(loaded, BadEntry):
            raise loaded.error() from loaded.cause
        return loaded

    def version_of(self, ref: str | DatasetRef) -> int:
        """The version `name`, `name@N` or `name@tag` names (a tag's file read, or the versions
        listed for the latest; its manifest is not read): NotFoundError for no such dataset or tag,
        DataLossError for a tag that cannot be read."""
        r = DatasetRef.parse(ref) if isinstance(ref, str) else ref
        version = r.version
        if r.tag is not None:
            if self.storage.is_link(r.name):
                raise BadEntry(r.name, None, LINKED_DIRECTORY, r.name).error()
            try:
                text = self.storage.get(self._tag_key(r.name, r.tag)).decode(errors="replace").strip()
            except NotFoundError:
                raise NotFoundError(f"dataset {r.name!r} has no tag {r.tag!r} under {self.root}") from None
            except (InvalidArgumentError, PermissionDeniedError, OSError) as exc:
                raise DataLossError(f"tag {r.name}@{r.tag} cannot be read") from exc
            if not is_version_text(text):
                raise DataLossError(f"tag {r.name}@{r.tag} is malformed (not a version number)")
            version = int(text)
        if version is None:
            version = self.latest(r.name)
            if version is None:
                raise NotFoundError(f"no dataset named {r.name!r} under {self.root}")
        return version

    # --- writes --------------------------------------------------------------------------------
    def create_version(
        self, name: str, build: Callable[[int, int | None], Manifest], *, change: str | None = None
    ) -> Manifest:
        """Write a new version of `name`; `build(version, parent)` makes its manifest.

        The registry sets the manifest's lineage: `parent` is the latest version, and `change` is the
        claimed one (one of `lineage.CLAIMS`), checked against the parent's manifest, or the most
        specific one that holds when `change` is None; a first version is a `create`. A false claim
        raises InvalidArgumentError naming what contradicts it, and nothing is written; so does a
        parent whose manifest cannot be read (DataLossError, see `check_parent`).

        The shards the version adds are made durable first, then the version number is taken by an
        exclusive create (durable when this returns), so concurrent writers never overwrite each
        other: the loser rebuilds (and rechecks) its manifest for the next free number.
        """
        validate_name(name)
        if change is not None and change not in CLAIMS:
            raise InvalidArgumentError(f"unknown change {change!r}: one of {', '.join(CLAIMS)}")
        synced: set[str] = set()
        for _ in range(_MAX_CREATE_ATTEMPTS):
            before = self.check_parent(name)
            parent = None if before is None else before.version
            version = (parent or 0) + 1
            manifest = build(version, parent)
            if manifest.name != name or manifest.version != version:
                raise AssertionError("build() must return a manifest for the version it was given")
            manifest = self._with_lineage(manifest, before, change)
            had = set() if before is None else {s.uri for s in before.shards}
            added = [self.shard_key(manifest, s.uri) for s in manifest.shards if s.uri not in had]
            self.storage.sync(k for k in added if k not in synced)
            synced.update(added)
            if self.storage.put_if_absent(self._manifest_key(name, version), manifest.dumps().encode()):
                return manifest
        raise RuntimeError(f"could not allocate a version of {name!r} after {_MAX_CREATE_ATTEMPTS} attempts")

    def check_parent(self, name: str) -> Manifest | None:
        """The latest version of `name` — the parent a new version would get — or None for a new
        dataset. DataLossError, before anything is written, when it cannot be read: a new version
        neither skips a bad latest (its lineage would be unchecked) nor reuses its number."""
        latest = self.latest(name)
        if latest is None:
            return None
        try:
            loaded = self.load(name, latest)
        except NotFoundError:  # removed since it was listed
            return self.check_parent(name)
        if isinstance(loaded, BadEntry):
            raise DataLossError(
                f"cannot write a new version of {name}: its latest version {loaded.ref} is unreadable "
                f"({loaded.reason}); restore that manifest, or move it aside (RUNBOOK: a bad manifest)"
            ) from loaded.cause
        return loaded

    def _with_lineage(self, m: Manifest, before: Manifest | None, change: str | None) -> Manifest:
        if before is None:
            if change not in (None, "replace"):
                raise InvalidArgumentError(
                    f"{m.name} has no version yet: {m.ref} would be its first (a 'create'), not "
                    f"{change!r}, which needs a parent version"
                )
            return replace(m, parent=None, change="create", renamed={})
        kind = change if change is not None else infer_change(before, m)
        check_change(before, m, kind)
        renamed = renamed_fields(before, m) if kind == "rename_columns" else {}
        return replace(m, parent=before.version, change=kind, renamed=renamed)

    def set_tag(self, ref: str | DatasetRef, tag: str) -> Manifest:
        """Point `tag` at the version `ref` names (replacing where it pointed); atomic."""
        m = self.resolve(ref)
        self.storage.put(self._tag_key(m.name, tag), f"{m.version}\n".encode())
        return m
