"""The Redis cursor store (redis://, rediss://, redis+cluster://, unix://), and what it can keep.

Keys of one job share the hash tag {job}, so a write, its fencing check and its completion check run
in one Lua script — atomic, also on a cluster:

    shardstream:{job}:step:<step>:<key>       hash  rank -> cursor record (JSON, "format" inside)
    shardstream:{job}:step-gen:<step>:<key>   hash  rank -> generation of the process that wrote it
    shardstream:{job}:steps / committed       zsets of the steps written / committed
    shardstream:{job}:committed-key           hash  step -> the cursor key that completed it
    shardstream:{job}:ranks-written           hash  step -> most ranks written under one key
    shardstream:{job}:run                     hash  format, world_size, counter (fence.py)
    shardstream:{job}:slots                   hash  <rank> -> generation, <rank>:by -> token, <rank>:at
    shardstream:{job}:migration               string  the job's pending version move
    shardstream:jobs                          set   job names

Stores written before runs existed have no run, slots or step-gen keys: their records count as they
always did, and a job gets a run at its first claim.

What `commit(wait=True)` waits for depends on how Redis persists (checked once per store at its
first claim or write, with INFO server and CONFIG GET in one round trip — or INFO persistence where a
managed Redis disables CONFIG):

    appendonly yes, appendfsync always   Redis answers after the AOF is fsynced: nothing more to wait for
    appendonly yes, everysec, Redis 7.2+ WAITAOF 1 0: the AOF is fsynced (survives a host crash)
    appendonly yes, older Redis, or      INFO persistence until aof_buffer_length is 0: the write is in
    appendfsync no, or no WAITAOF        the AOF file (survives a Redis crash or kill -9; a host crash
                                         may lose the last second with everysec, more with no)
    appendonly no, RDB snapshots         acknowledged only: a restart rolls back to the last snapshot
    no persistence                       acknowledged only: a restart loses everything

The last two are warned about once per process and Redis server (URL and run id), at the first claim. On a cluster, WAITAOF
is not used (it must run on the writer's connection); INFO is read from the node holding the job.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardstream.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    StaleRunError,
    UnavailableError,
    UnclaimedError,
)

from .fence import RUN_FORMAT, Run, Slot, new_run_base, stale_message

__all__ = ["REDIS_TIMEOUT_S", "WAITAOF_TIMEOUT_MS", "Persistence", "RedisStore"]

log = logging.getLogger("shardstream.client")

REDIS_TIMEOUT_S = 2.0  # per Redis operation: a commit never hangs the committer thread for long
# A call that timed out and changes nothing when repeated (a read; a record's write script, whose HSETs
# and ZADDs give the same state twice) is asked again after a jittered backoff (0.05-0.1 s, then x4): in
# a storm 1,000 ranks call at once and one Redis thread answers them in turn (loadtest.scale: 20 of
# 1,000 resumes, and in another run the last commit of some ranks, timed out at 2 s with one attempt,
# so no step was committed by every rank). The claim (a counter) is not retried here.
READ_ATTEMPTS = 4
READ_BACKOFF_S = 0.05
WAITAOF_TIMEOUT_MS = 1500  # below REDIS_TIMEOUT_S; appendfsync everysec fsyncs within ~1 s
_PREFIX = "shardstream"

_warned: set[str] = set()  # Redis servers (URL and run id) whose persistence was reported in this process
_warned_lock = threading.Lock()


@dataclass(frozen=True)
class Persistence:
    """How a Redis keeps its data, as far as it says. None: it would not say (CONFIG disabled)."""

    aof: bool | None
    appendfsync: str | None
    save: str | None  # RDB save points ("" = none)
    version: tuple[int, ...] = ()
    source: str = "CONFIG GET"  # or "INFO persistence", or "nothing" (neither answered)
    run_id: str = ""  # the server process's id (INFO server): a restarted Redis is checked anew

    @property
    def durability(self) -> str:
        """What a durable write waits for: "fsync", "waitaof", "aof-written" or "acknowledged"."""
        if not self.aof:
            return "acknowledged"
        if self.appendfsync == "always":
            return "fsync"
        if self.appendfsync == "no":  # the OS flushes when it likes: no fsync to wait for
            return "aof-written"
        return "waitaof" if self.version >= (7, 2) else "aof-written"

    def problem(self, url: str) -> str | None:
        """The warning for a Redis that can lose acknowledged commits on a restart, or None."""
        fix = "set appendonly yes (appendfsync always, or everysec) — see deploy/RUNBOOK.md, 'Cursor store'"
        if self.aof:
            return None
        if self.source == "nothing":
            return f"cursor store {url}: could not tell whether Redis persists anything (CONFIG and INFO refused): {fix}"
        if self.aof is False and self.save == "":
            return (
                f"cursor store {url} has no persistence (appendonly no, no RDB save points): a Redis restart "
                f"loses every committed cursor, also those acknowledged by commit(wait=True); {fix}"
            )
        if self.save:
            return (
                f"cursor store {url} persists by RDB snapshots only (save {self.save!r}): a Redis restart rolls "
                f"the committed cursors back to the last snapshot; {fix} (and pass resume_min_step= on resume)"
            )
        return (
            f"cursor store {url} has no append-only file ({self.source}: aof_enabled 0; CONFIG is disabled, so its "
            f"snapshot settings are unknown): a Redis restart loses the commits since the last snapshot, if any; {fix}"
        )


class RedisStore:
    """Redis or Redis Cluster (see the module docstring)."""

    def __init__(self, url: str) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - redis is in the client extra
            raise InvalidArgumentError(
                "a redis:// cursor store needs the redis package (pip install redis)"
            ) from exc
        self.url = url
        self._redis = redis
        opts = {"socket_timeout": REDIS_TIMEOUT_S, "socket_connect_timeout": REDIS_TIMEOUT_S}
        self._cluster = url.startswith("redis+cluster://")
        if self._cluster:
            self._client = redis.RedisCluster.from_url(
                "redis://" + url.removeprefix("redis+cluster://"), **opts
            )
        else:
            self._client = redis.Redis.from_url(url, **opts)
        self._write_script = self._client.register_script(self._WRITE)
        self._claim_script = self._client.register_script(self._CLAIM)
        self._persistence: Persistence | None = None
        self._lock = threading.Lock()

    def _key(self, job: str, *parts: object) -> str:
        return ":".join([_PREFIX, "{" + job + "}", *map(str, parts)])

    def _call(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except self._redis.RedisError as exc:
            raise UnavailableError(f"cursor store {self.url}: {type(exc).__name__}: {exc}") from exc

    def _idempotent(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        """`_call` of a call that changes nothing when repeated (a read; the record's write script; SADD):
        asked again when it times out (READ_ATTEMPTS in all, jittered backoff)."""
        delay = READ_BACKOFF_S
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except self._redis.TimeoutError as exc:
                if attempt == READ_ATTEMPTS:
                    raise UnavailableError(
                        f"cursor store {self.url}: {type(exc).__name__}: {exc} ({READ_ATTEMPTS} attempts)"
                    ) from exc
            except self._redis.RedisError as exc:
                raise UnavailableError(f"cursor store {self.url}: {type(exc).__name__}: {exc}") from exc
            time.sleep(delay * (1.0 + random.random()))
            delay *= 4

    # --- persistence -----------------------------------------------------------------------------
    def persistence(self, job: str = "") -> Persistence:
        """How this Redis persists (asked once per store); warns once per process and Redis server
        when it can lose acknowledged commits."""
        with self._lock:
            if self._persistence is None:
                self._persistence = self._ask_persistence(self._node(job))
                problem = self._persistence.problem(self.url)
                with _warned_lock:
                    server = f"{self.url}#{self._persistence.run_id}"
                    first = server not in _warned
                    _warned.add(server)
                if problem and first:
                    log.warning("%s", problem)
            return self._persistence

    def _node(self, job: str) -> Any:
        """A plain client of the node holding the job's keys (the client itself when not a cluster)."""
        if not self._cluster:
            return self._client
        node = self._call(self._client.get_node_from_key, self._key(job, "run"))
        return self._client.get_redis_connection(node)

    def _ask_persistence(self, node: Any) -> Persistence:
        """One round trip (INFO server and CONFIG GET in one pipeline): a rank's start is one of W at once.
        A Redis before 7.0 takes one parameter a CONFIG GET (a second round trip asks them one by one);
        a Redis that refuses CONFIG (managed services) is asked INFO persistence instead."""
        ResponseError = self._redis.ResponseError
        version: tuple[int, ...] = ()
        run_id = ""
        info, config = self._pipelined(
            node, ("info", "server"), ("config_get", "appendonly", "appendfsync", "save")
        )
        if not isinstance(info, ResponseError):
            version = tuple(int(p) for p in str(info.get("redis_version", "0")).split(".")[:3] if p.isdigit())
            run_id = str(info.get("run_id", ""))
        if isinstance(config, ResponseError) and version < (7,):  # maybe one parameter a CONFIG GET
            config = self._pipelined(node, *(("config_get", name) for name in ("appendonly", "appendfsync", "save")))
            refused = [c for c in config if isinstance(c, ResponseError)]
            config = refused[0] if refused else {k: v for c in config for k, v in c.items()}
        if not isinstance(config, ResponseError):
            aof, fsync, save = (config.get(name) for name in ("appendonly", "appendfsync", "save"))
            return Persistence(aof == "yes", fsync, save, version, run_id=run_id)
        # CONFIG disabled (managed Redis): ask INFO
        (info,) = self._pipelined(node, ("info", "persistence"))
        if not isinstance(info, ResponseError):
            return Persistence(
                bool(int(info.get("aof_enabled", 0))), None, None, version, "INFO persistence", run_id
            )
        return Persistence(None, None, None, version, "nothing", run_id)

    def _pipelined(self, node: Any, *commands: tuple[str, ...]) -> list[Any]:
        """Read-only commands, (client method, *args), in one round trip (`_idempotent`: asked again on a
        timeout); the answer of each, or the ResponseError it got (refused, unknown: the caller decides)."""

        def ask() -> list[Any]:
            pipe = node.pipeline(transaction=False)
            for method, *args in commands:
                getattr(pipe, method)(*args)
            return list(pipe.execute(raise_on_error=False))

        answers = self._idempotent(ask)
        for answer in answers:  # a connection lost in the pipeline: as `_idempotent` reports it
            if isinstance(answer, self._redis.RedisError) and not isinstance(answer, self._redis.ResponseError):
                raise UnavailableError(f"cursor store {self.url}: {type(answer).__name__}: {answer}") from answer
        return answers

    def _wait_aof_written(self, job: str, deadline: float) -> None:
        """Until the AOF buffer is empty: every write acknowledged so far is in the file."""
        node = self._node(job)
        while True:
            info = self._call(node.info, "persistence")
            if info.get("aof_last_write_status", "ok") != "ok":
                raise UnavailableError(f"cursor store {self.url}: Redis cannot write its append-only file")
            if int(info.get("aof_buffer_length", 0)) == 0:
                return
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"cursor store {self.url}: the append-only file was not written within {REDIS_TIMEOUT_S:g} s"
                )
            time.sleep(0.002)

    # --- runs ------------------------------------------------------------------------------------
    # KEYS: run, slots. ARGV: rank, world size, token, now, run format, the base of a new run state
    # (fence.new_run_base: drawn by the client, Lua's random is seeded the same on every call).
    # Mirrors fence.decide_claim.
    _CLAIM = """
        local fmt = tonumber(redis.call('HGET', KEYS[1], 'format') or '0')
        if fmt > tonumber(ARGV[5]) then return redis.error_reply('shardstream run format ' .. fmt) end
        local world = redis.call('HGET', KEYS[1], 'world_size')
        if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HSET', KEYS[1], 'base', ARGV[6], 'counter', ARGV[6]) end
        local counter = tonumber(redis.call('HGET', KEYS[1], 'counter') or '0')
        if world == ARGV[2] and redis.call('HGET', KEYS[2], ARGV[1] .. ':by') == ARGV[3] then
            return tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
        end
        if world ~= ARGV[2] then redis.call('DEL', KEYS[2]) end
        counter = counter + 1
        redis.call('HSET', KEYS[1], 'format', ARGV[5], 'world_size', ARGV[2], 'counter', counter)
        redis.call('HSET', KEYS[2], ARGV[1], counter, ARGV[1] .. ':by', ARGV[3], ARGV[1] .. ':at', ARGV[4])
        return counter
    """

    def claim(self, job: str, rank: int, world_size: int, token: str) -> int:
        self.persistence(job)
        keys = [self._key(job, "run"), self._key(job, "slots")]
        try:
            gen = self._claim_script(
                keys,
                [str(rank), str(world_size), token, repr(time.time()), str(RUN_FORMAT), str(new_run_base())],
            )
        except self._redis.ResponseError as exc:
            if "shardstream run format" in str(exc):
                raise FailedPreconditionError(
                    f"cursor store {self.url}: job {job!r} was claimed by a newer client ({exc}; this one writes "
                    f"{RUN_FORMAT}): upgrade shardstream on every rank"
                ) from exc
            raise UnavailableError(f"cursor store {self.url}: {type(exc).__name__}: {exc}") from exc
        except self._redis.RedisError as exc:
            raise UnavailableError(f"cursor store {self.url}: {type(exc).__name__}: {exc}") from exc
        return int(gen)

    def run(self, job: str) -> Run | None:
        world = self._idempotent(self._client.hget, self._key(job, "run"), "world_size")
        if world is None:
            return None
        raw = {
            k.decode(): v.decode()
            for k, v in self._idempotent(self._client.hgetall, self._key(job, "slots")).items()
        }
        slots = {
            int(r): Slot(int(g), raw.get(f"{r}:by", ""), float(raw.get(f"{r}:at", 0) or 0))
            for r, g in raw.items()
            if r.isdigit()
        }
        return Run(int(world), dict(sorted(slots.items())))

    # --- cursors ---------------------------------------------------------------------------------
    # KEYS: [1] records of (step, key), [2] steps written, [3] committed steps, [4] step -> committed key,
    #       [5] ranks written, [6] slots, [7] generations of (step, key), [8] run.
    # ARGV: [1] rank, [2] record, [3] step, [4] world size, [5] key, [6] generation ('' = unfenced).
    # A fenced write of a process that no longer holds its rank is refused ({-1, holder...}), one to a
    # store that holds no run of the job, or one that never issued its generation (fence.issued_by),
    # is answered {-2} (the writer claims again); a step
    # completes when every rank wrote it under the key and each record's writer still holds its rank.
    _WRITE = """
        local gen = ARGV[6]
        if gen ~= '' and redis.call('EXISTS', KEYS[8]) == 0 then return {-2} end
        if gen ~= '' then
            local g = tonumber(gen)
            local base = tonumber(redis.call('HGET', KEYS[8], 'base') or '0')
            if g <= base or g > tonumber(redis.call('HGET', KEYS[8], 'counter') or '0') then return {-2} end
        end
        if gen ~= '' and redis.call('HGET', KEYS[6], ARGV[1]) ~= gen then
            return {-1, redis.call('HGET', KEYS[6], ARGV[1]) or '', redis.call('HGET', KEYS[6], ARGV[1] .. ':by') or '',
                    redis.call('HGET', KEYS[6], ARGV[1] .. ':at') or '', redis.call('HGET', KEYS[8], 'world_size') or ''}
        end
        if gen == '' then gen = '0' end
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
        redis.call('HSET', KEYS[7], ARGV[1], gen)
        redis.call('ZADD', KEYS[2], ARGV[3], ARGV[3])
        local n = redis.call('HLEN', KEYS[1])
        redis.call('HSET', KEYS[5], ARGV[3], math.max(n, tonumber(redis.call('HGET', KEYS[5], ARGV[3]) or 0)))
        if n ~= tonumber(ARGV[4]) then return 0 end
        local gens = redis.call('HGETALL', KEYS[7])
        for i = 1, #gens, 2 do
            if gens[i + 1] ~= '0' and redis.call('HGET', KEYS[6], gens[i]) ~= gens[i + 1] then return 0 end
        end
        redis.call('ZADD', KEYS[3], ARGV[3], ARGV[3])
        redis.call('HSET', KEYS[4], ARGV[3], ARGV[5])
        return 1
    """

    def write(
        self,
        job: str,
        step: int,
        key: str,
        rank: int,
        world_size: int,
        record: bytes,
        *,
        gen: int | None = None,
        durable: bool = False,
    ) -> bool:
        keys = [
            self._key(job, "step", step, key),
            self._key(job, "steps"),
            self._key(job, "committed"),
            self._key(job, "committed-key"),
            self._key(job, "ranks-written"),
            self._key(job, "slots"),
            self._key(job, "step-gen", step, key),
            self._key(job, "run"),
        ]
        args = [str(rank), record, str(step), str(world_size), key, "" if gen is None else str(gen)]
        deadline = time.monotonic() + REDIS_TIMEOUT_S
        how = self.persistence(job).durability if durable else "acknowledged"
        if how == "waitaof" and self._cluster:
            how = "aof-written"  # WAITAOF must run on the writer's connection, which a cluster client hides
        if how == "waitaof":
            out, fsynced = self._write_waitaof(keys, args)
            if not fsynced:  # no WAITAOF after all (a proxy, a fork): the next best thing
                how = "aof-written"
        else:
            out = self._idempotent(self._write_script, keys, args)  # the same HSETs and ZADDs again
        if isinstance(out, list) and int(out[0]) == -2:
            raise UnclaimedError(
                f"cursor store {self.url} holds no run of job {job!r} that issued generation {gen}"
            )
        if isinstance(out, list):
            world_now = out[4].decode() if out[4] else ""
            holder = Slot(int(out[1]), out[2].decode(), float(out[3] or 0)) if out[1] else None
            raise StaleRunError(
                stale_message(job, rank, gen or 0, holder, int(world_now) if world_now else None, step)
            )
        if how == "aof-written":
            self._wait_aof_written(job, deadline)
        self._idempotent(self._client.sadd, f"{_PREFIX}:jobs", job)
        return bool(out)

    def _write_waitaof(self, keys: list[str], args: list[Any]) -> tuple[Any, bool]:
        """The write and WAITAOF 1 0 on one connection (WAITAOF waits for that connection's writes):
        (the script's answer, whether WAITAOF ran). A server without WAITAOF is not asked again."""
        pipe = self._client.pipeline(transaction=False)
        self._write_script(keys, args, client=pipe)
        pipe.execute_command("WAITAOF", 1, 0, WAITAOF_TIMEOUT_MS)
        out, acked = self._call(pipe.execute, raise_on_error=False)
        if isinstance(out, Exception):
            raise UnavailableError(f"cursor store {self.url}: {type(out).__name__}: {out}") from out
        if isinstance(acked, Exception):
            if "unknown command" not in str(acked).lower():
                raise UnavailableError(f"cursor store {self.url}: WAITAOF: {acked}") from acked
            log.info(
                "cursor store %s: no WAITAOF (%s); durable commits wait for the AOF write instead",
                self.url,
                acked,
            )
            with self._lock:
                p = self._persistence
                if p is not None:
                    self._persistence = dataclasses.replace(p, version=())  # as if older than 7.2
            return out, False
        if not isinstance(out, list) and int(acked[0]) < 1:
            raise UnavailableError(
                f"cursor store {self.url}: the append-only file was not fsynced within {WAITAOF_TIMEOUT_MS} ms"
            )
        return out, True

    def read(self, job: str, step: int) -> dict[int, bytes]:
        key = self._idempotent(self._client.hget, self._key(job, "committed-key"), str(step))
        if key is None:
            return {}
        raw = self._idempotent(self._client.hgetall, self._key(job, "step", step, key.decode()))
        return {int(k): bytes(v) for k, v in raw.items()}

    def read_ranks(self, job: str, step: int, ranks: Sequence[int]) -> dict[int, bytes]:
        key = self._idempotent(self._client.hget, self._key(job, "committed-key"), str(step))
        if key is None or not ranks:
            return {}
        fields = [str(r) for r in ranks]
        raw = self._idempotent(self._client.hmget, self._key(job, "step", step, key.decode()), fields)
        return {int(f): bytes(v) for f, v in zip(fields, raw, strict=True) if v is not None}

    def committed(self, job: str) -> list[int]:
        return sorted(int(s) for s in self._idempotent(self._client.zrange, self._key(job, "committed"), 0, -1))

    def latest(self, job: str) -> int | None:
        top = self._idempotent(self._client.zrevrange, self._key(job, "committed"), 0, 0)
        return int(top[0]) if top else None

    def steps(self, job: str) -> dict[int, int]:
        raw = self._idempotent(self._client.hgetall, self._key(job, "ranks-written"))
        return {int(s): int(n) for s, n in sorted(raw.items(), key=lambda kv: int(kv[0]))}

    def jobs(self) -> list[str]:
        return sorted(j.decode() for j in self._idempotent(self._client.smembers, f"{_PREFIX}:jobs"))

    def set_migration(self, job: str, record: bytes) -> None:
        self._call(self._client.set, self._key(job, "migration"), record)

    def get_migration(self, job: str) -> bytes | None:
        raw = self._idempotent(self._client.get, self._key(job, "migration"))
        return bytes(raw) if raw is not None else None

    def close(self) -> None:
        self._client.close()
