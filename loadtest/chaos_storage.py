"""Faults of data and network: S3 answering errors, cutting bodies and lagging; a blackholed server;
corrupt bytes in a shard and in the servers' disk cache.

Each function runs one fault against real processes (Ctx) and returns its row (chaos_ctx.row).
"""

from __future__ import annotations

import contextlib
import random
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from shardstream.client import Loader
from shardstream.server.backends.roots import open_registry
from shardstream.server.local_fleet import LocalServer

from .chaos_ctx import Ctx, Row, row, start_all
from .chaos_net import Blackhole, S3Faults, data_port_behind, free_port
from .fleet import scrape

__all__ = ["blackhole", "corrupt_disk_cache", "corrupt_shard", "s3_faults"]

S3_METRICS = ("shardstream_s3_body_resumes_total", "shardstream_storage_reads_total")
CACHE_METRICS = (
    "shardstream_disk_cache_corrupt_total",
    "shardstream_disk_cache_hits_total",
    "shardstream_storage_reads_total",
)


def s3_faults(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """Two servers read SeaweedFS through S3Faults: a share of GETs answered 503/500, cut mid-body or
    delayed. A small row-group cache (--cache-mib 1) keeps the servers reading from S3 all along."""
    s = ctx.sizes
    server, root = ctx.s3()
    port = int(server.endpoint.rsplit(":", 1)[1])
    ref = ctx.vector_dataset(
        s.s3_rows, s.s3_row_group_rows, dim=s.s3_dim, root=root, s3_endpoint=server.endpoint
    )
    proxy = stack.enter_context(
        S3Faults(
            port,
            error_ratio=s.s3_error_ratio,
            cut_ratio=s.s3_cut_ratio,
            spike_ratio=s.s3_spike_ratio,
            spike_s=s.s3_spike_s,
            seed=s.seed,
        )
    )
    args = ("--s3-endpoint", proxy.endpoint, "--cache-mib", "1")
    servers = ctx.servers(stack, 2, root=root, args=args, env=server.env())
    epochs = 2
    job = ctx.job(
        "s3",
        ctx.trainer([x.target for x in servers], ref, world_size=2, epochs=epochs, step_ms=0.0),
        ctx.plan(ref, epochs, root=root),
    )
    stack.callback(job.kill)
    job.start(ctx.groups(2)).wait_exit()
    metrics = [scrape(x, S3_METRICS) for x in servers]
    counts = dict(proxy.counts)
    gets = counts.get("get", 0)
    injected = counts.get("error_503", 0) + counts.get("error_500", 0)
    schedule = [] if injected and counts.get("cut") else [f"faults not injected: {counts}"]
    load = (
        f"2 ranks x {epochs} epochs of {s.s3_rows:,} rows on SeaweedFS, 2 servers; of {gets} GETs "
        f"{injected} answered 503/500, {counts.get('cut', 0)} cut, {counts.get('spike', 0)} delayed {s.s3_spike_s:g} s"
    )
    return row(
        "S3 errors, cut bodies, latency spikes",
        load,
        job.tally(),
        schedule=schedule,
        details={
            "proxy": counts,
            "body_resumes": sum(m["shardstream_s3_body_resumes_total"] for m in metrics),
            "storage_reads": sum(m["shardstream_storage_reads_total"] for m in metrics),
        },
    )


def blackhole(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """Rank 0 reads through a TCP proxy in front of one server's data plane (its GetDataset names the
    proxy's port); a quarter into rank 0's first of two epochs
    the proxy goes silent (accepts, sends nothing): what the server had sent may still arrive from
    buffers, the second epoch's stream cannot. Keepalive or the idle watchdog must move it on."""
    s = ctx.sizes
    stable = ctx.fleet
    data_port = free_port()
    proxy = stack.enter_context(Blackhole(data_port))
    behind = stack.enter_context(LocalServer(ctx.root, extra_args=data_port_behind(proxy, data_port)))
    job = ctx.job(
        "blackhole",
        ctx.trainer(
            [behind.target, stable[1].target],
            ctx.vectors,
            world_size=2,
            epochs=2,
            stream_idle_timeout_s=s.idle_timeout_s,
            # small messages (a few steps each): a rank opens its next epoch's stream once what is
            # left of its epoch is a message's worth and a few steps, so with the server's 2 MiB
            # messages (the whole of this small epoch in one or two) it opened the second epoch's
            # stream at once, which then arrived whole from buffers before the proxy went silent
            max_message_bytes=16 << 10,
        ),
        ctx.plan(ctx.vectors, 2),
    )
    stack.callback(job.kill)
    phase = job.start(ctx.groups(2))
    # Rank 0's own progress, not the job's: its second epoch's stream must open after the proxy went
    # silent (once open, a small epoch fits in gRPC's window and arrives whole from buffers: a wait on
    # the slowest rank let a fast rank 0 reach its second epoch first, on a busy machine).
    epoch_steps = -(-s.rows // (2 * s.batch))  # global steps in an epoch (world 2)
    phase.wait(lambda: (phase.step(0) or 0) >= epoch_steps // 4, "rank 0 a quarter into its first epoch")
    proxy.blackhole()
    silent_at = phase.step(0)
    phase.wait_exit()
    t = job.tally()
    schedule = [] if t.failovers else ["no failover: the blackhole was never noticed"]
    if silent_at is not None and silent_at >= epoch_steps:
        schedule.append(f"the proxy went silent at rank 0's step {silent_at}, after its second epoch's stream opened")
    load = (
        f"2 ranks x 2 epochs of {s.rows:,} rows, rank 0 behind the proxy, silent from its step {silent_at}; "
        f"idle timeout {s.idle_timeout_s:g} s, keepalive 10 s + 5 s"
    )
    return row("blackholed server (TCP accepts, sends nothing)", load, t, schedule=schedule)


def _dataset_dir(root: str, ref: str) -> Path:
    return Path(root) / ref.split("@", 1)[0]


def corrupt_shard(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """One byte flipped in a column chunk of a shard every server reads: DATA_LOSS (unrecoverable)."""
    root = ctx.workdir / "corrupt-root"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(_dataset_dir(ctx.root, ctx.vectors), _dataset_dir(str(root), ctx.vectors))
    with open_registry(root) as reg:
        m = reg.resolve(ctx.vectors)
    shard = root / m.name / m.shards[0].uri
    meta = pq.read_metadata(shard)
    rg = min(1, meta.num_row_groups - 1)
    pos = meta.row_group(rg).column(1).data_page_offset + 64
    with shard.open("r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ 0x10]))
    servers = ctx.servers(stack, 2, root=str(root))
    job = ctx.job(
        "corrupt-shard",
        ctx.trainer([x.target for x in servers], ctx.vectors, world_size=2, epochs=1, step_ms=0.0),
        ctx.plan(ctx.vectors, 1),
    )
    stack.callback(job.kill)
    job.start(ctx.groups(2)).wait_exit()
    t = job.tally()
    named = [e for e in t.errors if m.shards[0].uri in e and f"row group {rg}" in e]
    schedule = (
        []
        if named or not t.errors
        else [f"DATA_LOSS does not name the shard and row group: {t.errors[0][:300]}"]
    )
    return row(
        "corrupt byte in a shard",
        f"2 ranks, 2 servers; shard {m.shards[0].uri}, row group {rg}, byte {pos}",
        t,
        expect_error="DataLossError",
        schedule=schedule,
        details={"errors": t.errors},
    )


def corrupt_disk_cache(ctx: Ctx, stack: contextlib.ExitStack) -> Row:
    """Two servers share a --cache-dir filled by one read of the dataset; stopped, cache_flips of its files get a
    flipped byte, restarted: the next epoch re-reads those row groups from storage, exactly."""
    s = ctx.sizes
    cache = ctx.workdir / "disk-cache"
    shutil.rmtree(cache, ignore_errors=True)
    ref = ctx.vectors
    servers = ctx.servers(stack, 2, args=("--cache-dir", str(cache)))
    with Loader([x.target for x in servers], ref, batch_size=4096, shuffle=False, timeout_s=60) as ld:
        for _ in ld:  # every row group once, into the shared tier
            pass
    for x in servers:
        x.stop()
    files = sorted(cache.glob("*.arrowc"))
    rng = random.Random(s.seed)
    victims = rng.sample(files, min(s.cache_flips, len(files)))
    for v in victims:
        data = bytearray(v.read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        v.write_bytes(bytes(data))
    start_all(servers)
    cfg = ctx.trainer([x.target for x in servers], ref, world_size=2, epochs=1, step_ms=0.0)
    job = ctx.job("disk-cache", cfg, ctx.plan(ref, 1))
    stack.callback(job.kill)
    job.start(ctx.groups(2)).wait_exit()
    metrics = [scrape(x, CACHE_METRICS) for x in servers]
    corrupt = sum(m["shardstream_disk_cache_corrupt_total"] for m in metrics)
    schedule = (
        []
        if corrupt >= len(victims)
        else [f"{corrupt:g} corrupt cache files noticed of {len(victims)} flipped"]
    )
    return row(
        "corrupt bytes in the disk cache",
        f"2 ranks, 2 servers sharing --cache-dir ({len(files)} files), {len(victims)} files flipped",
        job.tally(),
        schedule=schedule,
        details={
            "cache_files": len(files),
            "flipped": len(victims),
            "corrupt_noticed": corrupt,
            "disk_cache_hits": sum(m["shardstream_disk_cache_hits_total"] for m in metrics),
            "storage_reads": sum(m["shardstream_storage_reads_total"] for m in metrics),
        },
    )
