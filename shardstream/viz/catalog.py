"""Datasets and versions as the visualizers list them: history, schema, modality, diffs, presets.

With a registry (`--root`) everything comes from the manifests (parent, change, created, tags, the
modality recorded at ingest, shard names, `lineage.diff`). With only a fleet (`--server`) the
servers' `ListDatasets`/`GetDataset` answers are used: versions, rows, shards, bytes, fields, and a
modality read off the fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from shardstream.errors import NotFoundError
from shardstream.lineage import diff as manifest_diff
from shardstream.manifest import DatasetRef, Manifest
from shardstream.v1 import shardstream_pb2 as pb

from .source import DataSource

__all__ = ["Catalog", "VersionRow", "presets"]

IMAGE_NAMES = ("image", "img", "jpg", "jpeg", "png", "webp", "photo")
AUDIO_NAMES = ("audio", "wav", "flac", "mp3", "ogg", "sound")
VIDEO_NAMES = ("video", "mp4", "webm", "clip")


@dataclass(frozen=True)
class VersionRow:
    name: str
    version: int
    rows: int
    shards: int
    bytes: int
    fingerprint: str
    fields: tuple[tuple[str, str], ...]  # (name, type)
    modality: str
    parent: int | None = None
    change: str = ""
    created: str = ""
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


def infer_modality(fields: tuple[tuple[str, str], ...]) -> str:
    """The modality a version's fields suggest (used when no manifest records one)."""
    names = {n.lower(): t for n, t in fields}
    binary = [n for n, t in names.items() if t in ("binary", "large_binary")]
    for kind, hints in (("image", IMAGE_NAMES), ("audio", AUDIO_NAMES), ("video", VIDEO_NAMES)):
        if any(n in hints for n in binary):
            return kind
    if {"reward", "done"} <= set(names):
        return "rl_episodes"
    if any(t in ("string", "large_string") for t in names.values()):
        return "text"
    return "table"


def _pick(fields: tuple[tuple[str, str], ...], hints: tuple[str, ...], types: tuple[str, ...]) -> str | None:
    for n, t in fields:
        if n.lower() in hints and t in types:
            return n
    return None


def presets(row: VersionRow) -> list[tuple[str, str]]:
    """(label, transforms JSON) to look at a version through: as stored, and its modality's usual ops."""
    out = [("as stored", "")]
    binary = ("binary", "large_binary")
    f = row.fields
    image = _pick(f, IMAGE_NAMES, binary)
    if image:
        out.append(
            ("image.decode 224 center", json.dumps([{"op": "image.decode", "column": image, "size": [224, 224]}]))
        )
        out.append(
            (
                "image.decode 96 random crop + flip",
                json.dumps([{"op": "image.decode", "column": image, "size": [96, 96], "crop": "random", "hflip": True}]),
            )
        )
    audio = _pick(f, AUDIO_NAMES, binary)
    if audio:
        op = {"op": "audio.decode", "column": audio, "sample_rate": 16000, "seconds": 1.0}
        out.append(("audio.decode 16 kHz 1 s", json.dumps([op])))
    video = _pick(f, VIDEO_NAMES, binary)
    if video:
        op = {"op": "video.frames", "column": video, "num_frames": 8, "stride": 2, "size": [64, 64]}
        out.append(("video.frames 8 x 64²", json.dumps([op])))
    if {"reward", "done"} <= {n for n, _ in f}:
        op = {"op": "rl.windows", "window": 16, "stride": 16, "n_step": 3, "gamma": 0.99}
        out.append(("rl.windows 16, 3-step returns", json.dumps([op])))
    text = next((n for n, t in f if t in ("string", "large_string") and n.lower() in ("text", "content", "document")), None)
    if text:
        tok = {"op": "text.tokenize", "column": text}
        out.append(("text.tokenize cl100k", json.dumps([tok])))
        out.append(("tokenize + pack 128", json.dumps([tok, {"op": "text.pack", "column": text, "seq_len": 128}])))
    return out


def default_transforms(row: VersionRow) -> str:
    """The preset a step browser opens with: the modality's first op (as stored for tables)."""
    found = presets(row)
    return found[1][1] if len(found) > 1 else ""


