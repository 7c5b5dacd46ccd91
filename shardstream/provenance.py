"""The provenance columns: names the server gives columns of its own, so no dataset may use them.

Every row a server reads carries `_shard` (the shard's index in the version's manifest) and `_row` (the
row in that shard), added by the reader (server/read/reader.py) and sent with each batch (DESIGN §7:
every batch knows its provenance). A dataset whose schema has one of these names is refused by ingest,
register and engine writes (server/writing/). Beside them travel `_source` (a mixture's source index)
and text.pack's `_documents` (server/transforms/pipeline.py `PROVENANCE`, client/batch.py).

Core: both sides may read it; it imports nothing.
"""

__all__ = ["PROVENANCE_COLUMNS"]

PROVENANCE_COLUMNS = ("_shard", "_row")
