"""A small model of data-parallel training over a two-tier fabric, writing what NCCL's
Inspector plugin and the InfiniBand driver would show. No real NCCL runs here.

Fabric: ``gpus_per_node`` GPUs per node joined by NVLink; GPU ``g`` of every node uses NIC
``mlx5_<g>`` (rail ``g``) to leave the node. A ring all-reduce over several nodes runs one channel
per rail and splits the message equally over channels, so the slowest link of any channel sets
everyone's time (busbw = channels x the slowest channel's bandwidth). A single-node communicator
only uses NVLink.

A degraded NIC (link retrained at half rate) therefore lowers every rank's bus bandwidth. The
rank whose GPU sends through it drains its previous sends late (``port_xmit_wait`` climbs), so it
enters each collective last: it waits least, and its exec time is the shortest while its peers'
grow. Without a fault, arrival order is random jitter and no rank is consistently first or last.

Output: per rank process ``<dir>/nccl-inspector-<jobid>/<host>-pid<pid>.log`` in the Inspector's
v4.0 JSON lines (optionally verbose), or Prometheus textfiles; and a fake ``/sys`` per node.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class NicFault:
    node: str
    rail: int
    start: float  # epoch seconds
    rate_factor: float = 0.5  # link retrained at this share of its rate


@dataclass
class Fabric:
    nodes: list[str]
    gpus_per_node: int = 8
    nvlink_gbs: float = 450.0  # NVLink 4 bus bandwidth per GPU
    nic_gbps: float = 400.0  # NDR per rail
    efficiency: float = 0.9  # protocol overhead: what a ring achieves of the link rate
    alpha_us: float = 6.0  # per ring step latency
    faults: list[NicFault] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return len(self.nodes) * self.gpus_per_node

    def nic_rate_gbps(self, node: str, rail: int, t: float) -> float:
        f = 1.0
        for x in self.faults:
            if x.node == node and x.rail == rail and t >= x.start:
                f = min(f, x.rate_factor)
        return self.nic_gbps * f

    def ring_busbw_gbs(self, node_names: list[str], t: float) -> float:
        """What a ring over these nodes sustains, GB/s of bus bandwidth."""
        if len(node_names) == 1:
            return self.nvlink_gbs * self.efficiency
        per_channel = min(self.nvlink_gbs / self.gpus_per_node,
                          min(self.nic_rate_gbps(n, c, t) / 8 for n in node_names for c in range(self.gpus_per_node)))
        return self.gpus_per_node * per_channel * self.efficiency

    def late_ranks(self, t: float) -> set[int]:
        """Ranks whose GPU sends through a degraded NIC at time t."""
        out = set()
        for x in self.faults:
            if t >= x.start:
                out.add(self.nodes.index(x.node) * self.gpus_per_node + x.rail)
        return out


@dataclass(frozen=True)
class Comm:
    comm_id: str
    coll: str
    ranks: tuple[int, ...]  # global ranks in communicator order
    size: int  # bytes per call
    per_step: int = 1


BUSBW_FACTOR = {"AllReduce": lambda n: 2 * (n - 1) / n, "AllGather": lambda n: (n - 1) / n,
                "ReduceScatter": lambda n: (n - 1) / n}


@dataclass
class TrainingJob:
    job_id: str
    fabric: Fabric
    start: float
    duration_s: float
    step_s: float = 2.0
    grad_buckets: int = 2  # all-reduces of grad_bucket_bytes per step on the data-parallel comm
    grad_bucket_bytes: int = 256 * MIB
    tp_allgather_bytes: int = 64 * MIB  # one per step on each node's tensor-parallel comm
    checkpoint_every_s: float = 300.0  # a 4 GiB all-reduce (optimizer state sync) at each checkpoint
    checkpoint_bytes: int = 4 * GIB
    jitter: float = 0.05  # lognormal sigma of step-to-step collective time
    arrival_jitter_us: float = 200.0
    dump_interval_s: float = 1.0  # the Inspector's dump thread interval
    seed: int = 1

    def comms(self) -> list[Comm]:
        n = self.fabric.ranks
        g = self.fabric.gpus_per_node
        dp = Comm("0x%014x" % (0x5eed0000 + int(self.job_id) % 65536), "AllReduce", tuple(range(n)),
                  self.grad_bucket_bytes, self.grad_buckets)
        tps = [Comm("0x%014x" % (0x7a000000 + k * 256 + int(self.job_id) % 256), "AllGather",
                    tuple(range(k * g, (k + 1) * g)), self.tp_allgather_bytes) for k in range(len(self.fabric.nodes))]
        return [dp, *tps]

    def node_of(self, rank: int) -> str:
        return self.fabric.nodes[rank // self.fabric.gpus_per_node]

    def pid_of(self, rank: int) -> int:
        return 40000 + rank

    def records(self, until: float | None = None, since: float | None = None):
        """Yield (rank, record dict) in time order, as the ranks' dump threads would write them:
        the steps that start in [since, until). The same seed gives the same job."""
        rng = random.Random(self.seed)
        comms = self.comms()
        dp = comms[0]
        end = self.start + self.duration_s if until is None else min(until, self.start + self.duration_s)
        sn: dict[tuple[str, int], int] = {}
        step = 0
        last_ckpt = self.start
        t = self.start
        while t < end:
            calls: list[tuple[Comm, int]] = []
            for c in comms:
                calls.extend((c, c.size) for _ in range(c.per_step))
            if t - last_ckpt >= self.checkpoint_every_s:
                calls.append((dp, self.checkpoint_bytes))
                last_ckpt = t
            cursor = t
            for comm, size in calls:
                nodes = sorted({self.node_of(r) for r in comm.ranks}, key=self.fabric.nodes.index)
                n = len(comm.ranks)
                link = self.fabric.ring_busbw_gbs(nodes, cursor) * math.exp(rng.gauss(0, self.jitter))
                factor = BUSBW_FACTOR[comm.coll](n)
                t_us = 2 * (n - 1) * self.fabric.alpha_us + size * factor / (link * 1e3)
                late = self.fabric.late_ranks(cursor) & set(comm.ranks)
                # the late rank enters after its peers by a share of the slowdown it causes
                lag_us = 0.0
                if late:
                    healthy = self.fabric.ring_busbw_gbs(nodes, -1.0)
                    lag_us = 0.6 * size * factor / 1e3 * (1 / link - 1 / healthy) + 3 * self.arrival_jitter_us
                arrive = {r: abs(rng.gauss(0, self.arrival_jitter_us)) + (lag_us if r in late else 0.0)
                          for r in comm.ranks}
                done = max(arrive.values()) + t_us
                for r in comm.ranks:
                    exec_us = done - arrive[r] + abs(rng.gauss(0, 5.0))
                    if since is not None and t < since:
                        continue
                    algbw = size / (exec_us * 1e3)
                    k = (comm.comm_id, r)
                    sn[k] = sn.get(k, 0) + 1
                    end_ts = cursor + done / 1e6
                    dump_ts = math.ceil(end_ts / self.dump_interval_s) * self.dump_interval_s
                    yield r, {
                        "header": {"id": comm.comm_id, "rank": comm.ranks.index(r), "n_ranks": n, "nnodes": len(nodes)},
                        "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "",
                                     "rec_mechanism": "profiler_plugin", "dump_timestamp_us": int(dump_ts * 1e6),
                                     "hostname": self.node_of(r), "pid": self.pid_of(r)},
                        "coll_perf": {"coll": comm.coll, "coll_sn": sn[k], "coll_msg_size_bytes": size,
                                      "coll_exec_time_us": round(exec_us), "coll_timing_source": "kernel_gpu",
                                      "coll_algobw_gbs": round(algbw, 6), "coll_busbw_gbs": round(algbw * factor, 6)},
                        "_start_ts": cursor + arrive[r] / 1e6, "_end_ts": end_ts,
                    }
                cursor += done / 1e6
            step += 1
            t = self.start + step * self.step_s

    # --- writers ---------------------------------------------------------------------------

    def dump_dir(self, root: Path) -> Path:
        return root / f"nccl-inspector-{self.job_id}"

    def log_path(self, root: Path, rank: int) -> Path:
        return self.dump_dir(root) / f"{self.node_of(rank)}-pid{self.pid_of(rank)}.log"

    def write_json(self, root: Path, *, verbose: bool = False, until: float | None = None,
                   since: float | None = None, nodes: set[str] | None = None) -> int:
        """Write (append) the JSON lines; returns the number of records written."""
        self.dump_dir(root).mkdir(parents=True, exist_ok=True)
        handles: dict[int, object] = {}
        n = 0
        try:
            for rank, rec in self.records(until, since):
                if nodes is not None and self.node_of(rank) not in nodes:
                    continue
                f = handles.get(rank)
                if f is None:
                    f = handles[rank] = open(self.log_path(root, rank), "a")  # noqa: SIM115
                f.write(to_json_line(rec, verbose=verbose))  # type: ignore[attr-defined]
                n += 1
        finally:
            for f in handles.values():
                f.close()  # type: ignore[attr-defined]
        return n


def to_json_line(rec: dict, *, verbose: bool = False) -> str:
    out = {k: v for k, v in rec.items() if not k.startswith("_")}
    if verbose:
        perf = dict(out["coll_perf"])
        s, e = int(rec["_start_ts"] * 1e6), int(rec["_end_ts"] * 1e6)
        perf["event_trace_sn"] = {"coll_start_sn": 1, "coll_stop_sn": 2, "kernel_events": [
            {"channel_id": c, "kernel_start_sn": 3 + 2 * c, "kernel_stop_sn": 4 + 2 * c,
             "kernel_record_sn": 4 + 2 * c} for c in range(2)]}
        perf["event_trace_ts"] = {"coll_start_ts": s, "coll_stop_ts": s + 5, "kernel_events": [
            {"channel_id": c, "kernel_start_ts": s + 100, "kernel_stop_ts": e, "kernel_record_ts": e}
            for c in range(2)]}
        out["coll_perf"] = perf
    return json.dumps(out, separators=(",", ":")) + "\n"


def prom_text(recs: list[dict], job_id: str, gpu_index: dict[int, int]) -> str:
    """The Inspector's Prometheus textfile for the newest record of each label set."""
    lines = []
    for rec in recs:
        h, m, p = rec["header"], rec["metadata"], rec["coll_perf"]
        size = p["coll_msg_size_bytes"]
        label = (f'comm_id="{h["id"]}",collective="{p["coll"]}",hostname="{m["hostname"]}",rank="{h["rank"]}",'
                 f'slurm_job="train",slurm_job_id="{job_id}",pid="{m["pid"]}",n_ranks="{h["n_ranks"]}",'
                 f'n_nodes="{h["nnodes"]}",coll_sn="{p["coll_sn"]}",coll_timing_source="{p["coll_timing_source"]}",'
                 f'timestamp="2026-12-01T10:00:00Z",gpu_device_id="GPU{gpu_index[h["rank"]]}",'
                 f'message_size="{size / MIB:.2f}MB"')
        lines.append(f"nccl_algorithm_bandwidth_gbs{{{label}}} {p['coll_algobw_gbs']}")
        lines.append(f"nccl_bus_bandwidth_gbs{{{label}}} {p['coll_busbw_gbs']}")
        lines.append(f"nccl_collective_exec_time_microseconds{{{label}}} {p['coll_exec_time_us']}")
    return "# HELP nccl_bus_bandwidth_gbs NCCL bus bandwidth in GB/s\n# TYPE nccl_bus_bandwidth_gbs gauge\n" + \
        "\n".join(lines) + "\n"


