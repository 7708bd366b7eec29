"""Workload simulator: nodes with N GPUs running jobs of realistic profiles.

It implements the same ``Source`` interface as the NVML source, so everything downstream
(attribution, batching, spool, collector, analysis) runs unchanged on a machine without
GPUs. Each profile carries its ground truth (the flags the goodput engine should raise),
so bench/goodput can measure precision and recall, false positives on healthy jobs too.

Pure Python (no numpy): the agent installs without the server's packages.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.protocol import Event, GpuInfo, JobInfo

from .sources.base import GpuReading, SourceAttribution

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
H100_MEM = 80 * GIB
MAX_SM_CLOCK = 1980.0
MEM_CLOCK = 2619.0


@dataclass(frozen=True, slots=True)
class GpuContext:
    """What a profile knows when it draws one GPU's sample."""

    t: float  # seconds since the job started
    rank: int  # GPU rank within the job (0..n_gpus-1)
    n_gpus: int
    node_rank: int
    n_nodes: int
    rng: random.Random


ProfileFn = Callable[[GpuContext], dict[str, float]]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    flags: frozenset[str]  # ground truth: the flags a correct engine raises for this job
    fn: ProfileFn
    healthy: bool = False
    min_gpus: int = 1
    multi_node: bool = False


def _noise(rng: random.Random, x: float, sd: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return min(hi, max(lo, rng.gauss(x, sd)))


def _base(ctx: GpuContext, *, sm: float, occ: float, tensor: float, dram: float, fb_gib: float,
          power: float, fp32: float = 0.05, fp16: float = 0.02, fp64: float = 0.0,
          pcie_rx: float = 2e8, pcie_tx: float = 5e7, nvlink: float = 0.0, ib: float = 0.0,
          clock: float = MAX_SM_CLOCK, reasons: int = 0) -> dict[str, float]:
    r = ctx.rng
    sm_v = _noise(r, sm, 0.03)
    busy = sm_v > 0.02
    return {
        "gr_engine_active": min(1.0, sm_v * 1.02),
        "sm_active": sm_v,
        "sm_occupancy": _noise(r, occ, 0.02),
        "tensor_active": _noise(r, tensor, 0.02),
        "dram_active": _noise(r, dram, 0.03),
        "fp64_active": _noise(r, fp64, 0.002),
        "fp32_active": _noise(r, fp32, 0.01),
        "fp16_active": _noise(r, fp16, 0.005),
        "gpu_util": 1.0 if busy else 0.0,
        "mem_copy_util": _noise(r, dram * 0.8, 0.03),
        "fb_used_bytes": max(0.0, fb_gib * GIB + r.uniform(-0.2, 0.2) * GIB),
        "fb_total_bytes": float(H100_MEM),
        "power_w": _noise(r, power, 8.0, 50.0, 700.0),
        "temp_c": _noise(r, 35 + power / 14, 1.0, 20.0, 95.0),
        "sm_clock_mhz": clock if busy else 345.0,
        "mem_clock_mhz": MEM_CLOCK,
        "clock_event_reasons": float(reasons if busy else 0x1),
        "pcie_tx_bytes_s": _noise(r, pcie_tx, pcie_tx * 0.1 + 1, 0.0, 1e12),
        "pcie_rx_bytes_s": _noise(r, pcie_rx, pcie_rx * 0.1 + 1, 0.0, 1e12),
        "nvlink_tx_bytes_s": _noise(r, nvlink, nvlink * 0.05 + 1, 0.0, 1e13),
        "nvlink_rx_bytes_s": _noise(r, nvlink, nvlink * 0.05 + 1, 0.0, 1e13),
        "ib_tx_bytes_s": _noise(r, ib, ib * 0.05 + 1, 0.0, 1e12),
        "ib_rx_bytes_s": _noise(r, ib, ib * 0.05 + 1, 0.0, 1e12),
        "xid_last": 0.0,
        "ecc_dbe_volatile": 0.0,
        "ecc_sbe_volatile": 0.0,
        "row_remap_failure": 0.0,
        "nvlink_error_count": 0.0,
        "pcie_replay_count": 0.0,
    }


# --- healthy profiles -------------------------------------------------------------------

def llm_pretrain(ctx: GpuContext) -> dict[str, float]:
    # Periodic short all-reduce dips every ~30 s keep it realistic without looking stalled.
    dip = (ctx.t % 30) < 1
    return _base(ctx, sm=0.7 if dip else 0.92, occ=0.42, tensor=0.55, dram=0.45, fb_gib=74,
                 power=640, nvlink=1.2e11, ib=2.0e10 if ctx.n_nodes > 1 else 0.0, fp16=0.05)


def vision_train(ctx: GpuContext) -> dict[str, float]:
    return _base(ctx, sm=0.86, occ=0.55, tensor=0.32, dram=0.62, fb_gib=46, power=560,
                 pcie_rx=3e9, nvlink=4e10 if ctx.n_gpus > 1 else 0.0)


def batch_inference(ctx: GpuContext) -> dict[str, float]:
    return _base(ctx, sm=0.82, occ=0.35, tensor=0.3, dram=0.7, fb_gib=60, power=520, pcie_rx=1.5e9,
                 pcie_tx=1.5e9)


def multinode_dp(ctx: GpuContext) -> dict[str, float]:
    return _base(ctx, sm=0.88, occ=0.45, tensor=0.48, dram=0.5, fb_gib=70, power=620,
                 nvlink=8e10, ib=2.2e10)


# --- inefficient profiles ---------------------------------------------------------------

def idle_gpu(ctx: GpuContext) -> dict[str, float]:
    return _base(ctx, sm=0.0, occ=0.0, tensor=0.0, dram=0.0, fb_gib=0.5, power=72, fp32=0.0,
                 fp16=0.0, pcie_rx=1e5, pcie_tx=1e5)


def low_sm_activity(ctx: GpuContext) -> dict[str, float]:
    # gpu_util reads 100% (a small kernel is always running) while SMs are mostly empty.
    d = _base(ctx, sm=0.22, occ=0.06, tensor=0.08, dram=0.12, fb_gib=30, power=210)
    d["gpu_util"] = 1.0
    return d


def no_tensor_cores(ctx: GpuContext) -> dict[str, float]:
    return _base(ctx, sm=0.8, occ=0.5, tensor=0.005, dram=0.4, fb_gib=50, power=450, fp32=0.65)


def input_stall(ctx: GpuContext) -> dict[str, float]:
    # The GPU alternates: ~4 s of compute, ~6 s waiting for the next batch from the host.
    phase = (ctx.t + ctx.rank * 0.0) % 10
    if phase < 4:
        return _base(ctx, sm=0.93, occ=0.5, tensor=0.5, dram=0.5, fb_gib=40, power=600, pcie_rx=6e9)
    return _base(ctx, sm=0.03, occ=0.01, tensor=0.0, dram=0.02, fb_gib=40, power=110, pcie_rx=2e8)


def comm_bound(ctx: GpuContext) -> dict[str, float]:
    # Network saturated (400 Gb/s NDR ~ 48 GB/s per HCA), SMs waiting on collectives.
    return _base(ctx, sm=0.32, occ=0.15, tensor=0.15, dram=0.2, fb_gib=64, power=300,
                 nvlink=3.5e11, ib=4.7e10 if ctx.n_nodes > 1 else 0.0)


def straggler(ctx: GpuContext) -> dict[str, float]:
    # One GPU (rank 0 of the last node) is thermally throttled; its peers wait at barriers.
    slow = ctx.rank == ctx.n_gpus - 1
    if slow:
        return _base(ctx, sm=0.95, occ=0.45, tensor=0.52, dram=0.5, fb_gib=70, power=420,
                     nvlink=6e10, clock=1140.0, reasons=0x40 | 0x8)
    return _base(ctx, sm=0.55, occ=0.3, tensor=0.31, dram=0.3, fb_gib=70, power=430, nvlink=6e10)


def memory_underuse(ctx: GpuContext) -> dict[str, float]:
    return _base(ctx, sm=0.12, occ=0.05, tensor=0.04, dram=0.06, fb_gib=3.5, power=130)


def throttled(ctx: GpuContext) -> dict[str, float]:
    return _base(ctx, sm=0.9, occ=0.45, tensor=0.5, dram=0.5, fb_gib=70, power=450,
                 clock=1095.0, reasons=0x4 | 0x80)


def oversized_allocation(ctx: GpuContext) -> dict[str, float]:
    # Asked for 8 GPUs, the code uses 2 (a forgotten CUDA_VISIBLE_DEVICES or single-process run).
    if ctx.rank < 2:
        return vision_train(ctx)
    return idle_gpu(ctx)


def hw_fault(ctx: GpuContext) -> dict[str, float]:
    d = llm_pretrain(ctx)
    if ctx.rank == 0 and ctx.t >= 120:
        d["xid_last"] = 48.0
        d["ecc_dbe_volatile"] = 2.0
        d["row_remap_failure"] = 1.0
    return d


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        Profile("llm_pretrain", frozenset(), llm_pretrain, healthy=True, min_gpus=8),
        Profile("vision_train", frozenset(), vision_train, healthy=True),
        Profile("batch_inference", frozenset(), batch_inference, healthy=True),
        Profile("multinode_dp", frozenset(), multinode_dp, healthy=True, min_gpus=16, multi_node=True),
        Profile("idle_gpu", frozenset({"idle_gpu"}), idle_gpu),
        Profile("low_sm_activity", frozenset({"low_sm_activity"}), low_sm_activity),
        Profile("no_tensor_cores", frozenset({"no_tensor_cores"}), no_tensor_cores),
        Profile("input_stall", frozenset({"input_stall"}), input_stall),
        Profile("comm_bound", frozenset({"comm_bound"}), comm_bound, min_gpus=16, multi_node=True),
        Profile("straggler", frozenset({"straggler"}), straggler, min_gpus=8),
        Profile("memory_underuse", frozenset({"memory_underuse"}), memory_underuse),
        Profile("throttled", frozenset({"throttled"}), throttled),
        Profile("oversized_allocation", frozenset({"oversized_allocation"}), oversized_allocation, min_gpus=8),
        Profile("hw_fault", frozenset({"hw_fault"}), hw_fault, min_gpus=8),
    ]
}


