"""Shard-reader server (needs the `server` extra), in wings:

    read/        the read path: request -> read plan -> messages; shards, checksums, caches, read-ahead
    serving/     both planes over one process, security, admission, reaping, metrics, the supervisor
    writing/     ingest, the shard writer, engine writes, materialize, drop_rows, register/verify
    backends/    storage roots by URL (a local directory, s3://)
    checkpoints/ checkpoint storage: content-addressed chunks, parts, manifests committed last (DESIGN §13)
    transforms/  named, parameterised server-side transforms

At the top: `config.py` (ServerConfig), `lifecycle.py` (one process's serve: start, drain, stop) and
`local_fleet.py` (servers as local processes for the demo, benchmarks and tests). Imports the core
and `shardstream.order` only, never `shardstream.client`.
"""