# --- InfiniBand / RoCE sysfs -----------------------------------------------------------------

IB_COUNTERS = ("port_xmit_wait", "port_rcv_errors", "symbol_error", "link_downed", "local_link_integrity_errors",
               "excessive_buffer_overrun_errors", "port_xmit_discards", "link_error_recovery")
ROCE_HW_COUNTERS = ("out_of_sequence", "packet_seq_err", "np_cnp_sent", "rp_cnp_handled", "local_ack_timeout_err",
                    "np_ecn_marked_roce_packets")


@dataclass
class NodeSysfs:
    """A fake ``/sys`` for one node: ``gpus_per_node`` HCAs, one port each, counters that grow
    with traffic; a degraded NIC shows half its rate and a climbing ``port_xmit_wait``."""

    root: Path
    node: str
    fabric: Fabric
    link_layer: str = "InfiniBand"  # or "Ethernet" (RoCE: adds hw_counters)
    traffic_gbs: float = 20.0  # average per-NIC payload while training
    counters: dict[tuple[int, str], int] = field(default_factory=dict)
    last_t: float | None = None
    _written: dict[Path, str] = field(default_factory=dict, repr=False)

    def _put(self, path: Path, text: str) -> None:
        if self._written.get(path) != text:  # a file that did not change is not rewritten (speed)
            path.write_text(text)
            self._written[path] = text

    def port(self, rail: int) -> Path:
        return self.root / "class" / "infiniband" / f"mlx5_{rail}" / "ports" / "1"

    def write(self, t: float) -> None:
        """Advance the counters to time t and write the tree."""
        dt = 0.0 if self.last_t is None else max(0.0, t - self.last_t)
        self.last_t = t
        for rail in range(self.fabric.gpus_per_node):
            p = self.port(rail)
            (p / "counters").mkdir(parents=True, exist_ok=True)
            (p / "counters_ext").mkdir(exist_ok=True)
            rate = self.fabric.nic_rate_gbps(self.node, rail, t)
            degraded = rate < self.fabric.nic_gbps
            c = self.counters
            bytes_ = int(self.traffic_gbs * 1e9 * dt * (rate / self.fabric.nic_gbps if degraded else 1.0))
            c[rail, "tx"] = c.get((rail, "tx"), 0) + bytes_ // 4
            c[rail, "rx"] = c.get((rail, "rx"), 0) + bytes_ // 4
            # xmit_wait ticks: a trickle when healthy; the backlog behind a slow link grows steadily
            c[rail, "port_xmit_wait"] = c.get((rail, "port_xmit_wait"), 0) + int(dt * (2e6 if degraded else 200))
            for name in IB_COUNTERS:
                if name != "port_xmit_wait":
                    c.setdefault((rail, name), 0)
            self._put(p / "counters_ext" / "port_xmit_data_64", f"{c[rail, 'tx']}\n")
            self._put(p / "counters_ext" / "port_rcv_data_64", f"{c[rail, 'rx']}\n")
            self._put(p / "counters" / "port_xmit_data", f"{c[rail, 'tx'] & 0xFFFFFFFF}\n")
            self._put(p / "counters" / "port_rcv_data", f"{c[rail, 'rx'] & 0xFFFFFFFF}\n")
            for name in IB_COUNTERS:
                self._put(p / "counters" / name, f"{c[rail, name]}\n")
            speed = "NDR" if rate >= 400 else "HDR" if rate >= 200 else "EDR"
            self._put(p / "rate", f"{rate:g} Gb/sec (4X {speed})\n")
            self._put(p / "state", "4: ACTIVE\n")
            self._put(p / "phys_state", "5: LinkUp\n")
            self._put(p / "link_layer", f"{self.link_layer}\n")
            if self.link_layer == "Ethernet":
                (p / "hw_counters").mkdir(exist_ok=True)
                for name in ROCE_HW_COUNTERS:
                    grow = int(dt * (500 if degraded and name in ("np_cnp_sent", "rp_cnp_handled") else 0))
                    c[rail, name] = c.get((rail, name), 0) + grow
                    self._put(p / "hw_counters" / name, f"{c[rail, name]}\n")

    def bump(self, rail: int, name: str, by: int) -> None:
        self.counters[rail, name] = self.counters.get((rail, name), 0) + by
