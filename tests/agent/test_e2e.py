"""Each source through the whole path: agent -> real collector (in-thread server) -> database."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from gpufleet.agent.attribution.slurm import SlurmAttributor
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.sources.dcgm_exporter import DcgmExporterSource
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.storage.raw_read import read_raw
from tests.raw_samples_helpers import raw_count

from ..support.fake_nvml import FakeNvml, a100, h100
from .conftest import TickClock
from .test_attribution import CG_V1, fake_proc
from .test_dcgm_exporter import Exporter


def _deliver(agent: Agent) -> None:
    agent.flush()
    deadline = time.monotonic() + 180  # a bound that only catches a hang (a loaded box is slow, not stuck)
    while len(agent.spool) and time.monotonic() < deadline:
        agent.sender.send_one()
    assert len(agent.spool) == 0


def _max_raw(url: str, field: str) -> float:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            return float(np.nanmax(read_raw(c, fields=[field]).vals[0]))
    finally:
        eng.dispose()


def _query(url: str, sql: str) -> list[tuple]:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            return [tuple(r) for r in c.execute(sa.text(sql))]
    finally:
        eng.dispose()


def test_nvml_node_with_slurm_job_and_mig(database_url, live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url)
    proc = tmp_path / "proc"
    fake_proc(proc, 900, CG_V1, {"SLURM_JOB_ID": "280678", "SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "nlp"})
    gpus = [h100(0), h100(1), a100(2, mig=True)]
    gpus[0].pids = [900]
    gpus[2].mig[0].pids = [900]
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "1").write_text("280678\n")  # allocated to the same job, idle
    src = NvmlSource(FakeNvml(gpus), xid_events=False)
    agent = Agent(AgentConfig(collector_url=srv.url, node="gpu-n1", spool_dir=tmp_path / "spool"), src,
                  [SlurmAttributor(jobs, tmp_path / "none", proc)], clock=TickClock(start=time.time() - 60),
                  enrichers=[])
    for _ in range(3):
        agent.cycle(agent.clock())
        time.sleep(0.11)  # GPM's 100 ms
    _deliver(agent)
    src.close()
    assert raw_count(database_url) == 3 * 7  # 3 GPUs + 4 MIG rows
    assert _query(database_url, 'select job_id, "user", account from jobs') == [("280678", "alice", "nlp")]
    n_alloc = _query(database_url, "select count(*) from allocations")[0][0]
    assert n_alloc == 3  # GPU 0 (process), GPU 1 (mapping dir), the MIG instance (process)
    migs = _query(database_url, "select count(*) from gpus where parent_uuid is not null and mig_profile = '1g.20gb'")
    assert migs == [(4,)]


def test_dcgm_exporter_node_with_pods(database_url, live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url)
    exp = Exporter()
    try:
        exp.body = (
            "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n"
            'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-e2e0",modelName="NVIDIA H100 80GB HBM3",pod="p0",namespace="ml",'
            'container="c"} 0.8\n'
            'DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-e2e1",modelName="NVIDIA H100 80GB HBM3",pod="",namespace="",'
            'container=""} 0.0\n'
            "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
            'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-e2e0"} 1024\n'
        )
        src = DcgmExporterSource(exp.url)
        agent = Agent(AgentConfig(collector_url=srv.url, node="k8s-n1", spool_dir=tmp_path / "spool"), src, [],
                      clock=TickClock(start=time.time() - 60), enrichers=[])
        for _ in range(2):
            agent.cycle(agent.clock())
        _deliver(agent)
        src.close()
    finally:
        exp.httpd.shutdown()
        exp.httpd.server_close()
    assert raw_count(database_url) == 4
    assert _query(database_url, "select job_id, source, namespace from jobs") == [("ml/p0", "kubernetes", "ml")]
    assert _max_raw(database_url, "fb_used_bytes") == 1024 * 2**20


def test_bearer_token_against_a_collector_that_requires_one(database_url, live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Wrong token: 401, the batch stays spooled (nothing dropped). Right token: stored.
    A token scoped to another node: refused, still kept."""
    from gpufleet.agent.sender import Outcome
    from gpufleet.agent.simulator import SimulatedFleet
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.tokens import create_token

    eng = make_engine(database_url)
    good = create_token(eng, "n1-agent", "agent", node="sim-node-000")
    other = create_token(eng, "n2-agent", "agent", node="sim-node-001")
    eng.dispose()
    srv = live_server(database_url, allow_anonymous=False)
    fleet = SimulatedFleet(nodes=1, gpus_per_node=2, start_ts=time.time() - 7200)

    def agent(token: str) -> Agent:
        a = Agent(AgentConfig(collector_url=srv.url, token=token, node="sim-node-000", spool_dir=tmp_path / "s"),
                  fleet.source("sim-node-000"), clock=TickClock(start=time.time() - 60))
        a.start()
        return a

    a = agent("gf_not_a_token")
    a.cycle(a.clock())
    a.flush()
    r, _ = a.sender.send_one()  # type: ignore[misc]
    assert r.outcome is Outcome.AUTH and r.status == 401 and len(a.spool) == 1
    a.spool.unlock()
    a = agent(other)
    r, _ = a.sender.send_one()  # type: ignore[misc]
    assert r.outcome is Outcome.AUTH and r.status == 403 and len(a.spool) == 1
    a.spool.unlock()
    a = agent(good)
    _deliver(a)
    assert raw_count(database_url) == 2
