"""The same history gives the same flags whether it arrives live (agent batches through the
write path) or as an NDJSON file through ``gpufleet import`` (the collector's importer)."""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Any

import pytest
from sqlalchemy import select

from gpufleet.agent.simulator import H100, job_rows, make_job, write_ndjson_history
from gpufleet.analysis.runner import run_analysis
from gpufleet.protocol import AgentInfo, Allocation, Batch, GpuInfo
from gpufleet.storage.models import Cluster, Flag, Job, JobReport

from .conftest import T0

PROFILES = [("idle_gpu", 1), ("input_stall", 2), ("oversized_allocation", 4), ("throttled", 1), ("vision_train", 2)]


def _jobs() -> list[Any]:
    return [make_job(p, f"h-{p}", n, T0 + 7.5, 40 * 60, node_prefix="h") for p, n in PROFILES]


def _live_batches(job: Any) -> list[Batch]:
    """The same rows the NDJSON file holds, as agent batches (one per node per 5 minutes)."""
    groups: dict[tuple[str, int], dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for row in job_rows(job, seed=3):
        key = (row["node"], int((row["ts"] - job.start_ts) // 300))
        g = groups[key]
        g["ts"].append(row["ts"])
        g["gpu"].append(f"{row['node']}/{row['gpu']}")
        g["job"].append(row["job"])
        for k, v in row.items():
            if k not in ("ts", "node", "gpu", "job", "user", "cluster"):
                g[k].append(v)
    out = []
    for (node, chunk), cols in sorted(groups.items()):
        idx = sorted({i for n, i in job.gpus if n == node})
        out.append(Batch(agent=AgentInfo(boot_id=f"live-{node}", seq=chunk, node=node, cluster="live"),
                         gpus=[GpuInfo(index=i, uuid=f"{node}/{i}", model=H100) for i in idx],
                         jobs=[job.info()],
                         allocations=[Allocation(gpu_uuid=f"{node}/{i}", job_id=job.job_id, since=job.start_ts)
                                      for i in idx],
                         samples=dict(cols)))
    return out


def _flags_by_cluster(engine: Any) -> dict[str, dict[str, list[tuple[Any, ...]]]]:
    out: dict[str, dict[str, list[tuple[Any, ...]]]] = defaultdict(dict)
    with engine.connect() as c:
        q = (select(Cluster.name, Job.job_id, Flag.kind, Flag.severity, Flag.start_ts, Flag.end_ts,
                    Flag.wasted_gpu_hours)
             .join(Job, Job.cluster_id == Cluster.id).join(Flag, Flag.job_pk == Job.id, isouter=True))
        for cl, jid, kind, sev, t0, t1, w in c.execute(q):
            out[cl].setdefault(jid, [])
            if kind:
                out[cl][jid].append((kind, sev, t0, t1, w))
    return out


def test_imported_history_flags_equal_live(engine: Any, tmp_path: Any) -> None:
    from gpufleet.collector import ndjson
    from gpufleet.collector.columns import prepare
    from gpufleet.storage.writes import write_batches

    jobs = _jobs()
    path = tmp_path / "history.ndjson"
    buf = io.StringIO()
    write_ndjson_history(buf, jobs, seed=3, cluster="hist")
    path.write_text(buf.getvalue())
    now = T0 + 3 * 3600  # long after: the imported jobs are over
    res = ndjson.import_file(engine, str(path), now=now)
    assert res.stored == sum(len(j.gpus) for j in jobs) * 40 * 60
    for job in jobs:
        for b in _live_batches(job):
            with engine.begin() as conn:
                write_batches(conn, [prepare(b)], now=now)
    s = run_analysis(engine, now=now)
    assert s.errors == [] and s.jobs_analyzed == 2 * len(jobs)

    got = _flags_by_cluster(engine)
    assert set(got) == {"hist", "live"}
    assert got["hist"].keys() == got["live"].keys() == {j.job_id for j in jobs}
    for job_id, live in got["live"].items():
        hist = got["hist"][job_id]
        assert [f[:4] for f in sorted(hist)] == [f[:4] for f in sorted(live)], job_id
        for a, b in zip(sorted(hist), sorted(live), strict=True):
            assert a[4] == pytest.approx(b[4], rel=1e-3, abs=1e-3)
    expected = {f"h-{p}": ({p} if p != "vision_train" else set()) for p, _ in PROFILES}
    assert {j: {f[0] for f in v} for j, v in got["hist"].items()} == expected
    with engine.connect() as c:
        scores = dict(c.execute(select(Job.job_id, JobReport.goodput_score).join(JobReport, JobReport.job_pk == Job.id)
                                .join(Cluster, Cluster.id == Job.cluster_id).where(Cluster.name == "hist")).all())
        states = set(c.execute(select(Job.state)).scalars())
    assert states == {"ended"}
    assert scores["h-idle_gpu"] == 0.0 and scores["h-vision_train"] > 0.8
    # Imported (ended) jobs keep their findings, resolved: nothing is going on any more.
    with engine.connect() as c:
        assert not any(c.execute(select(Flag.open)).scalars())
