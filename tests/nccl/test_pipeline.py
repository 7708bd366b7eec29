"""The scenario through storage and the analysis runner, on SQLite and PostgreSQL: the agents'
sections in protocol batches -> check_batch -> write_batches -> run_analysis -> flags and
GET /api/v1/jobs/{id}/collectives."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpufleet.analysis.runner import run_analysis
from gpufleet.collector.columns import prepare
from gpufleet.collector.validate import check_batch
from gpufleet.protocol import AgentInfo, Allocation, Batch, GpuInfo, JobInfo
from gpufleet.storage.models import Flag, Job
from gpufleet.storage.writes import write_batches

from .scenario import T0, NodeOutput, gpu_uuid, make_job, run_agents

JOB = "7001"


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gpufleet-nccl-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def faulty() -> Iterator[list[NodeOutput]]:
    with _scratch() as d:
        yield run_agents(make_job(fault=True), d)


def batches(outs: list[NodeOutput], chunk_s: float = 60.0, end: float = T0 + 1800) -> list[Batch]:
    """One batch per node and minute: GPU samples every 10 s (so the job has GPU time to analyse)
    plus the sections the agent handed out in that minute."""
    out = []
    seq = 0
    t = T0
    while t < end:
        for o in outs:
            gpus = [GpuInfo(index=i, uuid=gpu_uuid(o.node, i), model="NVIDIA H100 80GB HBM3") for i in range(8)]
            ts = [t + k * 10.0 for k in range(int(chunk_s / 10)) for _ in range(8)]
            g = [gpu_uuid(o.node, i) for _ in range(int(chunk_s / 10)) for i in range(8)]
            samples: dict[str, list[Any]] = {"ts": ts, "gpu": g, "job": [JOB] * len(ts),
                                             "sm_active": [0.7] * len(ts), "gpu_util": [0.95] * len(ts)}
            out.append(Batch(
                agent=AgentInfo(boot_id=f"boot-{o.node}", seq=seq, node=o.node), gpus=gpus,
                jobs=[JobInfo(job_id=JOB, source="slurm", num_nodes=4, start_ts=T0)],
                allocations=[Allocation(gpu_uuid=x.uuid, job_id=JOB, since=T0) for x in gpus], samples=samples,
                collectives=[c for c in o.collectives if t <= c.ts < t + chunk_s],
                nics=[n for n in o.nics if t <= n.ts < t + chunk_s],
                gpu_nics=o.gpu_nics if seq == 0 else []))
        seq += 1
        t += chunk_s
    return out


def test_flags_name_the_node_and_nic_through_storage(engine: Any, faulty: list[NodeOutput]) -> None:
    bs = batches(faulty, end=T0 + 25 * 60)
    with engine.begin() as conn:
        for b in bs:
            check_batch(b, prepare(b), T0 + 1800, max_rows=100_000, max_age_s=None, max_future_s=3600)
        write_batches(conn, [prepare(b) for b in bs], T0 + 25 * 60)
    run_analysis(engine, now=T0 + 25 * 60)
    with engine.connect() as c:
        job_pk = c.execute(select(Job.id).where(Job.job_id == JOB)).scalar_one()
        ft = Flag.__table__
        flags = {(f["kind"], f["scope"]): f for f in c.execute(select(ft).where(ft.c.job_pk == job_pk)).mappings()}
    assert ("collective_slow", "") in flags
    net = flags[("network_degraded", "gpu-02")]
    assert net["evidence"]["nic"] == "mlx5_5/1" and net["evidence"]["rank"] == 21 and net["open"]
    assert not any(k == "link_errors" for k, _ in flags)


def test_a_bad_record_is_refused_alone_before_anything_is_written(faulty: list[NodeOutput]) -> None:
    import msgspec

    b = batches(faulty, end=T0 + 60)[0]
    cs = list(b.collectives)
    cs[3] = msgspec.structs.replace(cs[3], exec_us_p95=-1.0)  # a copy: the fixture is shared
    b = msgspec.structs.replace(b, collectives=cs)
    prep = prepare(b)
    (r,) = check_batch(b, prep, T0 + 60, max_rows=100_000, max_age_s=None, max_future_s=3600)
    assert (r.status, r.part, r.row, r.field) == (422, "collectives", 3, "exec_us_p95")
    assert len(prep.batch.collectives) == len(cs) - 1  # the rest is stored


def test_ingest_over_http_then_the_collectives_api(sqlite_url: str, live_server: Any,
                                                   faulty: list[NodeOutput]) -> None:
    """The real collector (msgpack + zstd, as agents send) stores the sections once; the API
    serves series, the rank x time heatmap with the degraded rank marked, and the NICs."""
    import httpx

    from gpufleet.protocol import encode
    from gpufleet.storage.tokens import create_token

    srv = live_server(sqlite_url, collector__max_age_s=3650 * 86400.0)  # the scenario is dated 2025
    engine = srv.app.state.engine
    tokens = {o.node: create_token(engine, o.node, "agent", node=o.node) for o in faulty}
    bs = batches(faulty, end=T0 + 25 * 60)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for b in bs + bs[:4]:  # the first four sent twice (lost acknowledgements)
            body, headers = encode(b)
            r = c.post("/api/v1/ingest", content=body,
                       headers={**headers, "Authorization": f"Bearer {tokens[b.agent.node]}"})
            assert r.status_code == 200, r.text
        run_analysis(engine, now=T0 + 25 * 60)
        r = c.get(f"/api/v1/jobs/{JOB}/collectives")
    assert r.status_code == 200, r.text
    d = r.json()
    sent = sum(c.count for o in faulty for c in o.collectives if c.ts < T0 + 25 * 60)
    assert sum(s["count"] for s in d["series"]) == sent, "every collective stored once"
    top = d["series"][0]
    assert top["collective"] == "AllReduce" and top["n_nodes"] == 4 and top["baseline_gbs"] > 0
    assert d["ranks_of"]["comm"] == top["comm"] and len(d["ranks"]) == 32
    marked = [r for r in d["ranks"] if r["degraded"]]
    assert [(r["node"], r["rank"], r["nic"]) for r in marked] == [("gpu-02", 21, "mlx5_5/1")]
    nic = next(n for n in d["nics"] if (n["node"], n["nic"]) == ("gpu-02", "mlx5_5/1"))
    assert nic["rate_gbps"][0] == 400.0 and nic["rate_gbps"][-1] == 200.0 and nic["gpus"] == ["GPU-gpu-02-5"]
    assert {f["kind"] for f in d["flags"]} >= {"collective_slow", "network_degraded"}
    # 2 x 256 MiB all-reduces + a 64 MiB all-gather in a 2 s step: a few ms each, about 0.3-0.6% of the time
    assert 0.001 < d["comm_share_p50"] < 0.05 and all(r["comm_share"] is not None for r in d["ranks"])
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/api/v1/jobs/nope/collectives").status_code == 404


def test_node_nics_api(sqlite_url: str, live_server: Any, faulty: list[NodeOutput]) -> None:
    import httpx

    from gpufleet.storage.db import make_engine

    e = make_engine(sqlite_url)
    bs = batches(faulty, end=T0 + 25 * 60)
    with e.begin() as conn:
        write_batches(conn, [prepare(b) for b in bs], T0 + 25 * 60)
    e.dispose()
    # the scenario is dated 2025: keep its NIC samples past the raw horizon the maintenance loop applies
    srv = live_server(sqlite_url, maintenance__raw_days=3650.0)
    with httpx.Client(base_url=srv.url) as c:
        d = c.get("/api/v1/nodes/gpu-02/nics").json()
        assert c.get("/api/v1/nodes/nope/nics").status_code == 404
    by = {n["nic"]: n for n in d["nics"]}
    assert len(by) == 8
    n = by["mlx5_5/1"]
    assert n["gpus"] == [{"gpu_uuid": "GPU-gpu-02-5", "index": 5, "mode": "pcie"}]
    assert n["rate_gbps"][0] == 400.0 and n["rate_gbps"][-1] == 200.0
    assert max(x for x in n["xmit_wait_per_s"] if x is not None) > 1e5 > max(
        x for x in by["mlx5_4/1"]["xmit_wait_per_s"] if x is not None)
