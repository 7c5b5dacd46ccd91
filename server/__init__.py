"""Shard-reader server (needs the `server` extra)."""
