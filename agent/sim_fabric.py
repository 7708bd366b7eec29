"""What a simulated node's NCCL Inspector plugin and InfiniBand HCAs would write to disk.

``gpufleet up`` gives every simulated agent a real ``InspectorSource`` (following a directory of
Inspector JSON lines files) and a real ``NicHealthSampler`` (reading a ``/sys`` tree): this module
writes those files, so the demo's collectives and NIC counters travel the agent's real path
(files -> parse -> 10 s aggregates -> batch -> collector), not a shortcut into the database.

Per node: ``<nccl_root>/nccl-inspector-<job>/<node>-pid<pid>.log`` for each rank of an NCCL job
(Profile.nccl) running there, in the Inspector's v4.0 JSON lines (one line per collective and
rank, written at the dump after it ends); and ``<sys_root>/class/infiniband/mlx5_<g>/ports/1/``
with rate, state and the counters NicHealthSampler reads, one HCA per GPU (rail g = GPU g), each
under its GPU's PCIe switch (``<sys_root>/devices/pci...``, linked from the HCA's ``device`` and
from ``bus/pci/devices/<GPU address>``), so the agent maps every NIC to its own GPU.

The collective model: every step runs one gradient AllReduce over all ranks (a ring over one
channel per rail, so the slowest link paces it) and one tensor-parallel AllGather inside each
node (NVLink). Each step's timings are drawn from the job's seed and the step number, so every
node computes the same collective independently. Faults: agent/sim_faults.py.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .sim_faults import FabricFault, fabric_fault
from .simulator import MAX_PCI_GPUS, SimJob, SimulatedFleet, gpu_pci_bus_id, pci_device_path
from .sources.base import GpuReading

MIB = 1 << 20
RAIL_GBPS = 400.0  # NDR per HCA
NVLINK_GBS = 450.0  # H100 NVLink 4, per direction
ALPHA_US = 7.0  # per ring hop
NIC_WRITE_S = 5.0  # counters advance this often (the agent's NIC sampler reads every flush, 5 s in up)
COUNTERS = ("port_xmit_wait", "symbol_error", "port_rcv_errors", "link_downed", "link_error_recovery",
            "local_link_integrity_errors", "excessive_buffer_overrun_errors", "port_xmit_discards")


@dataclass(frozen=True, slots=True)
class _JobNet:
    """A job's collective parameters, drawn once from its seed."""

    step_s: float
    grad_bytes: int
    tp_bytes: int
    efficiency: float  # what a ring achieves of the link rate
    fault: FabricFault
    dp_comm: str
    tp_comm: tuple[str, ...]


def _job_net(job: SimJob, gpus_per_node: int) -> _JobNet:
    r = random.Random(f"nccl/{job.seed}")
    n_nodes = len(job.nodes)
    return _JobNet(step_s=r.uniform(3.0, 6.0), grad_bytes=r.choice([128, 256, 512]) * MIB,
                   tp_bytes=r.choice([32, 64]) * MIB, efficiency=r.uniform(0.8, 0.92),
                   fault=fabric_fault(job.profile.name, job.seed, n_nodes, gpus_per_node),
                   dp_comm=f"0x{r.getrandbits(48):012x}",
                   tp_comm=tuple(f"0x{r.getrandbits(48):012x}" for _ in range(n_nodes)))


def ring_busbw_gbs(net: _JobNet, n_nodes: int, gpus_per_node: int, t: float) -> float:
    """Bus bandwidth (GB/s) an AllReduce over ``n_nodes`` sustains at job time ``t``: NVLink in one
    node; across nodes one channel per rail, paced by the slowest rail's link rate."""
    if n_nodes <= 1:
        return NVLINK_GBS * net.efficiency
    per_rail = min(NVLINK_GBS / gpus_per_node, RAIL_GBPS / 8)
    return gpus_per_node * per_rail * net.efficiency * net.fault.busbw_factor(t)


