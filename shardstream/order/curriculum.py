"""Mixture phases (curriculum, DESIGN §7): mixture weights that change at job positions, pure and seeded.

    [(0, {"web@3": 0.7, "code@1": 0.3}), (2_000_000, {"web@3": 0.5, "code@1": 0.3, "math@2": 0.2})]
    "0=web@3:0.7,code@1:0.3;2000000=web@3:0.5,code@1:0.3,math@2:0.2"

One mixture stream (mixture.py) whose weights change at stream positions g = epoch·L + p — the job
position of schedule.py, so batch-size phases, skip ranges and mixture phases share one axis. The
sources are every dataset any phase names (in order of first appearance); a source a phase does not
name has weight 0 there. L (samples per mixture epoch) defaults to all of their rows.

A phase starts at the first schedule block boundary at or after its position (blocks of S samples,
default 1000), so every block belongs to one phase and holds exactly that phase's allocation of S:
proportions stay exact over every block, and two phases may not start in one block. Inside phase i
the blocks are those of a plain MixturePlan over the phase's sources and weights (block numbers
counted from the start of the stream, so each phase has its own slots), and source s's k-th sample
of the stream — counted across phases: `base_i[s]` samples before phase i, `alloc_i[s]` per block in
it — is sample k mod N_s of the source's epoch k div N_s. So **each source keeps its own epoch
counter and order across phases**: within a source epoch no sample repeats or is lost, whatever the
weights do. position -> (source, source epoch, source position) is a bisection over the phases
(O(log phases)) plus the block's slots, as for a plain mixture (loadtest/schedule_bench.py).

A schedule of one phase at 0 is not a MixtureSchedule: it is the plain mixture (`parse_mixture_schedule`
returns it as such), with its fingerprint and order. `fingerprint` names the sources, S, L and the
phases (a state is refused on another schedule); `content` only the sources, S and L — what a state
may move between with `load_state_dict(state, schedule="new")`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from shardstream.errors import InvalidArgumentError
from shardstream.limits import MAX_POSITION, check_int, shown
from shardstream.order.mixture import MixturePlan, SourceInfo, parse_mixture

__all__ = [
    "MAX_MIXTURE_PHASES",
    "MixtureSchedule",
    "is_mixture_schedule",
    "parse_mixture_schedule",
    "schedule_sources",
]

MAX_MIXTURE_PHASES = 1024
_DIGITS = re.compile(r"[0-9]+", re.ASCII)  # str.isdigit() also takes '²', which int() refuses


def is_mixture_schedule(dataset: object) -> bool:
    """A list of (offset, mixture) phases, or the string form 'OFFSET=MIXTURE;...'."""
    if isinstance(dataset, str):
        return "=" in dataset
    return (
        isinstance(dataset, Sequence)
        and bool(dataset)
        and all(
            isinstance(p, Sequence) and not isinstance(p, str) and len(p) == 2 and isinstance(p[0], int)
            for p in dataset
        )
    )


def parse_mixture_schedule(spec: object) -> list[tuple[int, list[tuple[str, float]]]]:
    """[(offset, [(ref, weight)])] from phases or 'OFFSET=a@1:0.7,b@2:0.3;OFFSET=...'; one clear
    error per mistake. Offsets start at 0 and increase; each phase is a mixture (mixture.parse_mixture)."""
    if isinstance(spec, str):
        items: list[tuple[object, object]] = []
        for part in spec.split(";"):
            start, sep, mix = part.strip().partition("=")
            if not sep or not _DIGITS.fullmatch(start.strip()) or len(start.strip()) > 20:
                raise InvalidArgumentError(
                    f"mixture phase {part.strip()[:80]!r} is not 'OFFSET=NAME@V:WEIGHT,...' (OFFSET in ASCII digits)"
                )
            items.append((int(start), mix.strip()))
        spec = items
    if not is_mixture_schedule(spec):
        raise InvalidArgumentError(
            f"a mixture schedule is a list of (offset, {{dataset: weight}}) phases, got {shown(spec)}"
        )
    assert isinstance(spec, Sequence)
    out: list[tuple[int, list[tuple[str, float]]]] = []
    for i, (start, mix) in enumerate(spec):
        check_int(f"the offset of mixture phase {i}", start, 0, MAX_POSITION)
        if out and start <= out[-1][0]:
            raise InvalidArgumentError(
                f"mixture phases must start at increasing offsets, got {out[-1][0]} then {start}"
            )
        out.append((start, parse_mixture(mix)))  # type: ignore[arg-type]
    if out[0][0] != 0:
        raise InvalidArgumentError(f"the first mixture phase must start at offset 0, got {out[0][0]}")
    if len(out) > MAX_MIXTURE_PHASES:
        raise InvalidArgumentError(f"at most {MAX_MIXTURE_PHASES} mixture phases, got {len(out)}")
    return out


def schedule_sources(
    phases: Sequence[tuple[int, Sequence[tuple[str, float]]]],
) -> tuple[list[str], list[tuple[int, list[float]]]]:
    """(every ref any phase names, in order of first appearance; each phase's weights over them)."""
    refs: list[str] = []
    for _, mix in phases:
        refs += [r for r, _ in mix if r not in refs]
    return refs, [(start, [dict(mix).get(r, 0.0) for r in refs]) for start, mix in phases]


class MixtureSchedule:
    """Stream position -> (source, source epoch, source position) for mixture phases (module docstring).

    `sources`: every source (their `weight` is not used); `phases`: [(position, weights)], weights
    aligned with `sources`, >= 0 with at least one > 0 per phase. Same interface as MixturePlan
    (`locate`, `sources`, `epoch_samples`, `block_size`, `seed`, `fingerprint`, `label`)."""

    def __init__(
        self,
        sources: Sequence[SourceInfo],
        phases: Sequence[tuple[int, Sequence[float]]],
        seed: int,
        block_size: int = 0,
        epoch_samples: int = 0,
    ) -> None:
        # checks the rows, S >= sources; the defaults of S and L (the sources' weights are not used)
        probe = MixturePlan([replace(x, weight=1.0) for x in sources], seed, block_size, epoch_samples)
        self.sources = list(sources)
        self.seed = seed
        self.block_size = s = probe.block_size
        self.epoch_samples = probe.epoch_samples
        if not phases or phases[0][0] != 0:
            raise InvalidArgumentError("the first mixture phase must start at offset 0")
        if len(phases) > MAX_MIXTURE_PHASES:
            raise InvalidArgumentError(f"at most {MAX_MIXTURE_PHASES} mixture phases, got {len(phases)}")
        self.requested = [(int(start), tuple(float(w) for w in ws)) for start, ws in phases]
        self.first_blocks: list[int] = []  # the block each phase starts at
        self._plans: list[MixturePlan] = []
        self._active: list[np.ndarray] = []  # phase -> its sources' indexes among all
        self._alloc: list[np.ndarray] = []  # phase -> samples per block of each source (all sources)
        for start, weights in self.requested:
            if len(weights) != len(self.sources):
                raise InvalidArgumentError(
                    f"the mixture phase at {start} has {len(weights)} weights for {len(self.sources)} sources"
                )
            bad = [w for w in weights if not math.isfinite(w) or w < 0]
            if bad or not any(weights):
                raise InvalidArgumentError(
                    f"the mixture phase at {start}: weights must be finite, >= 0 and not all 0, got {list(weights)}"
                )
            block = -(-start // s)
            if self.first_blocks and block <= self.first_blocks[-1]:
                raise InvalidArgumentError(
                    f"mixture phases at {self.requested[len(self.first_blocks) - 1][0]} and {start} start in the "
                    f"same schedule block of {s} samples (a phase starts at the next block boundary)"
                )
            active = [i for i, w in enumerate(weights) if w > 0]
            plan = MixturePlan(
                [
                    SourceInfo(
                        self.sources[i].ref, self.sources[i].fingerprint, self.sources[i].num_rows, weights[i]
                    )
                    for i in active
                ],
                seed,
                s,
                self.epoch_samples,
            )
            alloc = np.zeros(len(self.sources), dtype=np.int64)
            alloc[active] = plan.alloc
            self.first_blocks.append(block)
            self._plans.append(plan)
            self._active.append(np.asarray(active, dtype=np.int64))
            self._alloc.append(alloc)
        # base[i][s]: source s's samples in the stream before phase i
        self._base = [np.zeros(len(self.sources), dtype=np.int64)]
        for i in range(1, len(self._plans)):
            blocks = self.first_blocks[i] - self.first_blocks[i - 1]
            self._base.append(self._base[-1] + blocks * self._alloc[i - 1])
        self._rows = np.asarray([src.num_rows for src in self.sources], dtype=np.int64)
        self._first_blocks = np.asarray(self.first_blocks, dtype=np.int64)
        self.content = _sha(
            {
                "sources": [x.fingerprint for x in self.sources],
                "block": s,
                "epoch_samples": self.epoch_samples,
            }
        )
        self.fingerprint = _sha(
            {
                "content": self.content,
                "phases": [[start, [repr(w) for w in ws]] for start, ws in self.requested],
            }
        )

    @property
    def phase_starts(self) -> list[int]:
        """Where each phase takes effect: its requested position rounded up to a block boundary."""
        return [b * self.block_size for b in self.first_blocks]

    @property
    def label(self) -> str:
        """'0=a@1:0.7,b@2:0.3;2000000=...' (parse_mixture_schedule reads it back)."""
        return ";".join(
            f"{start}="
            + ",".join(f"{src.ref}:{w:g}" for src, w in zip(self.sources, ws, strict=True) if w > 0)
            for start, ws in self.requested
        )

    def phase_at(self, position: int) -> int:
        """The index of the phase stream position `position` is in."""
        return int(np.searchsorted(self._first_blocks, position // self.block_size, side="right") - 1)

    def weights_at(self, position: int) -> dict[str, float]:
        """{source ref: weight} of the phase in effect at `position` (sources it names)."""
        _, weights = self.requested[self.phase_at(position)]
        return {src.ref: w for src, w in zip(self.sources, weights, strict=True) if w > 0}

    def taken_before(self, position: int) -> np.ndarray:
        """How many samples of each source the stream holds before `position` (each source's
        counter: source epoch = count div N_s)."""
        i = self.phase_at(position)
        block, inner = divmod(position, self.block_size)
        out = self._base[i] + (block - self.first_blocks[i]) * self._alloc[i]
        if inner:
            src, _ = self._plans[i]._block(block)
            out = out + np.bincount(self._active[i][src[:inner]], minlength=len(self.sources))
        return out

    def position_of(self, source: int, count: int) -> int | None:
        """The stream position of source `source`'s `count`-th sample (counted across phases and
        source epochs), None when the stream never takes that many of it (later phases leave it out).
        `locate` inverted: O(phases) plus one block."""
        for i in range(len(self._plans)):
            alloc = int(self._alloc[i][source])
            end = int(self._base[i + 1][source]) if i + 1 < len(self._plans) else None
            if alloc == 0 or count < int(self._base[i][source]) or (end is not None and count >= end):
                continue
            b, k = divmod(count - int(self._base[i][source]), alloc)
            block = self.first_blocks[i] + b
            local, rank = self._plans[i]._block(block)
            (hit,) = np.flatnonzero((self._active[i][local] == source) & (rank == k))
            return block * self.block_size + int(hit)
        return None

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source index, source epoch, source position) for positions of mixture epoch `epoch`."""
        p = np.asarray(positions, dtype=np.int64)
        g = np.int64(epoch) * np.int64(self.epoch_samples) + p
        block, inner = np.divmod(g, self.block_size)
        src = np.empty_like(inner)
        count = np.empty_like(inner)
        for b in np.unique(block):
            sel = block == b
            i = int(np.searchsorted(self._first_blocks, b, side="right") - 1)
            local, rank = self._plans[i]._block(int(b))
            s = self._active[i][local[inner[sel]]]
            src[sel] = s
            count[sel] = self._base[i][s] + (b - self.first_blocks[i]) * self._alloc[i][s] + rank[inner[sel]]
        source_epoch, source_pos = np.divmod(count, self._rows[src])
        return src, source_epoch, source_pos

    def describe(self) -> list[dict[str, object]]:
        """JSON-safe phases: requested position, where it takes effect, weights by source."""
        return [
            {
                "offset": start,
                "starts_at": b * self.block_size,
                "weights": {x.ref: w for x, w in zip(self.sources, ws, strict=True) if w > 0},
            }
            for (start, ws), b in zip(self.requested, self.first_blocks, strict=True)
        ]


def _sha(obj: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()
