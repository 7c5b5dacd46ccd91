"""The trainer-side SDK: `Loader` streams one rank's batches from a shardstream fleet.

Installs with `pip install shardstream[client]` (plus `torch` for tensor output); it never imports
the server package.
"""

from .loader import BatchInfo, Loader

__all__ = ["BatchInfo", "Loader"]