def gpu_uuid(node: str, index: int) -> str:
    h = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(slots=True)
class SimJob:
    job_id: str
    profile: Profile
    user: str
    start_ts: float
    gpus: list[tuple[str, int]]  # (node, gpu index), in rank order
    name: str = ""
    account: str = "research"
    partition: str = "gpu"

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(n for n, _ in self.gpus))

    def info(self) -> JobInfo:
        return JobInfo(job_id=self.job_id, source="simulator", user=self.user, name=self.name or self.profile.name,
                       account=self.account, partition=self.partition, num_nodes=len(self.nodes),
                       ntasks=len(self.gpus), start_ts=self.start_ts,
                       labels={"profile": self.profile.name})


@dataclass
class SimulatedFleet:
    """A fleet of ``nodes`` x ``gpus_per_node`` GPUs with jobs placed on them at start.

    About 1 in 8 GPUs is left unallocated (a real fleet is never full). Healthy and
    inefficient profiles are mixed, roughly 60/40, deterministically from ``seed``."""

    nodes: int = 16
    gpus_per_node: int = 8
    seed: int = 0
    start_ts: float = 0.0
    node_prefix: str = "sim-node"
    jobs: list[SimJob] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.jobs:
            self.jobs = place_jobs(self.node_names(), self.gpus_per_node, self.seed, self.start_ts)

    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}-{i:03d}" for i in range(self.nodes)]

    def source(self, node: str) -> SimulatedSource:
        return SimulatedSource(node=node, gpus_per_node=self.gpus_per_node, jobs=self.jobs, seed=self.seed)


