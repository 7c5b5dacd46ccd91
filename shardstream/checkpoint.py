"""`from shardstream.checkpoint import Checkpointer`: the public path of the client's Checkpointer.

A re-export of `shardstream.client.checkpoint` (DESIGN §13; docs/checkpoints.md), so it needs the
`client` extra, as the Loader does. tests/test_layers.py lets this module import the client and
nothing of the server.
"""

from shardstream.client.checkpoint import Checkpointer, SaveHandle

__all__ = ["Checkpointer", "SaveHandle"]
