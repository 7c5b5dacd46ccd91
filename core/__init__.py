"""shardstream: remote dataset serving for ML training.

This package (the `core/` directory) holds what both sides import: the manifest model, the read
plan, the errors and the wire stubs. The client (`shardstream.client`) and the server
(`shardstream.server`) are subpackages; the client never imports the server.
"""

__version__ = "0.1.0"
