"""Serving: the two planes, who may call them, how many streams run, what is measured, and the processes.

    stream_runtime.py     what every Read stream shares under both planes: planner, builder,
                          admission, read-ahead, auth and grants, error -> status, stream log, metrics
    control_plane.py      GetDataset / ListDatasets on grpc.aio (the `--port`)
    data_plane.py         read streams as Arrow Flight DoGet (the `--data-port`)
    data_plane_server.py  the Flight server's lifecycle in one process: start, certificates, stop
    admission.py          streams per process and per peer, and the stream buffer budget
    reaper.py             streams whose client stopped reading (the Reaper: a plane's writes, cut on timeout)
    auth.py, grants.py    principals (tokens, certificate subjects) and data-plane grants
    security.py, tls.py   the security flags checked at start; TLS and certificate rotation
    redact.py             what a client may see of an error
    audit.py, stream_log.py, log_format.py   the audit log, a stream's start/end lines, log formats
    rpc_metrics.py        grpc-ecosystem RPC metrics for both planes
    process_metrics.py, status_http.py, dataset_label.py   process metrics, /metrics and probes, labels
    ready.py              the ready file
    supervisor.py, worker_process.py   `serve --workers N`: the supervisor and one worker process
"""
