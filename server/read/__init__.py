"""The read path: a decoded request in, Arrow record batches out (blocking code, run in worker threads).

    plan.py               decoded query -> read plan: everything a stream needs, decided before a row is read
    request_schedules.py  a query's batch-size phases, skip ranges and mixture phases
    request_limits.py     this server's limits on a query (the fixed ones: order/read_query.py)
    build.py              read plan + steps -> messages
    selection.py          selected rows of a dataset or of a mixture's sources -> one record batch
    reader.py             rows of a dataset version -> one record batch (take, provenance)
    gather.py             rows taken from several row groups in the order a batch needs
    shards.py             open one shard of a manifest, check it, read its row groups
    checksums.py          row-group checksums: which bytes, computing, checking
    cache.py              the bytes-bounded row-group LRU shared by a process's streams
    spill.py              the local-disk tier under it, shared by a server's workers
    readahead.py          the row groups of a stream's next message, fetched before it is built
    feature_cache.py      a pipeline's deterministic head computed once per row group and shared
"""
