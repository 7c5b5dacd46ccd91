"""shardstream: remote dataset serving for ML training.

This package (the `shardstream/` folder) holds what both sides import: the manifest model, the
read plan, the errors and the wire stubs; it imports neither side. The client (`shardstream.client`,
folder `client/`) and the server (`shardstream.server`, folder `server/`) are its subpackages; the
client never imports the server. Only the command line (`shardstream.cli`) and the demo see both.
"""

__version__ = "0.1.0"
