"""NIC health from a fake sysfs, and the whole agent path: Inspector files + NIC counters ->
journal -> spool batches (protocol sections), across a killed agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.sources.nic_health import NicHealthSampler, parse_rate, parse_state
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.agent.spool import Spool
from gpufleet.protocol import Batch, decode

from ..support.fake_nvml import FakeNvml, h100
from .fabric_model import Fabric, NicFault, NodeSysfs, TrainingJob

T0 = 1_764_583_200.0


def test_rate_and_state_parse() -> None:
    assert parse_rate("400 Gb/sec (4X NDR)\n") == 400.0 and parse_rate("junk") is None
    assert parse_state("4: ACTIVE\n") == "ACTIVE" and parse_state("1: DOWN") == "DOWN"


@pytest.mark.parametrize("layer", ["InfiniBand", "Ethernet"])
def test_nic_health_counters_rate_state(tmp_path: Path, layer: str) -> None:
    fab = Fabric(nodes=["n0"], gpus_per_node=2, faults=[NicFault("n0", 1, T0 + 20)])
    sysfs = NodeSysfs(tmp_path, "n0", fab, link_layer=layer)
    nic = NicHealthSampler(tmp_path, interval_s=10)
    sysfs.write(T0)
    assert nic.sample(T0) == [], "an increase needs two reads"
    assert nic.sample(T0 + 5) == [], "not before the interval"
    sysfs.write(T0 + 10)
    healthy = {s.nic: s for s in nic.sample(T0 + 10)}
    assert set(healthy) == {"mlx5_0/1", "mlx5_1/1"}
    h = healthy["mlx5_1/1"]
    assert (h.rate_gbps, h.state, h.link_layer, h.interval_s) == (400.0, "ACTIVE", layer, 10.0)
    assert h.tx_bytes_s == pytest.approx(20e9, rel=1e-6)
    assert h.counters["port_xmit_wait"] == 2000 and h.counters["symbol_error"] == 0
    sysfs.bump(1, "symbol_error", 7)
    sysfs.write(T0 + 30)
    bad = {s.nic: s for s in nic.sample(T0 + 30)}
    b = bad["mlx5_1/1"]
    assert b.rate_gbps == 200.0 and b.counters["port_xmit_wait"] > 1000 * bad["mlx5_0/1"].counters["port_xmit_wait"]
    assert b.counters["symbol_error"] == 7
    if layer == "Ethernet":
        assert b.counters["np_cnp_sent"] > 0 and bad["mlx5_0/1"].counters["np_cnp_sent"] == 0
    else:
        assert "np_cnp_sent" not in b.counters, "absent on IB: not available, not zero"


def test_reset_and_saturated_counters_are_unknown(tmp_path: Path) -> None:
    fab = Fabric(nodes=["n0"], gpus_per_node=1)
    sysfs = NodeSysfs(tmp_path, "n0", fab)
    nic = NicHealthSampler(tmp_path, interval_s=1)
    sysfs.write(T0)
    nic.sample(T0)
    sysfs.counters[0, "port_rcv_errors"] = 0xFFFFFFFF
    sysfs.counters[0, "symbol_error"] = 5
    sysfs.write(T0 + 1)
    (s,) = nic.sample(T0 + 1)
    assert "port_rcv_errors" not in s.counters and s.counters["symbol_error"] == 5
    sysfs.counters[0, "symbol_error"] = 0  # driver reload
    sysfs.write(T0 + 2)
    (s,) = nic.sample(T0 + 2)
    assert "symbol_error" not in s.counters


def _batches(spool_dir: Path) -> list[Batch]:
    out = []
    for it in Spool(spool_dir, 2**30)._items:
        header, body = it.read()
        if header["headers"].get("Content-Encoding") == "zstd":
            body = zstandard.ZstdDecompressor().decompress(body)
        out.append(decode(body, header["headers"]["Content-Type"]))
    return out


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_agent_sends_collectives_and_nics_through_the_spool_and_survives_a_kill(tmp_path: Path) -> None:
    fab = Fabric(nodes=["gpu-00", "gpu-01"], gpus_per_node=2)
    job = TrainingJob("4242", fab, T0, 60.0, step_s=1.0)
    dumps = tmp_path / "dumps"
    job.write_json(dumps, until=T0 + 30)
    sys = tmp_path / "sys"
    sysfs = NodeSysfs(sys, "gpu-00", fab)
    gpus = [h100(i, node="gpu-00") for i in range(2)]
    for i, g in enumerate(gpus):
        g.pids = [job.pid_of(i)]
    spool = tmp_path / "spool"
    cfg = AgentConfig(collector_url="http://127.0.0.1:9", node="gpu-00", spool_dir=spool, fsync=False,
                      nccl_inspector_dir=dumps, sys_root=sys, proc_root=tmp_path / "proc", attributors=("none",))
    sysfs.write(T0)
    clock = Clock(T0)
    agent = Agent(cfg, NvmlSource(FakeNvml(gpus), xid_events=False), clock=clock)
    assert agent.fabric is not None and agent.fabric.inspector is not None and agent.fabric.nics is not None
    agent.fabric.inspector.hostname = "gpu-00"
    agent.start()
    for k in range(1, 41):  # 40 s of 1 Hz cycles: reads the 30 s backlog, hands out windows 15 s after they end
        clock.t = T0 + k
        sysfs.write(clock.t)
        agent.cycle(clock.t)
        if k % 10 == 0:
            agent.flush()
    first = _batches(spool)
    colls = [c for b in first for c in b.collectives]
    assert colls and {c.job_id for c in colls} == {"4242"}
    assert {c.gpu_uuid for c in colls} == {g.uuid for g in gpus}, "pid -> GPU from NVML's process list"
    nics = [n for b in first for n in b.nics]
    assert {n.nic for n in nics} == {"mlx5_0/1", "mlx5_1/1"} and all(n.rate_gbps == 400.0 for n in nics)
    assert {(g.gpu_uuid, g.nic) for b in first for g in b.gpu_nics}, "the rails travel with the NIC samples"
    state = json.loads((spool / "nccl_offsets.json").read_text())
    assert state["files"], "offsets persisted next to the spool"

    # killed mid-batch: cycles journaled but not flushed; the rest of the job is written later
    for k in range(41, 46):
        clock.t = T0 + k
        agent.cycle(clock.t)
    agent.journal.close()
    agent.spool.unlock()
    del agent
    job.write_json(dumps, since=T0 + 30)  # the job carries on writing
    agent2 = Agent(cfg, NvmlSource(FakeNvml(gpus), xid_events=False), clock=clock)
    agent2.fabric.inspector.hostname = "gpu-00"
    agent2.start()  # the journal of the killed run becomes a batch
    for k in range(46, 120):
        clock.t = T0 + k
        sysfs.write(clock.t)
        agent2.cycle(clock.t)
    agent2.flush()
    counts: dict[tuple[str, int, float, int], int] = {}
    for b in _batches(spool):
        for c in b.collectives:
            key = (c.comm, c.rank, c.ts, c.size_bucket)
            counts[key] = counts.get(key, 0) + c.count
    expected: dict[tuple[str, int, float, int], int] = {}
    from gpufleet.nccl_fold import size_bucket

    for rank, rec in job.records():
        if job.node_of(rank) != "gpu-00":
            continue
        w = (rec["metadata"]["dump_timestamp_us"] // 10_000_000) * 10.0
        key = (rec["header"]["id"], rec["header"]["rank"], w, size_bucket(rec["coll_perf"]["coll_msg_size_bytes"]))
        expected[key] = expected.get(key, 0) + 1
    assert counts == expected, "every collective of this node exactly once across the kill"


def test_bad_offsets_file_and_a_failing_section_lose_nothing_else(tmp_path: Path) -> None:
    from gpufleet.agent.sources.fabric_sections import FabricSections
    from gpufleet.agent.sources.nccl_inspector import InspectorSource

    state = tmp_path / "spool" / "nccl_offsets.json"
    state.parent.mkdir()
    state.write_text('{"v": 1, "files": {"1:2": {"offset": "x"}}}')
    src = InspectorSource(tmp_path / "none", state, hostname="gpu-00")
    assert src.files == {}, "a malformed offsets file: every file is read from its start"

    class Boom:
        state_path = state

        def update_gpus(self, *a: object) -> None:
            raise RuntimeError("boom")

    gpus = [h100(0, node="gpu-00")]
    cfg = AgentConfig(collector_url="http://127.0.0.1:9", node="gpu-00", spool_dir=tmp_path / "spool2", fsync=False,
                      sys_root=tmp_path / "sys", proc_root=tmp_path / "proc", attributors=("none",))
    agent = Agent(cfg, NvmlSource(FakeNvml(gpus), xid_events=False), clock=Clock(T0))
    agent.fabric = FabricSections(Boom())  # type: ignore[arg-type]
    agent.start()
    for k in range(3):
        agent.cycle(T0 + k)
    assert agent.flush() and agent.fabric.failures == 3
    (b,) = _batches(tmp_path / "spool2")
    assert b.n_rows() == 3, "the GPU rows of every cycle are kept"


def test_inspector_counters_on_the_agents_metrics(tmp_path: Path) -> None:
    """Malformed Inspector output is counted where an operator scrapes the agent, not only logged."""
    from prometheus_client import generate_latest

    fab = Fabric(nodes=["gpu-00"], gpus_per_node=1)
    job = TrainingJob("77", fab, T0, 60.0, step_s=1.0)
    dumps = tmp_path / "dumps"
    job.write_json(dumps, until=T0 + 20)
    (f,) = [p for p in dumps.rglob("*") if p.is_file()]
    with f.open("a") as out:
        out.write("this is not an inspector record\n{\"half\": \n")
    gpus = [h100(0, node="gpu-00")]
    gpus[0].pids = [job.pid_of(0)]
    cfg = AgentConfig(collector_url="http://127.0.0.1:9", node="gpu-00", spool_dir=tmp_path / "spool", fsync=False,
                      nccl_inspector_dir=dumps, sys_root=tmp_path / "sys", proc_root=tmp_path / "proc",
                      attributors=("none",), nic_health=False)
    agent = Agent(cfg, NvmlSource(FakeNvml(gpus), xid_events=False), clock=Clock(T0))
    agent.fabric.inspector.hostname = "gpu-00"
    agent.start()
    for k in range(1, 5):
        agent.cycle(T0 + k)

    def value(name: str) -> float:
        for line in generate_latest(agent.metrics.registry).decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not exposed")

    src = agent.fabric.inspector
    assert src.records > 0 and src.bad_lines == 2
    assert value("gpufleet_agent_nccl_inspector_records_total") == src.records
    assert value("gpufleet_agent_nccl_inspector_bad_lines_total") == 2
    assert value("gpufleet_agent_nccl_inspector_files") == 1
    assert value("gpufleet_agent_nccl_inspector_read_errors_total") == 0
