"""The trainer-side SDK: `Loader` streams one rank's batches from a shardstream fleet.

Installs with `pip install shardstream[client]` (plus `torch` for tensor output); it imports the
core and `shardstream.order`, never the server package. Job cursors and their stores live in
`shardstream.client.cursors`; checkpoints of model state in `shardstream.client.checkpoint`.
`StepReader` / `read_step` read one rank's batch at any one step as a Loader gets it (step_reader.py:
the visualizers' source). These names, `cursors` and `checkpoint` are the public surface; every other
module here is the SDK's own (the visualizers import none: tests/test_layers.py).
"""

from .credentials import ChannelSecurity, TlsOption
from .loader import BatchInfo, Loader
from .step_reader import StepReader, as_numpy, read_step
from .target import Target

__all__ = ["BatchInfo", "ChannelSecurity", "Loader", "StepReader", "Target", "TlsOption", "as_numpy", "read_step"]
