"""The visualizers: data as a rank receives it, in the terminal (`shardstream view`) and the browser
(`shardstream web`).

    query.py         StepQuery: (dataset, seed, shuffle, world size, batch size, rank, step, epoch,
                     columns, transforms) — the state both UIs keep (the web app in its URLs)
    source.py        DataSource: one rank's step read through the fleet with the client's own code
                     (a job's step placed from its cursor, as `explain --job` places it)
    reproduce.py     "Copy as Python": the script whose `batch` is a step's batch
    catalog.py       datasets, versions, history, diffs, schema and modality
    samples.py       a received step -> what each row shows (text, tokens, image, audio, video, RL)
    tokens.py        token ids -> their text, with the tokenizer the transform used
    encode.py        PNG, WAV and SVG made from received arrays (no decoding)
    fleet_status.py  the servers' health and metrics, and jobs from a cursor store
    web/             the Starlette app (`shardstream web`)
    tui/             the textual app (`shardstream view`)

Like `shardstream.cli`, this package is an entry point: it uses the client (to read) and may start
a server of its own (`--root`), so, with the CLI, the demo and the engines, it may import both
sides (DESIGN §2).
"""
