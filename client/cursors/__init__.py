"""Job cursors: where each rank of a job stands at every checkpoint step, and the stores that keep them.

    records.py       a cursor record: one rank's Loader state at one checkpoint step (pure)
    fence.py         runs of a job: which process may write each rank's cursors (pure)
    stores.py        the CursorStore interface and `open_store(url)`
    redis_store.py   redis://, rediss://, redis+cluster://, unix://
    sqlite_store.py  the embedded default (sqlite:///...)
    committer.py     writes a rank's records off the training thread
    resume.py        the committed cut a job resumes from
    job.py           one rank's side of a job: commit, resume, the run it belongs to
"""
