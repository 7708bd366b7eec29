"""Fixtures for collector tests: protocol batches shaped like a real agent's."""

from __future__ import annotations

import random
import uuid as uuidlib
from collections.abc import Callable

import pytest

from gpufleet.catalog import CATALOG
from gpufleet.collector.columns import prepare
from gpufleet.protocol import AgentInfo, Batch, GpuInfo, JobInfo
from gpufleet.storage.db import make_engine
from gpufleet.storage.write_cache import WriteCache
from gpufleet.storage.writes import WriteResult, write_batches


def store(conn, batches: list[Batch], now: float, cache: WriteCache | None = None) -> WriteResult:  # type: ignore[no-untyped-def]
    """Check the batches as the collector does (``collector.columns.prepare``), then store
    them with ``write_batches`` in the caller's transaction."""
    return write_batches(conn, [prepare(b) for b in batches], now, cache)


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{node}/{index}')}"


def sample_value(name: str, rng: random.Random) -> float | int:
    f = CATALOG[name]
    if f.dtype == "i8":
        return rng.randint(0, int(min(f.max, 1000)))
    hi = min(f.max, 1e6) if f.unit != "ratio" else 1.0
    return rng.uniform(max(f.min, 0.0), hi)


def make_batch(node: str = "node-1", *, seq: int = 0, boot_id: str | None = None, cluster: str = "default",
               gpus: int = 8, seconds: int = 10, start: float = 1_790_000_000.0, job: str | None = "job-1",
               fields: tuple[str, ...] | None = None, seed: int = 0, user: str | None = "alice") -> Batch:
    """One agent flush: ``gpus`` x ``seconds`` rows at 1 Hz, every catalog field (or ``fields``)."""
    rng = random.Random(seed)
    names = fields if fields is not None else CATALOG.names
    rows_ts, rows_gpu, rows_job = [], [], []
    cols: dict[str, list] = {n: [] for n in names}
    for s in range(seconds):
        for g in range(gpus):
            rows_ts.append(start + s)
            rows_gpu.append(gpu_uuid(node, g))
            rows_job.append(job)
            for n in names:
                cols[n].append(sample_value(n, rng))
    return Batch(
        agent=AgentInfo(boot_id=boot_id or f"boot-{node}", seq=seq, node=node, cluster=cluster, version="test"),
        gpus=[GpuInfo(index=g, uuid=gpu_uuid(node, g), model="NVIDIA H100 80GB HBM3") for g in range(gpus)],
        jobs=[JobInfo(job_id=job, source="slurm", user=user)] if job else [],
        samples={"ts": rows_ts, "gpu": rows_gpu, "job": rows_job, **cols},
    )


@pytest.fixture
def batch_factory() -> Callable[..., Batch]:
    return make_batch


@pytest.fixture
def server(database_url, live_server):  # type: ignore[no-untyped-def]
    """A live collector on the test's database, and an engine to count what it stored."""
    srv = live_server(database_url)
    e = make_engine(database_url)
    yield srv, e
    e.dispose()
