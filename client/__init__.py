"""The trainer-side SDK: `Loader` streams one rank's batches from a shardstream fleet.

Installs with `pip install shardstream[client]` (plus `torch` for tensor output); it imports the
core and `shardstream.order`, never the server package. Job cursors and their stores live in
`shardstream.client.cursors`; checkpoints of model state in `shardstream.client.checkpoint`.
"""

from .loader import BatchInfo, Loader

__all__ = ["BatchInfo", "Loader"]
