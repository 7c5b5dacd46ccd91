"""The catalogue: op name -> transform class. Clients name these; they never ship code."""

from __future__ import annotations

from .audio_video import AudioDecode, VideoFrames
from .augment import ImageCrop
from .base import Transform
from .image import ImageDecode
from .rl import RLWindows
from .text import Pack, Tokenize

__all__ = ["OPS"]

OPS: dict[str, type[Transform]] = {
    cls.op: cls for cls in (Tokenize, Pack, ImageDecode, ImageCrop, AudioDecode, VideoFrames, RLWindows)
}
