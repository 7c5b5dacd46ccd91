"""Ray Data: write, checksum and register dataset versions, and read them (`pip install 'shardstream[ray]'`).

    import ray, shardstream.engines.ray_io

    sink = shardstream.engines.ray_io.Datasink("/data/registry", "web")
    ds.write_datasink(sink)                     # prints web@4; sink.ref == "web@4"
    ds = shardstream.engines.ray_io.read("/data/registry", "web@3", columns=["text"])      # from the files
    ds = shardstream.engines.ray_io.read("srv-a:7070", "web@3", columns=["text"])          # through the fleet

`Datasink` writes each write task's blocks as one Parquet file under `ROOT/NAME/data/` with the
settings `ingest` uses (row groups of about `target_row_group_bytes`, Parquet page checksums) and
computes its sha256 and row-group checksums in that task, from the bytes it just wrote; when every
task is done, the driver registers the version from the tasks' entries, reading no file again
(`on_write_complete`). Bad data reported by a task fails the write naming the file, and its files
are removed. `rows_per_file` bundles at least that many rows into each write task (Ray's own block
sizes otherwise).

`read` makes a `ray.data.Dataset` of a version for analysis and offline jobs (training reads through
the fleet, with a Loader). From a root (a local directory or s3://): one read task per run of
consecutive row groups, each read and checked exactly as a server reads it (footer and column-chunk
checksums: a damaged shard is DataLossError naming it). From servers (`host:port`, `dns:///…` or a
list of them): each read task is one rank of a Loader (shuffle "none", one epoch), so the fleet
does the reading, and the rows come in the Loader's step order.

This module runs the server's writer and checksum code inside Ray's tasks (shardstream.server.writing.bulk),
so the workers' Python needs `shardstream[server,ray]`; tasks reach the root as the driver does.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import ray
import ray.data
from ray.data.block import Block, BlockAccessor, BlockMetadata
from ray.data.datasource import ReadTask

from shardstream.errors import InvalidArgumentError
from shardstream.manifest import Manifest
from shardstream.server.backends.roots import open_registry
from shardstream.server.writing.bulk import (
    DEFAULT_ROW_GROUP_BYTES,
    check_columns,
    prepare_write,
    read_row_groups,
    register_parts,
    remove_write,
    task_root,
    write_part,
)
from shardstream.server.writing.materialize import MaterializeJob, materialize_shard

__all__ = ["Datasink", "materialize_runner", "read"]

_ENDPOINT = re.compile(r"^(dns:///)?[A-Za-z0-9.\-\[\]:]+:[0-9]+\Z")


class Datasink(ray.data.Datasink[list[dict[str, Any]]]):
    """A Ray Data sink that writes the next version of `name` under `root` (see the module docstring).

    The latest version is checked when the sink is made (an unreadable one: DataLossError before any
    task runs); `change`, `schema` and `metadata` are as in `shardstream.engines.spark_io.write_dataset`.
    After `ds.write_datasink(sink)`, `sink.ref` is NAME@VERSION and `sink.manifest` the manifest.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        name: str,
        *,
        change: str | None = None,
        target_row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        row_group_rows: int | None = None,
        rows_per_file: int | None = None,
        schema: pa.Schema | None = None,
        metadata: Mapping[str, Any] | None = None,
        s3_endpoint: str | None = None,
        quiet: bool = False,
    ) -> None:
        self._spec = prepare_write(
            root,
            name,
            change=change,
            schema=schema,
            row_group_bytes=target_row_group_bytes,
            row_group_rows=row_group_rows,
            s3_endpoint=s3_endpoint,
        )
        self._change = change
        self._rows_per_file = rows_per_file
        self._metadata = {"source": "ray", **dict(metadata or {})}
        self._quiet = quiet
        self.manifest: Manifest | None = None

    @property
    def ref(self) -> str | None:
        return None if self.manifest is None else self.manifest.ref

    @property
    def min_rows_per_write(self) -> int | None:
        return self._rows_per_file

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        if schema is not None:
            check_columns(schema.names)

    def write(self, blocks: Iterable[Block], ctx: Any) -> list[dict[str, Any]]:
        batches = (b for block in blocks for b in BlockAccessor.for_block(block).to_arrow().to_batches())
        return write_part(self._spec, ctx.task_idx, batches)

    def on_write_complete(self, write_result: Any) -> None:
        parts = [p for returned in write_result.write_returns if returned for p in returned]
        spec = self._spec
        with open_registry(spec.root, s3_endpoint=spec.s3_endpoint) as registry:
            self.manifest = register_parts(
                registry, spec.name, parts, change=self._change, metadata=self._metadata, keep_parent=True
            )
        if not self._quiet:
            print(self.manifest.ref, flush=True)

    def on_write_failed(self, error: Exception) -> None:
        remove_write(
            self._spec.root, self._spec.name, self._spec.write_id, s3_endpoint=self._spec.s3_endpoint
        )


# --- read ----------------------------------------------------------------------------------------
def _read_groups(
    root: str, s3_endpoint: str | None, ref: str, groups: list[tuple[int, int]], columns: list[str]
) -> Iterator[pa.Table]:
    """The row groups `groups` ((shard, group), in order) of version `ref`, checked as a server reads them."""
    with open_registry(root, s3_endpoint=s3_endpoint) as registry:
        m = registry.resolve(ref)
        for shard, run in itertools.groupby(groups, key=lambda sg: sg[0]):
            for _, table in read_row_groups(registry, m, shard, columns, [g for _, g in run]):
                yield table


