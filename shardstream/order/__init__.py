"""The order wing (DESIGN §4, §7): which sample a rank gets at which step, as pure functions. No I/O.

    read_order.py       a dataset's epoch order, where a position's row lives, the rows a step covers
    shuffle/            the shuffle modes (none, block, full), one module each, behind one dispatcher
    permutation.py      keyed pseudo-random permutations of [0, n) in O(1) memory
    schedule.py         a job's schedule: batch-size phases and skip ranges as functions of the position
    scheduled_steps.py  the steps of one epoch under a schedule
    mixture.py          weighted mixtures: a seeded, block-stratified interleave of sources
    curriculum.py       mixture phases: weights that change at job positions
    cursor_math.py      the exactly-once cursor arithmetic: next offset, worker splits, epoch start
    delivery.py         what the plan delivers to a rank at a step (the pure half of `inspect`)
    explain.py          where a job's step was in the plan, and where a sample lands (`explain`)
    read_query.py       the wire codec: ReadQuery <-> ReadRequest, the fixed limits of a request

Import rule: this wing imports the core (`shardstream.errors`, `.manifest`, ...) and itself only; never
`shardstream.client` or `shardstream.server`. Both sides run the same functions, so a server and a
trainer agree on every position.
"""
