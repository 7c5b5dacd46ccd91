"""audio.decode and video.frames: compressed media bytes -> fixed-shape arrays, through PyAV (FFmpeg).

audio.decode {"column": "audio", "sample_rate": 16000, "length": 16000 | "seconds": 1.0,
              "crop": "start" | "center" | "random", "output": column}
    WAV / FLAC / MP3 / OGG / ... -> float32 mono at `sample_rate` (FFmpeg's resampler, channels
    averaged), exactly `length` samples: longer clips are cropped (at the start, the center or a
    random offset drawn from the sample's position-seeded generator), shorter ones padded with zeros.
    Mono is the mean of the channels (as soundfile/torchaudio users compute it).
    Outputs `output` (fixed-size list of float32) and `<output>_length` (int32: samples before padding).

video.frames {"column": "video", "num_frames": 8, "stride": 4, "start": 0, "size": [112, 112],
              "output": column}
    MP4 / WebM / ... -> frames start, start + stride, ... (num_frames of them, in decode order of
    the first video stream) as uint8 RGB [num_frames, H, W, 3], each scaled to H x W by FFmpeg's
    swscale (`VideoFrame.to_ndarray(width=W, height=H, format="rgb24")`). A video with fewer frames
    is padded with black frames. Outputs `output` (fixed-shape tensor) and `<output>_frames` (int32:
    real frames).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa

from shardstream.errors import InvalidArgumentError

from .base import (
    BatchContext,
    Params,
    Result,
    Transform,
    column_of,
    fixed_tensor,
    is_binary,
    keep_rows,
    map_samples,
    replace_field,
    set_column,
    tensor_type,
)

__all__ = ["AudioDecode", "VideoFrames", "decode_audio", "decode_video"]

AUDIO_CROPS = ("start", "center", "random")
MAX_AUDIO_SAMPLES = 1 << 26  # ~23 min at 48 kHz: longer decoded clips are bad samples, not OOMs


def _av() -> Any:
    try:
        import av
    except ImportError as exc:  # pragma: no cover - PyAV is in the server extra
        raise InvalidArgumentError(
            "audio/video transforms need PyAV on the server (pip install 'shardstream[server]')"
        ) from exc
    return av


def decode_audio(data: bytes, sample_rate: int) -> np.ndarray:
    """All of a clip as float32 mono at `sample_rate`."""
    av = _av()
    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.audio:
            raise ValueError("no audio stream")
        stream = container.streams.audio[0]
        # Planar float at the target rate in the stream's own channel layout; channels are averaged
        # here (FFmpeg's own downmix scales stereo by 1/sqrt(2) instead).
        resampler = av.AudioResampler(format="fltp", rate=sample_rate)
        chunks: list[np.ndarray] = []
        total = 0
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
                total += out.samples
            if total > MAX_AUDIO_SAMPLES:
                raise ValueError(f"more than {MAX_AUDIO_SAMPLES} samples decoded")
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
    if not chunks:
        raise ValueError("no audio decoded")
    return np.concatenate(chunks)


def decode_video(data: bytes, num_frames: int, stride: int, start: int, size: tuple[int, int]) -> np.ndarray:
    """Up to `num_frames` frames start, start + stride, ... as uint8 (n, H, W, 3)."""
    av = _av()
    h, w = size
    want = start + (num_frames - 1) * stride
    frames = []
    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.video:
            raise ValueError("no video stream")
        stream = container.streams.video[0]
        for k, frame in enumerate(container.decode(stream)):
            if k >= start and (k - start) % stride == 0:
                frames.append(frame.to_ndarray(width=w, height=h, format="rgb24"))
            if k >= want:
                break
    if not frames:
        raise ValueError(f"no frame at index {start} or later")
    return np.stack(frames)


class AudioDecode(Transform):
    op = "audio.decode"

    def __init__(self, params: Params, schema: pa.Schema) -> None:
        self.column = params.str("column", "audio")
        column_of(self.op, schema, self.column, "a binary column of encoded audio", is_binary)
        self.sample_rate = params.int("sample_rate", low=1000, high=384_000)
        length = params.int("length", None, low=1, high=MAX_AUDIO_SAMPLES)
        seconds = params.float("seconds", None, low=0.0)
        if (length is None) == (seconds is None):
            raise InvalidArgumentError("audio.decode: give exactly one of 'length' (samples) and 'seconds'")
        self.length = length if length is not None else max(1, round(seconds * self.sample_rate))
        if self.length > MAX_AUDIO_SAMPLES:
            raise InvalidArgumentError(
                f"audio.decode: {self.length} samples is over the limit of {MAX_AUDIO_SAMPLES}"
            )
        self.crop = params.str("crop", "start", AUDIO_CROPS)
        self.output = params.str("output", self.column)
        _av()
        schema = replace_field(
            schema, self.output, pa.field(self.output, pa.list_(pa.float32(), self.length))
        )
        self.output_schema = replace_field(
            schema, self.output + "_length", pa.field(self.output + "_length", pa.int32())
        )

    @property
    def deterministic(self) -> bool:
        return self.crop != "random"

    def apply(self, batch: pa.RecordBatch, ctx: BatchContext) -> Result:
        col = batch.column(self.column)
        n = self.length

        def one(i: int) -> tuple[np.ndarray, int]:
            data = col[i].as_py()
            if data is None:
                raise ValueError(f"column {self.column!r} is null")
            clip = decode_audio(data, self.sample_rate)
            if len(clip) > n:
                if self.crop == "start":
                    off = 0
                elif self.crop == "center":
                    off = (len(clip) - n) // 2
                else:
                    off = int(ctx.rng(i, self.op).integers(0, len(clip) - n + 1))
                return clip[off : off + n], n
            return np.concatenate([clip, np.zeros(n - len(clip), np.float32)]), len(clip)

        results, errors = map_samples(one, len(col), ctx)
        return _decoded(batch, results, errors, self.output, "_length", (n,), np.float32, self.output_schema)


def _decoded(
    batch: pa.RecordBatch,
    results: list[tuple[np.ndarray, int] | None],
    errors: list[tuple[int, str]],
    output: str,
    suffix: str,
    shape: tuple[int, ...],
    dtype: type,
    schema: pa.Schema,
) -> Result:
    """The decoded samples as column `output` (fixed shape) and their real lengths as `output+suffix`."""
    keep = keep_rows(len(results), errors)
    out = batch.take(pa.array(keep)) if errors else batch
    arrays = [r[0] if r is not None else None for r in results]
    counts = pa.array([results[i][1] for i in keep.tolist()], pa.int32())  # type: ignore[index]
    # `output` first (in place, or appended before `output+suffix`), then the counts.
    i = schema.get_field_index(output + suffix)
    partial = schema.remove(i) if i == len(schema) - 1 else schema
    out = set_column(out, output, fixed_tensor(arrays, shape, np.dtype(dtype), keep), partial)
    return Result(set_column(out, output + suffix, counts, schema), keep, errors)


class VideoFrames(Transform):
    op = "video.frames"

    def __init__(self, params: Params, schema: pa.Schema) -> None:
        self.column = params.str("column", "video")
        column_of(self.op, schema, self.column, "a binary column of encoded video", is_binary)
        self.num_frames = params.int("num_frames", low=1, high=1024)
        self.stride = params.int("stride", 1, low=1, high=1 << 16)
        self.start = params.int("start", 0, low=0, high=1 << 24)
        self.size = params.size("size", high=4096)
        self.output = params.str("output", self.column)
        h, w = self.size
        self.shape = (self.num_frames, h, w, 3)
        _av()
        schema = replace_field(
            schema, self.output, pa.field(self.output, tensor_type(self.shape, np.dtype(np.uint8)))
        )
        self.output_schema = replace_field(
            schema, self.output + "_frames", pa.field(self.output + "_frames", pa.int32())
        )

    @property
    def deterministic(self) -> bool:
        return True

    def apply(self, batch: pa.RecordBatch, ctx: BatchContext) -> Result:
        col = batch.column(self.column)

        def one(i: int) -> tuple[np.ndarray, int]:
            data = col[i].as_py()
            if data is None:
                raise ValueError(f"column {self.column!r} is null")
            frames = decode_video(data, self.num_frames, self.stride, self.start, self.size)
            got = len(frames)
            if got < self.num_frames:
                frames = np.concatenate(
                    [frames, np.zeros((self.num_frames - got, *frames.shape[1:]), np.uint8)]
                )
            return frames, got

        results, errors = map_samples(one, len(col), ctx)
        return _decoded(
            batch, results, errors, self.output, "_frames", self.shape, np.uint8, self.output_schema
        )
