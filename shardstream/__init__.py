"""shardstream: remote dataset serving for ML training.

The `shardstream/` folder holds three kinds of code (DESIGN §2; tests/test_layers.py enforces it):

- the pure core, its top-level modules: errors, manifest, registry, storage, lineage, IPC helpers,
  transform spec, extension types, the wire stubs (`v1/`). Imports nothing but itself.
- the order wing, `shardstream.order`: read order, shuffles, permutations, schedules, cursor
  arithmetic, mixtures, the pure halves of inspect/explain. Imports the core only.
- the entry points, each in its own folder: `cli/`, `demo/`, `viz/` (view, web), `engines/` (Spark,
  Ray). The only code that may import both sides.

The client (`shardstream.client`, folder `client/`) and the server (`shardstream.server`, folder
`server/`) are subpackages; each imports the core and the order wing, and the client never imports
the server.
"""

__version__ = "0.1.0"
