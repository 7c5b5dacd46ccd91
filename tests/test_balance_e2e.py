"""balance="tokens" through real servers: packed rows dealt across ranks — every rank of a step within
one row of the others (or the same with pad_rows), every token of every document exactly once per
epoch with the labels and positions of the whole document, the step's token counts for loss
weighting, and a resume at another world size; one-line errors for what cannot be balanced."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shardstream.client import Loader
from shardstream.errors import DataLossError, InvalidArgumentError

from .support import media
from .support.servers import Servers

EOS = 256  # the byte tokenizer's
DOCS = 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    root = tmp_path_factory.mktemp("balance") / "root"
    rng = np.random.default_rng(11)
    texts = [t[: int(rng.lognormal(4.5, 1.2)) + 1] for _, t in media.python_sources(DOCS)]  # a heavy tail
    data = [t.encode("utf-8") for t in texts]
    tokens = pa.array([list(b) for b in data], pa.list_(pa.int32()))  # pre-tokenized: the bytes
    table = pa.table({"text": texts, "n_tokens": pa.array([len(b) for b in data], pa.int32()), "tokens": tokens})
    media.write_table(root, "docs", table, row_group_rows=7, shard_rows=21)
    # a count off by one each way, in documents long enough to be cut between rows
    long = [i for i, b in enumerate(data) if len(b) > 100][:2]
    wrong = [len(b) + (1 if i == long[0] else -1 if i == long[1] else 0) for i, b in enumerate(data)]
    media.write_table(root, "miscounted", table.set_column(1, "n_tokens", pa.array(wrong, pa.int32())), row_group_rows=7, shard_rows=21)
    return root, data


@pytest.fixture(scope="module")
def endpoint(corpus: tuple[Path, list[bytes]]) -> Iterator[str]:
    with Servers(corpus[0]) as servers:
        yield servers.start().target


def _transforms(seq_len: int, lengths: str | None = "n_tokens", column: str = "text") -> list[dict[str, Any]]:
    """Tokenized by the request from "text", or packed from the dataset's token lists ("tokens":
    the reader takes only the tokens a rank's rows hold)."""
    pack: dict[str, Any] = {"op": "text.pack", "seq_len": seq_len}
    if lengths:
        pack["lengths"] = lengths
    if column == "tokens":
        return [{**pack, "column": "tokens", "eos_id": EOS}]
    return [{"op": "text.tokenize", "tokenizer": "bytes"}, pack]


def _read(
    endpoint: str, world: int, batch: int, seq_len: int, mode: str = "tokens", column: str = "text", dataset: str = "docs", **extra: Any
) -> dict[int, dict[int, Any]]:
    """step -> rank -> (batch, BatchInfo) of one epoch, every rank read in turn."""
    out: dict[int, dict[int, Any]] = defaultdict(dict)
    for rank in range(world):
        with Loader(
            [endpoint], dataset, batch_size=batch, rank=rank, world_size=world, seed=5, columns=[column],
            transforms=_transforms(seq_len, column=column), balance=mode, **extra,
        ) as loader:  # fmt: skip
            for b in loader:
                info = loader.last_batch
                out[info.step][rank] = (b, info)
    return out


def _tokens_once(data: list[bytes], batches: list[tuple[dict[str, Any], Any]], order_of: dict[int, int]) -> None:
    """Every token of every document exactly once, with its document's labels and positions."""
    seen: dict[int, list[int]] = defaultdict(list)
    for b, _ in batches:
        ids, labels, pos, doc = (np.asarray(b[k]).reshape(-1) for k in ("input_ids", "labels", "position_ids", "document_ids"))
        real = doc >= 0
        for d in np.unique(doc[real]):
            mask = doc == d
            tokens = list(data[order_of[int(d)]]) + [EOS]
            for i, p in zip(np.nonzero(mask)[0].tolist(), pos[mask].tolist(), strict=True):
                assert ids[i] == tokens[p]
                assert labels[i] == (tokens[p + 1] if p + 1 < len(tokens) else -100)
                seen[int(d)].append(p)
    assert sorted(seen) == sorted(order_of)  # every document
    for d, positions in seen.items():
        assert sorted(positions) == list(range(len(data[order_of[d]]) + 1)), d  # every token once