def place_jobs(nodes: list[str], gpus_per_node: int, seed: int, start_ts: float) -> list[SimJob]:
    rng = random.Random(seed)
    healthy = [p for p in PROFILES.values() if p.healthy]
    sick = [p for p in PROFILES.values() if not p.healthy]
    jobs: list[SimJob] = []
    users = ["alice", "bob", "chen", "dana", "eve", "farid", "gita", "hiro"]
    jid = 100000 + rng.randrange(1000)
    i = 0
    while i < len(nodes):
        p = rng.choice(healthy) if rng.random() < 0.6 else rng.choice(sick)
        if p.multi_node and i + 1 < len(nodes):
            n_nodes = 2
            gpus = [(nodes[i + k], g) for k in range(n_nodes) for g in range(gpus_per_node)]
            i += n_nodes
        else:
            i += 1
            node = nodes[i - 1]
            if p.min_gpus >= gpus_per_node:
                gpus = [(node, g) for g in range(gpus_per_node)]
            else:
                # Split the node between a 4-GPU job of this profile, a healthy 2-GPU job,
                # and leave the rest unallocated.
                gpus = [(node, g) for g in range(min(4, gpus_per_node))]
                if gpus_per_node >= 6:
                    jid += 1
                    jobs.append(SimJob(f"{jid}", rng.choice(healthy[1:3]), rng.choice(users),
                                       start_ts - rng.uniform(60, 7200), [(node, 4), (node, 5)]))
        jid += 1
        jobs.append(SimJob(f"{jid}", p, rng.choice(users), start_ts - rng.uniform(60, 7200), gpus))
    return jobs


