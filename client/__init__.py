"""The trainer-side SDK: `Loader` streams one rank's batches from a shardstream fleet.

Installs with `pip install shardstream[client]` (plus `torch` for tensor output); it imports the
core and `shardstream.order`, never the server package. Job cursors and their stores live in
`shardstream.client.cursors`; checkpoints of model state in `shardstream.client.checkpoint`.
`StepReader` / `read_step` read one rank's batch at any one step as a Loader gets it (step_reader.py:
the visualizers' source); `open_store`, `DEFAULT_STORE_URL` and `CursorRecord` read a job's cursors (the
web app's job pages). These names, `cursors` and `checkpoint` are the public surface; every other
module here is the SDK's own. The visualizers import this package only (tests/test_layers.py), and the
Checkpointer through its public path `shardstream.checkpoint`.
"""

from .credentials import ChannelSecurity, TlsOption
from .cursors.records import CursorRecord
from .cursors.stores import DEFAULT_STORE_URL, open_store
from .loader import BatchInfo, Loader
from .step_reader import StepReader, as_numpy, read_step
from .target import Target

__all__ = [
    "DEFAULT_STORE_URL",
    "BatchInfo",
    "ChannelSecurity",
    "CursorRecord",
    "Loader",
    "StepReader",
    "Target",
    "TlsOption",
    "as_numpy",
    "open_store",
    "read_step",
]