def _line(comm: str, comm_rank: int, n_ranks: int, n_nodes: int, node: str, pid: int, coll: str, sn: int,
          size: int, exec_us: float, bus_factor: float, dump_s: float) -> str:
    algbw = size / (exec_us * 1e3)
    return json.dumps({
        "header": {"id": comm, "rank": comm_rank, "n_ranks": n_ranks, "nnodes": n_nodes},
        "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism": "profiler_plugin",
                     "dump_timestamp_us": int(dump_s * 1e6), "hostname": node, "pid": pid},
        "coll_perf": {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": round(exec_us),
                      "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": round(algbw, 4),
                      "coll_busbw_gbs": round(algbw * bus_factor, 4)},
    }, separators=(",", ":")) + "\n"


@dataclass
class _Port:
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))
    tx: float = 0.0
    rx: float = 0.0
    written: dict[str, str] = field(default_factory=dict)


class NodeFabric:
    """The Inspector files and the /sys tree of one simulated node. ``advance(now, readings)``
    after each read of the node's GPUs (the agent then samples both, in the same cycle)."""

    def __init__(self, node: str, jobs: list[SimJob], gpus_per_node: int, nccl_root: Path, sys_root: Path) -> None:
        self.node = node
        self.gpn = gpus_per_node
        self.nccl_root = Path(nccl_root)
        self.sys_root = Path(sys_root)
        self.jobs = [j for j in jobs if node in j.nodes and j.profile.nccl]
        self.all_jobs = [j for j in jobs if node in j.nodes]
        self._net = {j.job_id: _job_net(j, gpus_per_node) for j in self.jobs}
        self._next_step: dict[str, int] = {}
        self._sn: dict[tuple[str, int], int] = {}
        self._ports = [_Port() for _ in range(gpus_per_node)]
        self._wait_base = [random.Random(f"{node}/wait/{g}").uniform(40, 400) for g in range(gpus_per_node)]
        self._nic_t: float | None = None
        self._rng = random.Random(f"{node}/nics")
        self.lines = 0  # Inspector lines written (bench)
        # Only a node that runs a multi-node NCCL job gets a /sys/class/infiniband tree: reading
        # eight ports every 5 s costs the replay as much as the GPUs, and only those ports move.
        # The ports exist before the node's agent starts: it looks for them once, when it is built.
        self.has_nics = any(len(j.nodes) >= 2 for j in self.jobs)
        for g, port in enumerate(self._ports if self.has_nics else []):
            p = self._port_dir(g)
            (p / "counters").mkdir(parents=True, exist_ok=True)
            (p / "counters_ext").mkdir(exist_ok=True)
            self._put(port, p / "link_layer", "InfiniBand\n")
            self._put(port, p / "state", "4: ACTIVE\n")
            self._put(port, p / "phys_state", "5: LinkUp\n")
            self._pci_topology(g)

    def _pci_topology(self, g: int) -> None:
        """GPU g and its rail's HCA (mlx5_g) under one PCIe switch, as the agent's InfiniBand
        sampler reads them (class/infiniband/<hca>/device, bus/pci/devices/<GPU address>): each
        NIC then carries its own GPU's traffic, not the node's total on every GPU."""
        if g >= MAX_PCI_GPUS:
            return
        devices = self.sys_root / "devices"
        numa = "0\n" if g < 4 else "1\n"
        for nic, link in ((False, self.sys_root / "bus" / "pci" / "devices" / gpu_pci_bus_id(g)),
                          (True, self.sys_root / "class" / "infiniband" / f"mlx5_{g}" / "device")):
            d = devices / pci_device_path(g, nic=nic)
            d.mkdir(parents=True, exist_ok=True)
            (d / "numa_node").write_text(numa)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(os.path.relpath(d, link.parent))

    # --- NCCL Inspector --------------------------------------------------------------------

    def _write_steps(self, job: SimJob, now: float) -> None:
        net = self._net[job.job_id]
        t_now = now - job.start_ts
        if t_now <= 0 or (job.end_ts is not None and now >= job.end_ts + net.step_s):
            return
        first = self._next_step.get(job.job_id)
        if first is None:  # the plugin's files start when this process (the agent) first sees the job
            first = int(t_now / net.step_s)
        nodes = job.nodes
        ranks = [r for r, (n, _) in enumerate(job.gpus) if n == self.node]
        out: dict[int, list[str]] = {r: [] for r in ranks}
        s = first
        while True:
            t0 = s * net.step_s
            lines = self._step(job, net, s, t0, nodes, ranks, t_now)
            if lines is None:
                break
            for r, text in lines:
                out[r].append(text)
            s += 1
        self._next_step[job.job_id] = s
        d = self.nccl_root / f"nccl-inspector-{job.job_id}"
        for r, texts in out.items():
            if texts:
                d.mkdir(parents=True, exist_ok=True)
                with open(d / f"{self.node}-pid{40000 + r}.log", "a") as f:
                    f.writelines(texts)
                self.lines += len(texts)

    def _step(self, job: SimJob, net: _JobNet, s: int, t0: float, nodes: list[str], ranks: list[int],
              t_now: float) -> list[tuple[int, str]] | None:
        """The lines of step ``s`` for this node's ranks, or None when its collectives have not
        all been dumped by ``t_now`` (job time)."""
        rng = random.Random(f"{job.seed}/step/{s}")  # the same draws on every node of the job
        n, n_nodes = len(job.gpus), len(nodes)
        cursor = t0 + net.step_s * 0.7  # the backward pass's gradient all-reduce
        calls = [(net.dp_comm, list(range(n)), "AllReduce", net.grad_bytes, n_nodes)]
        calls += [(net.tp_comm[k], [r for r, (nd, _) in enumerate(job.gpus) if nd == nodes[k]], "AllGather",
                   net.tp_bytes, 1) for k in range(n_nodes)]
        fault = net.fault
        slow_link = fault.kind == "flapping_nic" and fault.active(cursor)
        late = fault.node_rank * self.gpn + fault.rail if slow_link else -1
        lines: list[tuple[int, str]] = []
        for comm, members, coll, size, span in calls:
            k = len(members)
            bus = 2 * (k - 1) / k if coll == "AllReduce" else (k - 1) / k
            bw = ring_busbw_gbs(net, span, self.gpn, cursor) * math.exp(rng.gauss(0, 0.04))
            t_us = 2 * (k - 1) * ALPHA_US + size * bus / (bw * 1e3)
            lag = 0.0
            if late in members and span > 1:
                # The rank behind the slow link drains its previous sends late: it enters last.
                healthy = ring_busbw_gbs(net, span, self.gpn, -1.0)
                lag = 0.6 * size * bus / 1e3 * (1 / bw - 1 / healthy) + 900.0
            arrive = {r: abs(rng.gauss(0, 250.0)) + (lag if r == late else 0.0) for r in members}
            done = max(arrive.values()) + t_us
            end = cursor + done / 1e6
            dump = math.ceil(end)  # the dump thread writes once a second
            if dump > t_now:
                return None
            for r in members:
                if r not in ranks:
                    continue
                key = (comm, r)
                self._sn[key] = self._sn.get(key, 0) + 1
                exec_us = done - arrive[r] + abs(rng.gauss(0, 5.0))
                lines.append((r, _line(comm, members.index(r), k, span, self.node, 40000 + r, coll, self._sn[key],
                                       size, exec_us, bus, job.start_ts + dump)))
            cursor = end
        return lines

    # --- /sys/class/infiniband ----------------------------------------------------------------

    def _port_dir(self, g: int) -> Path:
        return self.sys_root / "class" / "infiniband" / f"mlx5_{g}" / "ports" / "1"

    def _put(self, port: _Port, path: Path, text: str) -> None:
        before = port.written.get(path.name)
        if before != text:  # an unchanged file is not rewritten (cheap on 2 cores)
            data = text.encode()
            # No O_TRUNC: ext4 writes out the blocks of a file truncated to zero at its close
            # (auto_da_alloc, for editors that rewrite in place), 1 ms a write on a busy disk,
            # 200x the write itself. A counter's text only grows; a shorter one is cut after.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)  # half pathlib's cost
            try:
                os.write(fd, data)
                if before is None or len(data) < len(before):
                    os.ftruncate(fd, len(data))
            finally:
                os.close(fd)
            port.written[path.name] = text

    def _write_nics(self, now: float, readings: list[GpuReading]) -> None:
        if not self.has_nics:
            return
        dt = 0.0 if self._nic_t is None else now - self._nic_t
        if self._nic_t is not None and dt < NIC_WRITE_S:
            return
        self._nic_t = now
        running = [j for j in self.all_jobs if j.start_ts <= now and (j.end_ts is None or now < j.end_ts)]
        for g, port in enumerate(self._ports):
            # xmit_wait ticks while a port has data to send and the peer gives no credit: only
            # a multi-node NCCL job's rails see it; an idle port's counters stand still.
            rate, wait = RAIL_GBPS, 0.0
            for j in running:
                if not j.profile.nccl or len(j.nodes) < 2:
                    continue
                wait = self._wait_base[g]
                f = self._net[j.job_id].fault
                me = j.nodes.index(self.node)
                t = now - j.start_ts
                if f.kind == "congestion" and f.active(t):
                    wait *= 2.0 + f.severity * 2  # back-pressure from the shared spine, spread by adaptive routing
                elif f.kind == "flapping_nic" and f.active(t) and me == f.node_rank and g == f.rail:
                    rate = RAIL_GBPS * f.severity
                    wait = self._rng.uniform(2e6, 5e6)  # the send queue behind the slow link
                elif f.kind == "dirty_cable" and me == f.node_rank and g == f.rail and dt > 0:
                    errs = f.errors_per_min * dt / 60.0 * self._rng.uniform(0.5, 1.5)
                    port.counters["symbol_error"] += errs
                    port.counters["port_rcv_errors"] += errs * self._rng.uniform(0.1, 0.4)
                    if self._rng.random() < 0.02:
                        port.counters["link_error_recovery"] += 1
            port.counters["port_xmit_wait"] += wait * dt
            if g < len(readings):
                gv = readings[g].values
                port.tx += gv.get("ib_tx_bytes_s", 0.0) * dt * rate / RAIL_GBPS
                port.rx += gv.get("ib_rx_bytes_s", 0.0) * dt * rate / RAIL_GBPS
            p = self._port_dir(g)
            self._put(port, p / "rate", f"{rate:g} Gb/sec (4X {'NDR' if rate >= 400 else 'HDR'})\n")
            for name, v in port.counters.items():
                self._put(port, p / "counters" / name, f"{int(v)}\n")
            self._put(port, p / "counters_ext" / "port_xmit_data_64", f"{int(port.tx) // 4}\n")
            self._put(port, p / "counters_ext" / "port_rcv_data_64", f"{int(port.rx) // 4}\n")

    def advance(self, now: float, readings: list[GpuReading]) -> None:
        for j in self.jobs:
            if j.start_ts <= now:
                self._write_steps(j, now)
        self._write_nics(now, readings)