class SimulatedSource:
    """One simulated node, exposed through the ``Source`` interface."""

    name = "simulator"

    def __init__(self, node: str, gpus_per_node: int, jobs: list[SimJob], seed: int = 0,
                 model: str = H100) -> None:
        self.node = node
        self.gpus_per_node = gpus_per_node
        self.model = model
        self._rng = random.Random(f"{seed}/{node}")
        self._jobs = [j for j in jobs if node in j.nodes]
        self._slot: dict[int, tuple[SimJob, int, int]] = {}  # gpu index -> (job, rank, node rank)
        for j in self._jobs:
            nodes = j.nodes
            for rank, (n, g) in enumerate(j.gpus):
                if n == node:
                    self._slot[g] = (j, rank, nodes.index(n))
        self._fired: set[str] = set()
        self._pending: list[Event] = []

    def devices(self) -> list[GpuInfo]:
        return [GpuInfo(index=i, uuid=gpu_uuid(self.node, i), model=self.model,
                        memory_total_bytes=float(H100_MEM)) for i in range(self.gpus_per_node)]

    def read(self, now: float) -> list[GpuReading]:
        out = []
        for i in range(self.gpus_per_node):
            uuid = gpu_uuid(self.node, i)
            slot = self._slot.get(i)
            if slot is None:
                ctx = GpuContext(t=now, rank=0, n_gpus=1, node_rank=0, n_nodes=1, rng=self._rng)
                values = idle_gpu(ctx)
                values["fb_used_bytes"] = 0.0
                values["power_w"] = _noise(self._rng, 68.0, 2.0, 50.0, 100.0)
            else:
                job, rank, node_rank = slot
                ctx = GpuContext(t=max(0.0, now - job.start_ts), rank=rank, n_gpus=len(job.gpus),
                                 node_rank=node_rank, n_nodes=len(job.nodes), rng=self._rng)
                values = job.profile.fn(ctx)
                if values.get("xid_last") and uuid not in self._fired:
                    self._fired.add(uuid)
                    self._pending.append(Event(ts=now, kind="xid", gpu_uuid=uuid, code=int(values["xid_last"]),
                                               message="simulated XID"))
            values["energy_j"] = now * 100.0 % 1e12
            out.append(GpuReading(uuid=uuid, values=values))
        return out

    def drain_events(self) -> list[Event]:
        ev, self._pending = self._pending, []
        return ev

    def attribution(self, now: float) -> SourceAttribution:
        a = SourceAttribution()
        for i, (job, _, _) in self._slot.items():
            a.jobs[job.job_id] = job.info()
            a.gpu_job[gpu_uuid(self.node, i)] = job.job_id
        return a

    def close(self) -> None:
        pass


