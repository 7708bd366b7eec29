"""Analysis fixtures: simulated jobs (the simulator's profiles with ground truth) as numpy
arrays for the pure heuristics, and as protocol batches through the real write path."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "goodput"))

T0 = 1_790_000_000.0


def sim_batches(job: Any, t_from: float, t_to: float, *, interval_s: float = 1.0, seed: int = 0,
                chunk_s: float = 300.0, seq: dict[str, int] | None = None) -> Iterator[Any]:
    """Protocol batches (one per node per ``chunk_s``) carrying ``job``'s samples over
    (t_from, t_to], as the agent would send them."""
    from gpufleet.agent.simulator import H100, H100_MEM, gpu_uuid, sample_job
    from gpufleet.protocol import AgentInfo, Allocation, Batch, GpuInfo

    seq = seq if seq is not None else {}
    rng = random.Random(f"{seed}/{job.job_id}/{t_from}")
    nodes = job.nodes
    t = t_from
    while t < t_to:
        end = min(t_to, t + chunk_s)
        cols: dict[str, dict[str, list[Any]]] = {n: {"ts": [], "gpu": [], "job": []} for n in nodes}
        now = t + interval_s
        while now <= end + 1e-9:
            for (node, idx), values in zip(job.gpus, sample_job(job, now, rng, interval_s=interval_s), strict=True):
                c = cols[node]
                c["ts"].append(now)
                c["gpu"].append(gpu_uuid(node, idx))
                c["job"].append(job.job_id)
                for k, v in values.items():
                    c.setdefault(k, []).append(v)
            now += interval_s
        for node in nodes:
            if not cols[node]["ts"]:
                continue
            s = seq.get(node, 0)
            seq[node] = s + 1
            mine = [i for n, i in job.gpus if n == node]
            yield Batch(
                agent=AgentInfo(boot_id=f"test-{node}-{t_from:.0f}", seq=s, node=node),
                gpus=[GpuInfo(index=i, uuid=gpu_uuid(node, i), model=H100, memory_total_bytes=float(H100_MEM))
                      for i in mine],
                jobs=[job.info()],
                allocations=[Allocation(gpu_uuid=gpu_uuid(node, i), job_id=job.job_id, since=job.start_ts)
                             for i in mine],
                samples=cols[node],
            )
        t = end


def ingest(engine: Any, job: Any, t_from: float, t_to: float, **kw: Any) -> int:
    """Write the job's samples over (t_from, t_to] through the collector's write path, on an
    engine of its own, as the collector process would (not the analyzer's connections)."""
    from gpufleet.collector.columns import prepare
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.writes import write_batches

    own = make_engine(engine.url.render_as_string(hide_password=False))
    n = 0
    try:
        for b in sim_batches(job, t_from, t_to, **kw):
            with own.begin() as conn:
                write_batches(conn, [prepare(b)], now=t_to)
            n += b.n_rows()
    finally:
        own.dispose()
    return n


@pytest.fixture(autouse=True)
def _fresh_analysis_state() -> Iterator[None]:
    """The runner's per-process job cache must not leak between tests."""
    from gpufleet.analysis.state import CACHE

    CACHE.clear()
    yield
    CACHE.clear()
