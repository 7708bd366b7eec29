"""The issue's must-show: a simulated 4-node x 8-GPU job writing Inspector files; one node's NIC
degrades mid-run (rate halved, port_xmit_wait climbing). collective_slow and network_degraded
name that node and NIC within 10 minutes of the change; the same job without the fault (normal
busbw jitter, periodic 4 GiB all-reduces at checkpoints) raises nothing.

The data goes through the real agent parts (Inspector tailer and aggregator, NIC sampler); the
detectors run as registered (thresholds.toml, flagkinds.toml)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpufleet.analysis.collectives.features import FabricView
from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors import DETECTORS, Found
from gpufleet.analysis.detectors.base import Finding
from gpufleet.flagkinds import flag_kinds

from .scenario import NODES, T0, make_job, run_agents, view_of

FAULT_AT = T0 + 15 * 60
FABRIC_KINDS = ("collective_slow", "network_degraded", "link_errors")


def _run(view: FabricView) -> list[Finding]:
    th = load_thresholds()
    ctx = SimpleNamespace(first_ts=view.first_ts, last_ts=view.last_ts, workload_class="training",
                          limits=th.model("H100"), gpu_nodes=NODES)
    job: Any = SimpleNamespace(fabric=view, ctx=ctx, th=th)
    found = Found()
    for d in DETECTORS:
        if d.kind in FABRIC_KINDS:
            assert d.signals.needs == (), "the fabric kinds judge from their own sections, not GPU signals"
            found.findings.extend(d.detect(job, th.get(d.config), found))  # what run() does without signals
    return found.findings


@contextlib.contextmanager
def _scratch(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    # tens of thousands of small sysfs files: tmpfs when there is one (a disk-backed /tmp is slow)
    if Path("/dev/shm").is_dir():
        d = Path(tempfile.mkdtemp(prefix=f"gpufleet-nccl-{name}-", dir="/dev/shm"))
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp(name)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    with _scratch(tmp_path_factory, "faulty") as d:
        yield run_agents(make_job(fault=True), d)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    with _scratch(tmp_path_factory, "healthy") as d:
        yield run_agents(make_job(fault=False), d)


def test_degraded_nic_is_named_within_ten_minutes(faulty: list[Any]) -> None:
    # What the analysis could see 10 minutes after the change (the agent hands a window out
    # 15 s after it ends, so the data lags by under half a minute).
    seen = _run(view_of(faulty, until=FAULT_AT + 10 * 60 - 30))
    kinds = {f.kind for f in seen}
    assert {"collective_slow", "network_degraded"} <= kinds
    slow = next(f for f in seen if f.kind == "collective_slow")
    assert slow.start_ts >= FAULT_AT - 60 and slow.ongoing
    ev = slow.evidence
    assert ev["collective"] == "AllReduce" and ev["n_nodes"] == 4 and ev["busbw_drop"] >= 0.4
    assert ev["comm"].startswith("0x") and ev["message_size_bytes"] in (256 << 20, 4 << 30)
    assert ev["fabric_busbw_bytes_s"] == 8 * 400e9 / 8, "8 rails at the 400 Gb/s they trained at"
    assert ev["of_fabric"] < 0.5 * ev["baseline_busbw_bytes_s"] / ev["fabric_busbw_bytes_s"] + 0.05
    assert slow.wasted_gpu_hours > 0
    (net,) = [f for f in seen if f.kind == "network_degraded"]
    assert net.scope == "gpu-02"
    e = net.evidence
    assert e["nic"] == "mlx5_5/1" and e["rank"] == 21 and e["gpu_uuid"] == "GPU-gpu-02-5"
    assert e["late_exec_ratio"] < 0.8, "the rank behind the slow link waits least"
    assert e["link_rate_bytes_s"] == 200e9 / 8 and e["nominal_rate_bytes_s"] == 400e9 / 8
    assert e["xmit_wait_per_s"] > 10 * e["xmit_wait_before_per_s"]
    assert e["confidence"] == "high" and e["judged_from"][0] == "timing"
    # every evidence key the detectors write is declared in the registry
    reg = flag_kinds()
    for f in seen:
        assert [k for k in f.evidence if reg.evidence_field(f.kind, k) is None] == []
    # before the change nothing is flagged on the same job
    assert _run(view_of(faulty, until=FAULT_AT - 30)) == []


def test_same_job_without_the_fault_raises_nothing(healthy: list[Any]) -> None:
    view = view_of(healthy)
    ckpt = [c for c in view.colls if c.size_bucket == 4 << 30]
    assert ckpt and len({int((c.ts - T0) // 300) for c in ckpt}) >= 5, "periodic checkpoint all-reduces"
    bw = sorted(c.busbw_gbs_p50 for c in view.colls if c.size_bucket == 256 << 20 and c.busbw_gbs_p50)
    assert bw[-1] / bw[0] > 1.05, "busbw jitters from step to step"
    assert _run(view) == []


def test_link_errors_name_the_port(healthy: list[Any]) -> None:
    view = view_of(healthy)
    bad = next(n for n in view.nics if n.node == "gpu-01" and n.nic == "mlx5_3/1" and n.ts > T0 + 600)
    bad.counters["symbol_error"] = 40.0
    bad.counters["link_downed"] = 1.0
    (f,) = _run(view)
    assert (f.kind, f.scope, f.evidence["nic"], f.evidence["errors"]) == ("link_errors", "gpu-01", "mlx5_3/1", 41.0)


def test_slack_names_the_node_and_link(faulty: list[Any]) -> None:
    from gpufleet.alerts.config import AlertConfig
    from gpufleet.alerts.decide import KindSummary
    from gpufleet.alerts.facts import FlagFact
    from gpufleet.alerts.render import flag_section

    (net,) = [f for f in _run(view_of(faulty)) if f.kind == "network_degraded"]
    fact = FlagFact(net.kind, net.scope, net.severity, net.wasted_gpu_hours, net.evidence, net.suggestion)
    text = flag_section(AlertConfig(), KindSummary(net.kind, net.severity, (net.scope,), 0.0, (fact,)), True)["text"]
    assert "gpu-02" in text["text"] and "NIC `mlx5_5/1`" in text["text"] and "rank `21`" in text["text"]
