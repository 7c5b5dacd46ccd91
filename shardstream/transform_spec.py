"""The client's form of server-side transforms -> the wire form, checked for shape only.

    transforms=[{"op": "image.decode", "column": "image", "size": [224, 224]}, ...]

Each entry is a mapping with an "op" name and that op's parameters. Only the server knows the
catalogue and checks names and parameters (INVALID_ARGUMENT naming them); this module checks what
can be checked without it, so a typo in the structure fails before any network call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shardstream.errors import InvalidArgumentError
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["ON_ERROR", "to_wire"]

ON_ERROR = ("fail", "skip")


def to_wire(transforms: Sequence[Mapping[str, Any]] | None, on_error: str = "fail") -> list[pb.Transform]:
    if on_error not in ON_ERROR:
        raise InvalidArgumentError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    if transforms is None:
        return []
    if isinstance(transforms, Mapping | str) or not isinstance(transforms, Sequence):
        raise InvalidArgumentError(
            f'transforms must be a list of {{"op": ..., parameters...}} mappings, got {transforms!r}'
        )
    out = []
    for k, t in enumerate(transforms):
        if not isinstance(t, Mapping) or not isinstance(t.get("op"), str) or not t["op"]:
            raise InvalidArgumentError(f'transforms[{k}] must be a mapping with an "op" name, got {t!r}')
        params = {key: v for key, v in t.items() if key != "op"}
        try:
            text = json.dumps(params, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"transforms[{k}] ({t['op']}): parameters must be plain JSON values ({exc})"
            ) from exc
        out.append(pb.Transform(op=t["op"], params_json=text))
    return out
