"""The demo's fabric profiles through the agent's real fabric sources and the analysis: the
simulated nodes write NCCL Inspector files and a /sys tree (agent/sim_fabric.py), the agent's
InspectorSource and NicHealthSampler read them, and the detectors raise each profile's kind,
no more (healthy NCCL jobs raise nothing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpufleet.agent.sim_fabric import NodeFabric, fabric_sources
from gpufleet.agent.simulator import PROFILES, SimulatedFleet, make_job
from gpufleet.agent.sources.nccl_inspector import InspectorSource
from gpufleet.agent.sources.nic_health import NicHealthSampler
from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors import features_for
from gpufleet.analysis.features import histograms
from gpufleet.analysis.report import analyze

from ..nccl.scenario import NodeOutput, view_of

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "goodput"))
from simjobs import generate, meta_of

T0 = 1_790_000_000.0
MINUTES = 42


def _run(profile: str, tmp: Path, job_id: str = "7301") -> set[str]:
    job = make_job(profile, job_id, 16, T0, MINUTES * 60)
    fleet = SimulatedFleet(nodes=len(job.nodes), gpus_per_node=8, jobs=[job])
    fleet.node_names = lambda: job.nodes  # type: ignore[method-assign]  # the job's own nodes
    outputs = []
    for node, src in fabric_sources(fleet, tmp / "fabric"):
        assert isinstance(src.fabric, NodeFabric)
        insp = InspectorSource(src.fabric.nccl_root, tmp / f"{node}.json", hostname=node, proc_root=tmp / "proc")
        nics = NicHealthSampler(src.fabric.sys_root, interval_s=5.0)
        o = NodeOutput(node)
        t = T0
        while t <= T0 + MINUTES * 60:
            src.read(t)
            o.nics += nics.sample(t)
            o.collectives += insp.poll(t, wall=t)
            t += 5.0  # the agent samples every second; the fabric files advance every 5 s
        o.collectives += insp.poll(t + 60, wall=t + 60)
        outputs.append(o)
    th = load_thresholds()
    d = generate(job)
    feats = features_for(th, d.ts, d.gpu, d.cols, len(job.gpus))
    res = analyze(meta_of(job), feats, histograms(d.cols), th=th, first_ts=float(d.ts.min()),
                  last_ts=float(d.ts.max()), fabric=view_of(outputs))
    return {f.kind for f in res.findings}


@pytest.mark.parametrize("profile", ["collective_slow", "network_degraded", "link_errors", "multinode_dp"])
def test_fabric_profiles_raise_their_kinds_through_the_agent_sources(profile: str, tmp_path: Path) -> None:
    p = PROFILES[profile]
    assert _run(profile, tmp_path) == set(p.flags | p.fabric_flags)
