"""Shard-reader server (needs the `server` extra), in wings that import one way only, lowest first
(tests/test_layers.py enforces it; a wing imports its own modules and those of lower wings):

    backends/    storage roots by URL (a local directory, s3://)
    policy/      who may read what (principals, grants), what a client may see of an error, the
                 metrics' dataset label: the rules every wing above applies alike
    transforms/  named, parameterised server-side transforms
    read/        the read path: request -> read plan -> messages; shards, checksums, caches, read-ahead
    checkpoints/ checkpoint storage: content-addressed chunks, parts, manifests committed last (DESIGN §13)
    writing/     ingest, the shard writer, engine writes, materialize, drop_rows, register/verify, gc
    serving/     both planes over one process, security, admission, reaping, metrics, the supervisor,
                 ServerConfig
    (the top)    the modules here: `lifecycle.py` (one process's serve: start, drain, stop),
                 `worker_process.py` (one worker of `serve --workers N`) and `local_fleet.py` (servers
                 as local processes for the demo, benchmarks and tests)

Wings on one line of tests/test_layers.py's SERVER_WINGS (checkpoints and writing; backends and policy)
import neither of each other. Imports the core and `shardstream.order` only, never `shardstream.client`.
"""