def _attention(batch: dict[str, Any]) -> float:
    doc = np.asarray(batch["document_ids"])
    total = 0.0
    for row in doc:
        _, counts = np.unique(row[row >= 0], return_counts=True)
        total += float((counts.astype(np.float64) ** 2).sum())
    return total


def test_attention_deals_rows_to_even_out_attention_cost(endpoint: str) -> None:
    worst = {}
    for mode in ("tokens", "attention"):
        steps = _read(endpoint, 4, 5, 64, mode)
        worst[mode] = sum(max(ranks[r][1].cost for r in ranks) for ranks in steps.values())
    assert worst["attention"] <= worst["tokens"]


def _order(endpoint: str, world: int, batch: int) -> dict[int, int]:
    """Global position -> dataset row, from an unpacked read with provenance (the same order)."""
    out = {}
    for rank in range(world):
        with Loader([endpoint], "docs", batch_size=batch, rank=rank, world_size=world, seed=5, columns=["n_tokens"], provenance=True) as loader:
            for b in loader:
                info = loader.last_batch
                rows = np.asarray(b["_row"]) + np.asarray([0, 21, 42])[np.asarray(b["_shard"])]
                for p, r in zip(range(info.position_start, info.position_end), rows.tolist(), strict=True):
                    out[p] = r
    return out


@pytest.mark.parametrize("column", ["text", "tokens"])
@pytest.mark.parametrize("mode", ["tokens", "attention"])
@pytest.mark.parametrize(("world", "batch", "seq_len"), [(2, 4, 64), (3, 5, 37), (4, 3, 128)])
def test_rows_within_one_and_every_token_once(
    endpoint: str, corpus: Any, mode: str, world: int, batch: int, seq_len: int, column: str
) -> None:
    _, data = corpus
    steps = _read(endpoint, world, batch, seq_len, mode, column)
    order_of = _order(endpoint, world, batch)
    step_labels = 0
    for step, ranks in steps.items():
        assert sorted(ranks) == list(range(world))
        step_labels += ranks[0][1].step_tokens
        rows = [len(ranks[r][0]["input_ids"]) for r in range(world)]
        assert max(rows) - min(rows) <= 1, (step, rows)
        infos = [ranks[r][1] for r in range(world)]
        assert len({i.step_tokens for i in infos}) == 1 and sum(i.tokens for i in infos) == infos[0].step_tokens
        for r in range(world):
            assert infos[r].tokens == int((np.asarray(ranks[r][0]["labels"]) != -100).sum())
            assert infos[r].cost == pytest.approx(_attention(ranks[r][0]))  # Σ chunk length² of its rows
        assert sum(i.cost for i in infos) == pytest.approx(infos[0].step_cost)
    _tokens_once(data, [v for ranks in steps.values() for v in ranks.values()], order_of)
    assert step_labels == sum(len(d) for d in data)  # every document's tokens predict their next, once


def test_pad_rows_gives_every_rank_the_same_shape(endpoint: str, corpus: Any) -> None:
    _, data = corpus
    steps = _read(endpoint, 3, 4, 48, pad_rows=True)
    for ranks in steps.values():
        shapes = {np.asarray(ranks[r][0]["input_ids"]).shape for r in range(3)}
        assert len(shapes) == 1, shapes
    _tokens_once(data, [v for ranks in steps.values() for v in ranks.values()], _order(endpoint, 3, 4))


