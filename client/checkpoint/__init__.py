"""Checkpoints through the fleet (DESIGN §13): `from shardstream.client.checkpoint import Checkpointer`.

    checkpointer.py  Checkpointer (save, load, steps, latest, follow) and SaveHandle
    chunks.py        ChunkStore: byte ranges as content-addressed chunks (hash, has, put), commit, fetch
    state_tree.py    staging a state tree to host memory, and putting a loaded one back
    transport.py     the Flight calls to a server's data plane (DoPut, DoGet, DoAction, ListFlights),
                     a thin layer over the client's one fleet session (client/transport/fleet.py)
    dcp.py           torch.distributed.checkpoint StorageWriter / StorageReader over the same calls
    checkpoint_metrics.py  shardstream_client_checkpoint_* (stall, upload lag, bytes sent, dedup, loaded)

The records are shardstream/checkpoint_format.py's; the server side is shardstream.server.checkpoints.
"""

from __future__ import annotations

from .checkpointer import Checkpointer, SaveHandle

__all__ = ["Checkpointer", "SaveHandle"]
