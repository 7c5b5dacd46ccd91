"""Writing: everything that makes or checks a dataset version, and cleans up after a killed one.

    ingest.py, ingest_sources.py  `shardstream ingest` and its sources
    shard_writer.py               batches in, Parquet shards out (the layout every writer uses)
    bulk.py                       versions written by a distributed engine (Spark, Ray): the engine-neutral half
    materialize.py                deterministic transforms run once, registered as a derived version
    drop_rows.py                  a version without some known-bad rows
    registry_ops.py               `register` (bring your own Parquet) and `verify`
    orphan_files.py               `datasets gc`: the files of killed ingests no manifest references
"""
