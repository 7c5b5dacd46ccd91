"""Dataset names, tags and versions: the one strict parser (DESIGN §10), no I/O.

Every place a dataset reference comes in — GetDataset, a DoGet ticket's `dataset` and mixture
sources, the command line (ingest, register, datasets, drop-rows, materialize, cursor), a Loader's
`dataset` — goes through `DatasetRef.parse` or `validate_name`. Anything else is
InvalidArgumentError with one line, never another exception:

    name     [A-Za-z0-9][A-Za-z0-9._-]{0,127}, matched in full (a trailing newline is not a name)
    tag      a name that is not all digits (`NAME@12` means version 12)
    version  1 to 4,294,967,295 (DatasetInfo.version is a uint32), written in ASCII digits without
             leading zeros: `NAME@7`, never `NAME@007`, `NAME@٧` or `NAME@⁷`

`str.isdigit()` and `int()` accept far more than this (superscripts, other scripts' digits,
underscores, surrounding spaces, any length) — which is why nothing outside this module parses a
version. The canonical form is the only accepted one, so `str(DatasetRef.parse(text)) == text`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardstream.errors import InvalidArgumentError, excerpt

__all__ = [
    "MAX_NAME_CHARS",
    "MAX_VERSION",
    "DatasetRef",
    "is_version_text",
    "parse_version",
    "validate_name",
    "validate_tag",
]

MAX_NAME_CHARS = 128
MAX_VERSION = (1 << 32) - 1  # DatasetInfo.version is a uint32
_NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}", re.ASCII)
_VERSION_RE = re.compile(rf"[1-9][0-9]{{0,{len(str(MAX_VERSION)) - 1}}}", re.ASCII)
_DIGITS_RE = re.compile(r"[0-9]+", re.ASCII)


def validate_name(name: object, what: str = "dataset name") -> str:
    """`name` if it is a valid dataset (or tag) name, else InvalidArgumentError."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidArgumentError(
            f"invalid {what} {excerpt(name)}: use ASCII letters, digits, '.', '_' or '-' (at most "
            f"{MAX_NAME_CHARS}, not starting with a punctuation mark)"
        )
    return name


def validate_tag(tag: object) -> str:
    """`tag` if it is a valid tag name: a name that is not a number."""
    text = validate_name(tag, "tag")
    if _DIGITS_RE.fullmatch(text):
        raise InvalidArgumentError(f"tag {text!r} is a number: NAME@{text} would mean version {text}")
    return text


def is_version_text(text: str) -> bool:
    """Whether `text` is a version as written in a reference, a manifest's file name or a tag."""
    return _VERSION_RE.fullmatch(text) is not None and int(text) <= MAX_VERSION


def parse_version(text: str, what: str = "dataset version") -> int:
    """The version `text` writes (see the module docstring), else InvalidArgumentError."""
    if is_version_text(text):
        return int(text)
    if _DIGITS_RE.fullmatch(text) and not text.strip("0"):
        raise InvalidArgumentError(f"{what}s start at 1, got {excerpt(text)}")
    raise InvalidArgumentError(
        f"invalid {what} {excerpt(text)}: an integer from 1 to {MAX_VERSION} in ASCII digits, "
        "without leading zeros"
    )


@dataclass(frozen=True)
class DatasetRef:
    """`name`, `name@N` (a version) or `name@tag`."""

    name: str
    version: int | None = None
    tag: str | None = None

    @classmethod
    def parse(cls, text: object) -> DatasetRef:
        if not isinstance(text, str) or not text:
            raise InvalidArgumentError(f"dataset must be 'NAME', 'NAME@VERSION' or 'NAME@TAG', got {excerpt(text)}")
        name, sep, rest = text.partition("@")
        validate_name(name)
        if not sep:
            return cls(name)
        try:
            if rest.isdigit():  # any script's digits: a version, which must be written in ASCII ones
                return cls(name, version=parse_version(rest))
            return cls(name, tag=validate_tag(rest))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"dataset {excerpt(text)}: {exc}") from None

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}@{self.version}"
        if self.tag is not None:
            return f"{self.name}@{self.tag}"
        return self.name
