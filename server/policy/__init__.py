"""Policy: the rules every wing of the server applies alike, with no server code under them.

    auth.py            principals from `serve --auth FILE` (tokens, certificate subjects) and what each may read
    grants.py          the data plane's short-lived grants for certificate principals
    redact.py          what a client may see of an error (no server path, no exception text)
    dataset_label.py   the bounded `dataset` label of the server's metrics

The read planner checks a caller's principal on every dataset it names; the checkpoint plane and both
serving planes authenticate with the same principals and grants and redact with the same rule; the
transform pipeline and the stream metrics label with the same dataset label. Imports the core and
`shardstream.order` only: the lowest wing with backends/ (tests/test_layers.py).
"""
