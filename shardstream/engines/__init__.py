"""Engine adapters: write, checksum and register dataset versions from a distributed engine's tasks.

    spark_io.py   Spark (`pip install 'shardstream[spark]'`): write_dataset, register_files
    ray_io.py     Ray Data (`pip install 'shardstream[ray]'`): Datasink, read

Entry points like `shardstream.cli`: they run the server's shard writer and checksums inside the
engine's tasks (and Ray's read goes through the client), so they may import both sides.
"""
