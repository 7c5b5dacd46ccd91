"""Balanced steps (DESIGN §4): which rank of a global step gets which work. Pure functions, no I/O.

The set of samples in global step t never changes (the cursor stays one number); only their split
across the W ranks does, and that split is a function of (the step's samples in global order, their
costs, W) alone — every server computes it alike, with no coordination, and a job resumed at another
world size balances its steps for the new W.

Modes (`parse_balance`):

    None          rank r gets the r-th slice of B samples (the default: no change for jobs that do
                  not ask). With packing, each rank packs its own documents: a rank whose documents
                  are long gets more rows (max/mean 1.8x at 8 ranks on CPython's sources).
    "tokens"      packed text: the step's documents, in global order, each followed by EOS, are one
                  token stream cut into R = ceil(T / seq_len) rows; rank r gets rows
                  [r·R // W, (r+1)·R // W) — every rank within one row of the others, each a
                  contiguous run of the step's documents whose first and last may be cut
                  (`deal_tokens`, `token_range`)
    "attention"   as "tokens", and the rows are dealt so that the largest per-rank attention cost
                  Σ(document-chunk length²) — document-masked attention's cost — is small, rows
                  still within one of each other (`deal_attention`: LPT in rounds of W rows)
    {"cost": C}   unpacked variable-length samples: the step's samples are partitioned by the
                  numeric column C (seconds, frames, pixels, token counts) so that the largest
                  rank's cost is as small as LPT makes it (`partition_costs`; ranks get different
                  numbers of samples)

Every function here is deterministic: ties are broken by index (row, sample or rank), never by
hash order or timing. Costs come from data kept with the dataset (a length or cost column), so a
rank never decodes another rank's samples to plan.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from shardstream.errors import InvalidArgumentError

__all__ = [
    "BALANCE_MODES",
    "BalanceSpec",
    "PackedStep",
    "deal_attention",
    "deal_attention_steps",
    "deal_tokens",
    "deal_tokens_steps",
    "pack_step",
    "pack_steps",
    "parse_balance",
    "partition_costs",
    "rank_costs",
    "token_range",
    "unbalanced_rows",
]

BALANCE_MODES = ("tokens", "attention", "cost")


@dataclass(frozen=True)
class BalanceSpec:
    """A job's balance= option, checked: mode None, "tokens", "attention" or "cost" (with `column`)."""

    mode: str | None = None
    column: str | None = None
    pad_rows: bool = False

    def __post_init__(self) -> None:
        if self.mode not in (None, *BALANCE_MODES):
            raise InvalidArgumentError(
                f'balance= must be None, "tokens", "attention" or {{"cost": COLUMN}}, got {self.mode!r}'
            )
        if (self.mode == "cost") != (self.column is not None):
            raise InvalidArgumentError('balance={"cost": COLUMN} names the numeric column that holds each sample\'s cost')
        if self.pad_rows and self.mode not in ("tokens", "attention"):
            raise InvalidArgumentError('pad_rows=True pads packed rows: it needs balance="tokens" or "attention"')

    @property
    def packed(self) -> bool:
        return self.mode in ("tokens", "attention")


def parse_balance(value: object, *, pad_rows: bool = False) -> BalanceSpec:
    """The balance= option as a user writes it: None, "tokens", "attention" or {"cost": "COLUMN"}
    (or a BalanceSpec: the normal form, given again)."""
    if isinstance(value, BalanceSpec):
        return BalanceSpec(value.mode, value.column, pad_rows or value.pad_rows)
    if value is None or isinstance(value, str):
        return BalanceSpec(value, None, pad_rows)
    if isinstance(value, Mapping):
        column = value.get("cost")
        if set(value) != {"cost"} or not isinstance(column, str) or not column:
            raise InvalidArgumentError(f'balance= as a mapping is {{"cost": "COLUMN"}}, got {dict(value)!r}')
        return BalanceSpec("cost", column, pad_rows)
    raise InvalidArgumentError(f'balance= must be None, "tokens", "attention" or {{"cost": COLUMN}}, got {value!r}')


# --- packed text -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PackedStep:
    """A step's documents packed as one token stream: `sizes` (tokens of each document, its EOS
    included, in global order), `seq_len`, the number of rows and each row's attention cost."""

    sizes: np.ndarray
    seq_len: int
    num_rows: int
    row_cost: np.ndarray  # Σ over the row's document chunks of chunk length² (padding not counted)


