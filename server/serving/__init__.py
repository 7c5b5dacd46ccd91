"""Serving: the two planes, who may call them, how many streams run, what is measured, and the processes.

    stream_runtime.py     what every Read stream shares under both planes: planner, builder,
                          admission, read-ahead, auth and grants, error -> status, stream log, metrics
    control_plane.py      GetDataset / ListDatasets on grpc.aio (the `--port`)
    data_plane.py         read streams as Arrow Flight DoGet (the `--data-port`)
    data_plane_server.py  the Flight server's lifecycle in one process: start, certificates, stop
    admission.py          streams per process and per peer, and the stream buffer budget
    reaper.py             streams whose client stopped reading (the Reaper: a plane's writes, cut on timeout)
    security.py, tls.py   the security flags checked at start; TLS and certificate rotation
    audit.py, stream_log.py, log_format.py   the audit log, a stream's start/end lines, log formats
    rpc_metrics.py        grpc-ecosystem RPC metrics for both planes
    process_metrics.py, status_http.py   process metrics, /metrics and probes
    ready.py              the ready file
    supervisor.py         `serve --workers N`: the supervisor (each worker is server/worker_process.py)
    config.py             ServerConfig: what a server is asked to be, read by the planes, the supervisor
                          and each worker
"""