def test_a_resume_at_another_world_size_delivers_every_token_once(endpoint: str, corpus: Any) -> None:
    _, data = corpus
    first = []
    states = []
    for rank in range(2):
        with Loader([endpoint], "docs", batch_size=4, rank=rank, world_size=2, seed=5, columns=["text"],
                    transforms=_transforms(40), balance="tokens") as loader:  # fmt: skip
            it = iter(loader)
            for _ in range(3):  # 3 global steps of 8 documents
                first.append((next(it), loader.last_batch))
            states.append(loader.state_dict())
    rest = []
    for rank in range(3):
        with Loader([endpoint], "docs", batch_size=4, rank=rank, world_size=3, seed=5, columns=["text"],
                    transforms=_transforms(40), balance="tokens") as loader:  # fmt: skip
            loader.load_state_dict(states[0])
            for b in loader:
                rest.append((b, loader.last_batch))
    assert min(i.global_start for _, i in rest) == 24
    order_of = _order(endpoint, 1, 4)
    _tokens_once(data, first + rest, order_of)


@pytest.mark.parametrize("mode", ["tokens", "attention"])
def test_a_wrong_token_count_is_data_loss_not_shifted_rows(endpoint: str, mode: str) -> None:
    """A document longer or shorter than its count fails the read on a rank whose rows hold its end
    (pre-tokenized: each rank takes only its tokens, one past a document's end to see a longer one)."""
    with pytest.raises(DataLossError, match="recompute the counts"):
        _read(endpoint, 3, 5, 37, mode, "tokens", dataset="miscounted")


def test_what_cannot_be_balanced_is_one_line(endpoint: str) -> None:
    with pytest.raises(InvalidArgumentError, match='"lengths"'):
        with Loader([endpoint], "docs", batch_size=4, columns=["text"], transforms=_transforms(64, None), balance="tokens") as loader:
            next(iter(loader))
    with pytest.raises(InvalidArgumentError, match="no integer column 'nope'"):
        with Loader([endpoint], "docs", batch_size=4, columns=["text"], transforms=_transforms(64, "nope"), balance="tokens") as loader:
            next(iter(loader))
    with pytest.raises(InvalidArgumentError, match="no numeric column 'text'"):
        with Loader([endpoint], "docs", batch_size=4, columns=["text"], balance={"cost": "text"}) as loader:
            next(iter(loader))
    with pytest.raises(InvalidArgumentError, match="text.pack"):
        Loader([endpoint], "docs", batch_size=4, columns=["text"], balance="tokens")
    with pytest.raises(InvalidArgumentError, match="balance="):
        Loader([endpoint], "docs", batch_size=4, columns=["text"], transforms=_transforms(64), balance="token")


def test_samples_partitioned_by_a_cost_column_each_once(endpoint: str) -> None:
    world, batch = 3, 6
    per_step: dict[int, dict[int, Any]] = defaultdict(dict)
    for rank in range(world):
        with Loader([endpoint], "docs", batch_size=batch, rank=rank, world_size=world, seed=5,
                    columns=["n_tokens"], provenance=True, balance={"cost": "n_tokens"}) as loader:  # fmt: skip
            for b in loader:
                per_step[loader.last_batch.step][rank] = (b, loader.last_batch)
    order_of = _order(endpoint, 1, batch)
    seen = []
    for ranks in per_step.values():
        costs = [float(np.asarray(ranks[r][0]["n_tokens"]).sum()) for r in range(world)]
        infos = [ranks[r][1] for r in range(world)]
        assert [i.cost for i in infos] == pytest.approx(costs) and sum(costs) == pytest.approx(infos[0].step_cost)
        step_costs = [float(c) for r in range(world) for c in np.asarray(ranks[r][0]["n_tokens"])]
        assert max(costs) <= sum(costs) / world + max(step_costs) + 1e-9  # LPT's bound
        for r in range(world):
            b = ranks[r][0]
            rows = np.asarray(b["_row"]) + np.asarray([0, 21, 42])[np.asarray(b["_shard"])]
            seen.extend(rows.tolist())
    assert sorted(seen) == sorted(order_of.values())  # every sample of the epoch exactly once