def _pieces(sizes: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, length) of every document chunk of the packed stream: documents cut at row ends. A
    document that ends at a row's end is cut there twice: the second chunk has length 0 (and costs
    nothing), which spares a sort of unique cuts."""
    ends = np.cumsum(sizes, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    cuts = np.concatenate([ends, np.arange(seq_len, total, seq_len, dtype=np.int64)])
    cuts.sort()
    length = np.diff(cuts, prepend=0)
    return (cuts - length) // seq_len, length


def pack_step(sizes: np.ndarray | list[int], seq_len: int) -> PackedStep:
    """The step's documents (`sizes`: tokens with EOS, in global order) packed into rows."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if seq_len < 1:
        raise InvalidArgumentError(f"seq_len must be >= 1, got {seq_len}")
    if np.any(sizes < 1):
        raise InvalidArgumentError("every document holds one token at least (its EOS)")
    total = int(sizes.sum())
    rows = -(-total // seq_len)
    row, length = _pieces(sizes, seq_len)
    cost = np.bincount(row, weights=length.astype(np.float64) ** 2, minlength=rows) if rows else np.zeros(0)
    return PackedStep(sizes, seq_len, rows, cost)


def deal_tokens(num_rows: int, world_size: int) -> np.ndarray:
    """The rank of each row: rank r gets rows [r·R // W, (r+1)·R // W) (contiguous, within one row)."""
    if world_size < 1:
        raise InvalidArgumentError(f"world_size must be >= 1, got {world_size}")
    bounds = np.arange(world_size + 1, dtype=np.int64) * num_rows // world_size
    return np.repeat(np.arange(world_size, dtype=np.int64), np.diff(bounds))


def token_range(step: PackedStep, world_size: int, rank: int) -> tuple[int, int]:
    """Tokens [start, end) of the step's stream that rank `rank` gets under "tokens" (its rows'),
    the last rank's ending at the stream's end (its last row padded)."""
    if not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank must be in [0, {world_size}), got {rank}")
    total = int(step.sizes.sum())
    a = rank * step.num_rows // world_size
    b = (rank + 1) * step.num_rows // world_size
    return min(a * step.seq_len, total), min(b * step.seq_len, total)


def deal_attention(row_cost: np.ndarray, world_size: int) -> np.ndarray:
    """The rank of each row, dealt to even out the ranks' attention costs with every rank holding
    floor(R/W) or ceil(R/W) rows: the rows by cost (largest first, ties by index), dealt in rounds
    of W — each round's rows, largest first, to the ranks least loaded so far (ties by rank), one
    each. (LPT in rounds: the cardinality bound holds by construction, and each round is a few
    numpy calls, not a Python loop a row: every rank's server deals every step.)"""
    if world_size < 1:
        raise InvalidArgumentError(f"world_size must be >= 1, got {world_size}")
    cost = np.asarray(row_cost, dtype=np.float64)
    rows = len(cost)
    order = np.lexsort((np.arange(rows), -cost))
    out = np.empty(rows, dtype=np.int64)
    load = np.zeros(world_size)
    ranks = np.arange(world_size)
    for start in range(0, rows, world_size):
        taken = order[start : start + world_size]
        least = np.lexsort((ranks, load))[: len(taken)]
        out[taken] = least
        load[least] += cost[taken]
    return out


# --- several steps at once (a server plans the steps whose costs it read together) -------------------
def pack_steps(sizes: np.ndarray, counts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """`pack_step` of several steps in one pass: `sizes` their documents one step after the other,
    `counts` each step's number of documents. Returns (each step's rows, the row costs of every
    step's rows one step after the other) — pack_step's, step by step. The steps' streams are laid
    end to end, each starting on a row of its own; the padding of each step's last row is cut as
    one more chunk and its cost taken off again (every cost is a whole number below 2^53: exact)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if seq_len < 1:
        raise InvalidArgumentError(f"seq_len must be >= 1, got {seq_len}")
    if np.any(sizes < 1):
        raise InvalidArgumentError("every document holds one token at least (its EOS)")
    ends = np.cumsum(sizes)
    at = np.concatenate([[0], ends])  # where each document starts, and the end
    stop = np.cumsum(counts)
    first = at[stop - counts]  # each step's first token in `ends`
    tokens = at[stop] - first
    rows = -(-tokens // seq_len)
    row0 = np.cumsum(rows) - rows  # each step's first row
    if not rows.sum():
        return rows, np.zeros(0)
    cuts = np.concatenate(
        [ends + np.repeat(row0 * seq_len - first, counts), np.arange(seq_len, int(rows.sum()) * seq_len + 1, seq_len)]
    )
    cuts.sort()
    length = np.diff(cuts, prepend=0)
    n = int(rows.sum())  # (a chunk of length 0 may start at the end of the last row: cost 0, left out)
    cost = np.bincount((cuts - length) // seq_len, weights=length.astype(np.float64) ** 2, minlength=n)[:n]
    last = (row0 + rows - 1)[rows > 0]
    pad = (rows * seq_len - tokens)[rows > 0]
    cost[last] -= pad.astype(np.float64) ** 2
    return rows, cost


def deal_tokens_steps(rows: np.ndarray, world_size: int) -> np.ndarray:
    """`deal_tokens` of several steps (`rows`: each one's), one step's ranks after the other."""
    if world_size < 1:
        raise InvalidArgumentError(f"world_size must be >= 1, got {world_size}")
    rows = np.asarray(rows, dtype=np.int64)
    bounds = np.arange(world_size + 1, dtype=np.int64) * rows[:, None] // world_size
    ranks = np.tile(np.arange(world_size, dtype=np.int64), len(rows))
    return np.repeat(ranks, np.diff(bounds, axis=1).ravel())


def deal_attention_steps(row_cost: np.ndarray, rows: np.ndarray, world_size: int) -> np.ndarray:
    """`deal_attention` of several steps (`row_cost`: their rows' costs one step after the other,
    `rows`: each step's number), one step's ranks after the other: the same rounds, each a few numpy
    calls for all the steps (a step of fewer rounds deals rows of cost 0 to no one: its loads stay)."""
    if world_size < 1:
        raise InvalidArgumentError(f"world_size must be >= 1, got {world_size}")
    cost = np.asarray(row_cost, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.int64)
    n, k = len(cost), len(rows)
    out = np.empty(n + 1, dtype=np.int64)  # out[n]: where the rows a step has not are dealt
    if not n:
        return out[:n]
    step = np.repeat(np.arange(k), rows)
    order = np.lexsort((np.arange(n), -cost, step))  # by step, then largest first, ties by index
    at = np.arange(n) - (np.cumsum(rows) - rows)[step]  # each row's place in its step's order
    rounds = -(-int(rows.max()) // world_size)
    deal = np.full((k, rounds * world_size), n, dtype=np.int64)  # step j's rows in the order dealt
    deal[step, at] = order  # (order keeps the steps in order: step[order] == step)
    dealt_cost = np.zeros(deal.shape)
    dealt_cost[step, at] = cost[order]
    load = np.zeros(k * world_size)  # step j's rank r: load[j * W + r]
    first = np.arange(0, k * world_size, world_size)[:, None]
    for start in range(0, rounds * world_size, world_size):
        least = np.argsort(load.reshape(k, world_size), axis=1, kind="stable")  # ties by rank
        out[deal[:, start : start + world_size]] = least
        load[first + least] += dealt_cost[:, start : start + world_size]
    return out[:n]


def unbalanced_rows(sizes: np.ndarray, world_size: int, seq_len: int) -> list[PackedStep]:
    """balance=None with packing: rank r packs its own slice of the step's documents (the slices of
    `StepLayout.rank_range`) — for comparisons."""
    n = len(sizes)
    bounds = [r * n // world_size for r in range(world_size + 1)]
    return [pack_step(sizes[bounds[r] : bounds[r + 1]], seq_len) for r in range(world_size)]


def rank_costs(step: PackedStep, ranks: np.ndarray, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, attention cost) per rank of a dealt step."""
    rows = np.bincount(ranks, minlength=world_size)
    cost = np.bincount(ranks, weights=step.row_cost, minlength=world_size)
    return rows, cost


# --- unpacked samples by a cost column ---------------------------------------------------------------
def partition_costs(costs: np.ndarray | list[float], world_size: int) -> np.ndarray:
    """The rank of each sample: the samples by cost (largest first, ties by index), each to the
    cheapest rank so far (ties by rank) — LPT, whose largest rank is within 4/3 of the optimum and,
    for the many-small-samples steps of training, within one sample's cost of the mean."""
    if world_size < 1:
        raise InvalidArgumentError(f"world_size must be >= 1, got {world_size}")
    values = np.asarray(costs, dtype=np.float64)
    if len(values) and (not np.all(np.isfinite(values)) or np.any(values < 0)):
        raise InvalidArgumentError("balance costs must be finite and not negative")
    order = np.lexsort((np.arange(len(values)), -values))
    out = np.empty(len(values), dtype=np.int64)
    heap = [(0.0, r) for r in range(world_size)]
    for i in order.tolist():
        cost, r = heapq.heappop(heap)
        out[i] = r
        heapq.heappush(heap, (cost + float(values[i]), r))
    return out