class FabricSimSource:
    """A SimulatedSource that also writes its node's fabric files before handing out readings."""

    def __init__(self, inner: object, fabric: NodeFabric, fleet_jobs: list[SimJob] | None = None) -> None:
        self.inner = inner
        self.fabric = fabric
        self.name = "simulator"
        self.fleet_jobs = fleet_jobs or []  # every job of the fleet (the progress driver's)
        self.hooks: list[Callable[[float], None]] = []  # run after each read (agent/sim_progress.py)

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)

    def read(self, now: float) -> list[GpuReading]:
        readings: list[GpuReading] = self.inner.read(now)  # type: ignore[attr-defined]
        self.fabric.advance(now, readings)
        for hook in self.hooks:
            hook(now)
        return readings


def fabric_sources(fleet: SimulatedFleet, root: Path) -> list[tuple[str, FabricSimSource]]:
    """(node, source) for every node of ``fleet``, writing under ``root``: ``root/nccl`` (the
    agents' --nccl-inspector-dir) and ``root/sys/<node>`` (each agent's --sys-root). ``root`` is
    emptied first: it is the simulator's own, and records of an earlier run would be read again."""
    shutil.rmtree(root, ignore_errors=True)
    out = []
    for node in fleet.node_names():
        nf = NodeFabric(node, fleet.jobs, fleet.gpus_per_node, root / "nccl", root / "sys" / node)
        out.append((node, FabricSimSource(fleet.source(node), nf, fleet.jobs)))
    return out