class Catalog:
    """What there is to look at, from the registry when there is one, else from the fleet."""

    def __init__(self, source: DataSource) -> None:
        self.source = source
        self.registry = source.registry
        self._shards: dict[str, list[str]] = {}  # pinned name@version -> its shard URIs

    # --- rows ------------------------------------------------------------------------------------
    def _from_manifest(self, m: Manifest, tags: dict[str, int]) -> VersionRow:
        fields = tuple(m.fields)
        return VersionRow(
            m.name,
            m.version,
            m.num_rows,
            len(m.shards),
            m.num_bytes,
            m.fingerprint,
            fields,
            # "table" is what a JSON Lines / Parquet ingest records: the fields say more
            str(m.metadata.get("modality") or "table") if m.metadata.get("modality") not in (None, "", "table")
            else infer_modality(fields),
            m.parent,
            m.change,
            m.created_at,
            tuple(sorted(t for t, v in tags.items() if v == m.version)),
            dict(m.metadata),
        )

    @staticmethod
    def _from_info(info: pb.DatasetInfo) -> VersionRow:
        fields = tuple((f.name, f.type) for f in info.fields)
        return VersionRow(
            info.name,
            info.version,
            info.num_rows,
            info.num_shards,
            info.num_bytes,
            info.fingerprint,
            fields,
            infer_modality(fields),
        )

    def datasets(self) -> list[VersionRow]:
        """Every dataset's latest version."""
        if self.registry is not None:
            reg = self.registry
            return [self._from_manifest(m, reg.tags(m.name)) for m in reg.listing().manifests]
        return [self._from_info(i) for i in self.source.list_datasets()]

    def versions(self, name: str) -> list[VersionRow]:
        """Every readable version of `name`, newest first."""
        if self.registry is not None:
            tags = self.registry.tags(name)
            found = [m for m in self.registry.manifests(name) if isinstance(m, Manifest)]
            if not found:
                raise NotFoundError(f"no dataset named {name!r}")
            return [self._from_manifest(m, tags) for m in reversed(found)]
        latest = self.source.dataset_info(name)
        out = [self._from_info(latest)]
        for v in range(latest.version - 1, 0, -1):
            try:
                out.append(self._from_info(self.source.dataset_info(f"{name}@{v}")))
            except NotFoundError:
                continue
        return out

    def version(self, ref: str) -> VersionRow:
        """One version (`name`, `name@N`, `name@tag`), resolved."""
        if self.registry is not None:
            m = self.registry.resolve(ref)
            return self._from_manifest(m, self.registry.tags(m.name))
        return self._from_info(self.source.dataset_info(ref))

    def diff(self, old: str, new: str) -> dict[str, Any]:
        """What changed from `old` to `new` (lineage.diff with a registry; fields and rows without)."""
        if self.registry is not None:
            return manifest_diff(self.registry.resolve(old), self.registry.resolve(new)).to_json()
        a, b = self.version(old), self.version(new)
        fa, fb = dict(a.fields), dict(b.fields)
        return {
            "old": a.ref,
            "new": b.ref,
            "change": "",
            "recorded_change": None,
            "fields_added": [{"name": n, "type": t} for n, t in fb.items() if n not in fa],
            "fields_removed": [{"name": n, "type": t} for n, t in fa.items() if n not in fb],
            "fields_renamed": [],
            "fields_retyped": [{"name": n, "old": fa[n], "new": t} for n, t in fb.items() if n in fa and fa[n] != t],
            "shards_added": [],
            "shards_removed": [],
            "shards_before": a.shards,
            "shards_after": b.shards,
            "rows_before": a.rows,
            "rows_after": b.rows,
        }

    def manifests(self, label: str) -> list[Manifest] | None:
        """The manifests of a pinned dataset or mixture's sources (None without a registry)."""
        if self.registry is None:
            return None
        from shardstream.order.mixture import is_mixture, parse_mixture

        refs = [r for r, _ in parse_mixture(label)] if is_mixture(label) else [label]
        return [self.registry.resolve(r) for r in refs]

    def shard_name(self, source_label: str, shard: int) -> str:
        """The shard's URI when manifests are at hand, else its index in the version's shard list."""
        if self.registry is not None:
            uris = self._shards.get(source_label)
            if uris is None:
                try:
                    uris = [s.uri for s in self.registry.resolve(DatasetRef.parse(source_label)).shards]
                except NotFoundError:
                    uris = []
                self._shards[source_label] = uris  # a pinned version never changes
            if 0 <= shard < len(uris):
                return uris[shard]
        return f"shard {shard}"
