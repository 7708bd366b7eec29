"""The issue's scenario end to end through the real agent parts: a 4-node x 8-GPU training job
writing Inspector files, each node's agent-side InspectorSource and NicHealthSampler reading
them and a fake sysfs, giving the protocol sections a collector would receive per node."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.sources.base import GpuReading
from gpufleet.agent.sources.nccl_inspector import InspectorSource
from gpufleet.agent.sources.nic_health import NicHealthSampler
from gpufleet.analysis.collectives.features import CollRow, FabricView, NicRow
from gpufleet.protocol import CollectiveAgg, GpuInfo, GpuNic, NicSample
from gpufleet.storage.collectives import ERROR_COUNTERS

from .fabric_model import Fabric, NicFault, NodeSysfs, TrainingJob

T0 = 1_764_583_200.0
NODES = ["gpu-00", "gpu-01", "gpu-02", "gpu-03"]


def gpu_uuid(node: str, g: int) -> str:
    return f"GPU-{node}-{g}"


@dataclass
class NodeOutput:
    node: str
    collectives: list[CollectiveAgg] = field(default_factory=list)
    nics: list[NicSample] = field(default_factory=list)
    gpu_nics: list[GpuNic] = field(default_factory=list)


def make_job(fault: bool, minutes: float = 30.0, fault_at_min: float = 15.0) -> TrainingJob:
    faults = [NicFault("gpu-02", 5, T0 + fault_at_min * 60, 0.5)] if fault else []
    return TrainingJob("7001", Fabric(nodes=list(NODES), faults=faults), T0, minutes * 60)


def run_agents(job: TrainingJob, tmp: Path, nic_interval_s: float = 30.0) -> list[NodeOutput]:
    root = tmp / "dumps"
    job.write_json(root)
    g = job.fabric.gpus_per_node
    out = []
    for k, node in enumerate(job.fabric.nodes):
        src = InspectorSource(root, tmp / f"state-{node}.json", hostname=node, proc_root=tmp / "proc")
        devices = [GpuInfo(index=i, uuid=gpu_uuid(node, i)) for i in range(g)]
        src.update_gpus(devices, [GpuReading(gpu_uuid(node, i), pids=(job.pid_of(k * g + i),)) for i in range(g)])
        o = NodeOutput(node)
        for i in range(200):
            o.collectives += src.poll(float(i) * 10, wall=4e9)
        sysfs = NodeSysfs(tmp / f"sys-{node}", node, job.fabric)
        nic = NicHealthSampler(sysfs.root, interval_s=nic_interval_s)
        t = job.start
        while t <= job.start + job.duration_s:
            sysfs.write(t)
            o.nics += nic.sample(t)
            t += nic_interval_s
        o.gpu_nics = [GpuNic(gpu_uuid=gpu_uuid(node, i), nic=f"mlx5_{i}/1", mode="pcie") for i in range(g)]
        out.append(o)
    return out


def view_of(outputs: list[NodeOutput], until: float | None = None) -> FabricView:
    """What the analysis would read back from storage (the same mapping as analysis.collectives.load)."""
    colls = [CollRow(c.ts, o.node, c.comm, c.rank, c.coll, c.size_bucket, c.count, c.exec_us_p50, c.busbw_gbs_p50,
                     c.gpu_uuid, c.n_ranks, c.n_nodes)
             for o in outputs for c in o.collectives if until is None or c.ts + c.window_s <= until]
    nics = []
    for o in outputs:
        for n in o.nics:
            if until is not None and n.ts > until:
                continue
            errs = [v for k, v in n.counters.items() if k in ERROR_COUNTERS]
            nics.append(NicRow(n.ts, o.node, n.nic, n.interval_s, n.rate_gbps, n.state,
                               n.counters.get("port_xmit_wait"), sum(errs) if errs else None, dict(n.counters)))
    rails: dict[str, list[str]] = {}
    for o in outputs:
        for gn in o.gpu_nics:
            rails.setdefault(gn.gpu_uuid, []).append(gn.nic)
    ts = [c.ts for c in colls] + [n.ts for n in nics]
    return FabricView(colls, nics, rails, min(ts, default=0.0), max(ts, default=0.0))
