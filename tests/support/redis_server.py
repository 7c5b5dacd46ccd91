"""A private redis-server on a free loopback port: the launcher is loadtest/redis_server.py (the one
copy, shared with the chaos suite; see its docstring for why it lives there)."""

from __future__ import annotations

from loadtest.redis_server import RedisServer

__all__ = ["RedisServer"]
