"""Support code for the tests, in one place; test modules import from here, never from each other.

    data          the toy datasets (N_ROWS, make_table, write_dataset) and put_parquet
    servers       shardstream servers as real processes (Servers), free ports, /metrics, waits
    redis_server  a private redis-server on a free port
    seaweed       the real S3 server (the launcher is loadtest/seaweed.py) and private roots on it
    faults        FAULT INJECTORS (not mocks): a TCP proxy that cuts S3 responses
    media         real media files (text, images, audio, video, RL episodes) and datasets of them
    rank_worker   a training rank as a process (`python -m tests.support.rank_worker`) and RankProcs
    torch_rank    a training rank reading through DataLoader workers with a job, as a process
    splits        data-loader worker splits simulated from the pure cursor functions (round robin)
    processes     the command line and fresh interpreters as subprocesses
    resume        the one resume harness (check_resume) and the multi-rank job it drives (Ranks)
    chart         helm/shardstream rendered offline, validated, and its server container run as rendered
    certs         real X.509 certificates (cryptography): a CA, server and client certificates
    bad_registry  unreadable registry entries as they happen (one FAULT INJECTOR: a denied read) and
                  a real ingest killed mid-way (what `datasets gc` removes)

tests/conftest.py only defines fixtures, from these. loadtest/ never imports tests/; tests may import
loadtest/ (the SeaweedFS launcher lives there so that both can use one copy).
"""
