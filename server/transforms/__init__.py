"""Server-side transforms: named, parameterised operations applied to the rows of a Read stream.

A client names them in its ReadRequest (`Loader(..., transforms=[{"op": "image.decode", "column":
"image", "size": [224, 224]}])`); the server validates them against the catalogue (ops.py)
before reading anything, and applies them in order to each message's rows (pipeline.py) on a
thread pool whose heavy work (Pillow, FFmpeg, the tokenizer) runs without the GIL. The
deterministic head of a pipeline (e.g. decode + resize, not a random crop) is computed once per row
group and shared by every stream and job of the node when the server has a disk tier
(server/read/feature_cache.py; prefix.py here).

| op             | module    | in -> out                                                        |
|----------------|-----------|------------------------------------------------------------------|
| text.tokenize  | text.py   | strings -> token ids (tiktoken cl100k_base offline, or bytes)    |
| text.pack      | text.py   | token ids -> rows of seq_len: input_ids, labels, position_ids... |
| image.decode   | image.py  | JPEG/PNG/WebP -> uint8 [H, W, C] (resize, crop, flip, normalize) |
| image.crop     | augment.py| decoded [H, W, C] -> a random (or center) crop, flipped or not   |
| audio.decode   | audio_video.py  | WAV/FLAC/MP3 -> float32 mono [length] at a sample rate          |
| video.frames   | audio_video.py  | MP4/WebM -> uint8 [N, H, W, 3] frames at a stride                |
| rl.windows     | rl.py     | episodes -> windows with n-step returns, done and valid masks    |
"""

from .ops import OPS
from .pipeline import ON_ERROR, Pipeline, StepRows, build_pipeline

__all__ = ["ON_ERROR", "OPS", "Pipeline", "StepRows", "build_pipeline"]
