"""Collectives, NIC samples and rails stored inside the batch transaction, once, on both databases."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import select

from gpufleet.collector.columns import prepare
from gpufleet.protocol import AgentInfo, Batch, CollectiveAgg, GpuInfo, GpuNic, NicSample
from gpufleet.storage.collectives import FabricRejected, check_fabric
from gpufleet.storage.collectives_models import CollectiveWindow, GpuNicRow, NicSampleRow
from gpufleet.storage.models import Job
from gpufleet.storage.writes import write_batches

T0 = 1_764_583_200.0


def _agg(**kw: Any) -> CollectiveAgg:
    base: dict[str, Any] = dict(ts=T0, comm="0x5eed", rank=3, coll="AllReduce", size_bucket=1 << 28, count=5,
                                bytes=5.0 * (1 << 28), exec_us_p50=1800.0, exec_us_p95=1900.0, exec_us_max=2000.0,
                                busbw_gbs_p50=290.0, job_id="4242", n_ranks=32, n_nodes=4, gpu_uuid="GPU-a", pid=7)
    base.update(kw)
    return CollectiveAgg(**base)


def _batch(seq: int = 0, **kw: Any) -> Batch:
    return Batch(agent=AgentInfo(boot_id="b1", seq=seq, node="gpu-00"), gpus=[GpuInfo(index=0, uuid="GPU-a")],
                 **kw)


def _write(engine: Any, *batches: Batch) -> None:
    with engine.begin() as conn:
        for b in batches:
            check_fabric(b)
        write_batches(conn, [prepare(b) for b in batches], T0 + 30)


def test_sections_stored_once_with_jobs_gpus_and_nodes(engine: Any) -> None:
    b = _batch(collectives=[_agg(), _agg(rank=4, gpu_uuid=None, job_id="999", busbw_gbs_p50=None)],
               nics=[NicSample(ts=T0 + 10, nic="mlx5_0/1", interval_s=10, link_layer="InfiniBand", state="ACTIVE",
                               rate_gbps=200.0, tx_bytes_s=1e9, counters={"port_xmit_wait": 2e7, "symbol_error": 3,
                                                                          "link_downed": 1})],
               gpu_nics=[GpuNic(gpu_uuid="GPU-a", nic="mlx5_0/1", mode="pcie"),
                         GpuNic(gpu_uuid="GPU-unknown", nic="mlx5_1/1")])
    _write(engine, b)
    _write(engine, b)  # retried after a lost acknowledgement: a duplicate
    with engine.connect() as c:
        rows = c.execute(select(CollectiveWindow.__table__).order_by(CollectiveWindow.rank)).all()
        jobs = dict(c.execute(select(Job.id, Job.job_id)).all())
        nics = c.execute(select(NicSampleRow.__table__)).all()
        rails = c.execute(select(GpuNicRow.__table__)).all()
    assert len(rows) == 2
    assert jobs[rows[0].job_pk] == "4242" and jobs[rows[1].job_pk] == "999", "a job named only by collectives"
    assert rows[0].gpu_pk is not None and rows[1].gpu_pk is None
    assert (rows[0].count, rows[0].size_bucket, rows[0].busbw_gbs_p50) == (5, 1 << 28, 290.0)
    assert rows[1].busbw_gbs_p50 is None, "unknown stays unknown"
    (n,) = nics
    assert (n.rate_gbps, n.xmit_wait, n.errors, n.state) == (200.0, 2e7, 4.0, "ACTIVE")
    assert n.rx_bytes_s is None
    assert [(r.nic, r.mode) for r in rails] == [("mlx5_0/1", "pcie")]


@pytest.mark.parametrize("bad, where", [
    (dict(collectives=[_agg(exec_us_p50=math.nan)]), "collectives[0].exec_us_p50"),
    (dict(collectives=[_agg(ts=5.0)]), "collectives[0].ts"),
    (dict(collectives=[_agg(), _agg(count=0)]), "collectives[1].count"),
    (dict(collectives=[_agg(comm="x" * 65)]), "collectives[0].comm"),
    (dict(nics=[NicSample(ts=T0, nic="m/1", interval_s=10, counters={"symbol_error": -1})]),
     "nics[0].counters.symbol_error"),
    (dict(nics=[NicSample(ts=T0, nic="m/1", interval_s=0)]), "nics[0].interval_s"),
    (dict(gpu_nics=[GpuNic(gpu_uuid="GPU-a", nic="m/1", mode="guess")]), "gpu_nics[0].nic"),
])
def test_bad_entries_are_refused_by_name(bad: dict[str, Any], where: str) -> None:
    with pytest.raises(FabricRejected, match=where.replace("[", r"\[").replace("]", r"\]")):
        check_fabric(_batch(**bad))