class _VersionDatasource(ray.data.Datasource):
    """A version's row groups from its files, in runs of consecutive ones per read task."""

    def __init__(self, root: str, ref: str, columns: Sequence[str] | None, s3_endpoint: str | None) -> None:
        self._root = task_root(root)
        self._s3 = s3_endpoint
        with open_registry(self._root, s3_endpoint=s3_endpoint) as registry:
            self._m = registry.resolve(ref)
        names = self._m.schema.names
        unknown = [c for c in columns or () if c not in names]
        if unknown:
            raise InvalidArgumentError(
                f"unknown column(s) {unknown} in {self._m.ref}; columns are: {', '.join(names)}"
            )
        self._columns = list(columns) if columns else list(names)
        self._schema = pa.schema([self._m.schema.field(c) for c in self._columns])

    def get_name(self) -> str:
        return "ShardstreamVersion"

    def estimate_inmemory_data_size(self) -> int | None:
        return self._m.num_bytes

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        m = self._m
        groups = [
            (s, g, rows, shard.bytes * rows // max(1, shard.rows))
            for s, shard in enumerate(m.shards)
            for g, rows in enumerate(shard.row_groups)
        ]
        if not groups:
            return []
        n = max(1, min(parallelism if parallelism > 0 else len(groups), len(groups)))
        bounds = [len(groups) * i // n for i in range(n + 1)]
        tasks = []
        root, s3, ref, columns = self._root, self._s3, m.ref, self._columns
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            run = groups[a:b]
            pairs = [(s, g) for s, g, _, _ in run]
            meta = BlockMetadata(
                num_rows=sum(r for _, _, r, _ in run),
                size_bytes=int(sum(nb for _, _, _, nb in run)),
                input_files=None,
                exec_stats=None,
            )

            def read_fn(pairs: list[tuple[int, int]] = pairs) -> Iterator[pa.Table]:
                return _read_groups(root, s3, ref, pairs, columns)

            tasks.append(ReadTask(read_fn, meta, schema=self._schema, per_task_row_limit=per_task_row_limit))
        return tasks


class _FleetDatasource(ray.data.Datasource):
    """A version read through shard-reader servers: read task i is rank i of a Loader."""

    def __init__(
        self, endpoints: list[str], ref: str, columns: Sequence[str] | None, batch_size: int, ranks: int
    ) -> None:
        self._endpoints = endpoints
        self._ranks = ranks
        self._ref = ref
        self._columns = list(columns) if columns else None
        self._batch_size = batch_size

    def get_name(self) -> str:
        return "ShardstreamFleet"

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        world = self._ranks  # Ray's own parallelism guess would start that many Loaders
        endpoints, ref, columns, batch = self._endpoints, self._ref, self._columns, self._batch_size
        tasks = []
        for rank in range(world):

            def read_fn(rank: int = rank) -> Iterator[pa.Table]:
                from shardstream.client import Loader

                with Loader(
                    endpoints,
                    ref,
                    batch_size=batch,
                    rank=rank,
                    world_size=world,
                    shuffle=False,
                    columns=columns,
                    epochs=1,
                    output="arrow",
                ) as loader:
                    for b in loader:
                        yield pa.Table.from_batches([b])

            meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
            tasks.append(ReadTask(read_fn, meta, per_task_row_limit=per_task_row_limit))
        return tasks


def _endpoints(root_or_server: Any) -> list[str] | None:
    if isinstance(root_or_server, list | tuple):
        return [str(e) for e in root_or_server]
    text = os.fspath(root_or_server)
    if text.startswith("s3://") or os.path.exists(text):
        return None
    return [text] if _ENDPOINT.match(text) else None


def read(
    root_or_server: str | os.PathLike[str] | Sequence[str],
    dataset: str,
    *,
    columns: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    batch_size: int = 1024,
    s3_endpoint: str | None = None,
) -> ray.data.Dataset:
    """A `ray.data.Dataset` of version `dataset` (NAME@VERSION, NAME or NAME@TAG, pinned now): from the
    files under a root, or through servers (`host:port`, `dns:///host:port` or a list); see the
    module docstring. `override_num_blocks` sets the number of read tasks (through servers: ranks;
    default 1); `batch_size` is a rank's batch through servers."""
    endpoints = _endpoints(root_or_server)
    if endpoints is not None:
        source: ray.data.Datasource = _FleetDatasource(
            endpoints, dataset, columns, batch_size, override_num_blocks or 1
        )
    else:
        source = _VersionDatasource(os.fspath(root_or_server), dataset, columns, s3_endpoint)  # type: ignore[arg-type]
    return ray.data.read_datasource(source, override_num_blocks=override_num_blocks)


def materialize_runner() -> Any:
    """A `materialize` runner: one Ray task per source shard (`ray.init()` first unless connected:
    RAY_ADDRESS joins a cluster)."""

    def run(job: MaterializeJob) -> list[dict[str, Any]]:
        if not ray.is_initialized():
            ray.init()
        task = ray.remote(materialize_shard)
        out: list[dict[str, Any]] = []
        for parts in ray.get([task.remote(job, i) for i in range(job.shards)]):
            out += parts
        return out

    return run
