"""The agent loop: cycles, batching, journal recovery, attribution wiring, enrichment,
and the local /metrics endpoint."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import msgspec
import zstandard

from gpufleet.agent.attribution.slurm import SlurmAttributor
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.simulator import SimulatedFleet
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.agent.spool import Spool
from gpufleet.protocol import Batch, decode

from ..support.fake_nvml import FakeNvml, h100
from .conftest import TickClock
from .test_attribution import CG_V2, fake_proc

DOWN = "http://127.0.0.1:9"  # nothing listens on the discard port


def _cfg(tmp_path: Path, **kw: object) -> AgentConfig:
    return AgentConfig(collector_url=DOWN, node="n1", spool_dir=tmp_path / "spool", fsync=False,
                       **kw)  # type: ignore[arg-type]


def _batches(spool_dir: Path) -> list[Batch]:
    s = Spool(spool_dir, 2**30)
    out = []
    for it in s._items:
        header, body = it.read()
        raw = zstandard.ZstdDecompressor().decompress(body) if header["headers"].get("Content-Encoding") == "zstd" \
            else body
        out.append(decode(raw, header["headers"]["Content-Type"]))
    return out


def _sim(nodes: int = 1, gpus: int = 4):  # type: ignore[no-untyped-def]
    fleet = SimulatedFleet(nodes=nodes, gpus_per_node=gpus, start_ts=time.time() - 7200)  # jobs began before TickClock
    return fleet.source(fleet.node_names()[0])


def test_run_loop_samples_batches_and_keeps_everything_when_collector_is_down(tmp_path: Path) -> None:
    agent = Agent(_cfg(tmp_path, interval_s=0.05, flush_s=0.2, backoff_max_s=0.2), _sim(), clock=TickClock())
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,))
    t0 = time.monotonic()
    t.start()
    deadline = t0 + 20
    while (agent.metrics.registry.get_sample_value("gpufleet_agent_cycles_total") or 0) < 12 and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    t.join(20)
    elapsed = time.monotonic() - t0
    samples = agent.metrics.registry.get_sample_value("gpufleet_agent_samples_total")
    cycles = agent.metrics.registry.get_sample_value("gpufleet_agent_cycles_total")
    assert 12 <= cycles <= elapsed / 0.05 + 2, (cycles, elapsed)  # paced, never bursting to catch up
    batches = _batches(tmp_path / "spool")
    assert len(batches) >= 3
    assert sum(b.n_rows() for b in batches) == samples == 4 * cycles
    seqs = [b.agent.seq for b in batches]
    assert seqs == sorted(seqs) and len({b.agent.boot_id for b in batches}) == 1
    ts = [x for b in batches for x in b.samples["ts"]]
    assert ts == sorted(ts), "replayed in order"
    assert agent.metrics.registry.get_sample_value("gpufleet_agent_loop_lag_seconds_count") == cycles


def test_unflushed_cycles_survive_a_crash_with_their_key(tmp_path: Path) -> None:
    a1 = Agent(_cfg(tmp_path), _sim(), clock=TickClock())
    a1.start()
    for _ in range(3):
        a1.cycle(a1.clock())
    key = (a1.boot_id, a1._open.agent.seq)  # type: ignore[union-attr]
    a1.journal.close()  # the process dies here: no flush (and the OS drops its spool lock)
    a1.spool.unlock()
    a2 = Agent(_cfg(tmp_path), _sim(), clock=TickClock())
    a2.start()
    (b,) = _batches(tmp_path / "spool")
    assert (b.agent.boot_id, b.agent.seq) == key and b.n_rows() == 12
    assert a2.boot_id != a1.boot_id


def test_empty_flush_spools_nothing_and_keeps_the_sequence(tmp_path: Path) -> None:
    a = Agent(_cfg(tmp_path), _sim(), clock=TickClock())
    a.start()
    assert a.flush() is False and a.flush() is False
    a.cycle(a.clock())
    assert a.flush() is True
    (b,) = _batches(tmp_path / "spool")
    assert b.agent.seq == 0


def test_nvml_rows_carry_slurm_jobs_allocations_and_events(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, 500, CG_V2, {"SLURM_JOB_ID": "1392969", "SLURM_JOB_USER": "carol"})
    gpus = [h100(i) for i in range(2)]
    gpus[0].pids = [500]
    fake = FakeNvml(gpus)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "1").write_text("424242\n")
    src = NvmlSource(fake, xid_events=False)
    a = Agent(_cfg(tmp_path), src, [SlurmAttributor(jobs, tmp_path / "none", proc)], clock=TickClock(), enrichers=[])
    a.start()
    a.cycle(a.clock())
    fake.fall_off_bus(1)
    a.cycle(a.clock())
    a.flush()
    src.close()
    (b,) = _batches(tmp_path / "spool")
    assert b.samples["job"] == ["1392969", "424242", "1392969"]
    assert {j.job_id: j.user for j in b.jobs} == {"1392969": "carol", "424242": None}
    assert {(al.gpu_uuid, al.job_id) for al in b.allocations} == {(gpus[0].uuid, "1392969"), (gpus[1].uuid, "424242")}
    assert [e.kind for e in b.events] == ["fell_off_bus"]


def test_a_broken_attributor_does_not_stop_sampling(tmp_path: Path) -> None:
    class Broken:
        name = "broken"

        def attribute(self, *a: object) -> object:
            raise OSError("kaputt")

    a = Agent(_cfg(tmp_path), _sim(gpus=8), [Broken()], clock=TickClock())  # type: ignore[list-item]
    s = a.cycle(a.clock())
    assert len(s.readings) == 8 and s.attribution.gpu_job, "the source's own attribution still applies"


def test_metrics_endpoint_serves_health_and_gpu_fields_with_jobs(tmp_path: Path) -> None:
    a = Agent(_cfg(tmp_path, metrics_port=0, metrics_addr="127.0.0.1", metrics_dcgm_names=True), _sim(),
              clock=TickClock())
    port = a.metrics.serve(0, "127.0.0.1")
    try:
        s = a.cycle(a.clock())
        a.flush()
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        a.metrics.stop()
    assert "gpufleet_agent_samples_total 4.0" in text
    assert "gpufleet_agent_spool_batches 1.0" in text
    assert "gpufleet_agent_rows_dropped_total 0.0" in text and "gpufleet_agent_source_errors" in text
    job = next(iter(s.attribution.gpu_job.values()))
    assert f'job="{job}"' in text and "gpufleet_gpu_sm_active{" in text
    assert "DCGM_FI_PROF_SM_ACTIVE{" in text and f'hpc_job="{job}"' in text
    # DCGM units: % for gpu_util (catalog ratio / 0.01)
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    assert float(line.rsplit(" ", 1)[1]) in (0.0, 100.0)


def test_agents_in_one_process_do_not_share_metrics(tmp_path: Path) -> None:
    a = Agent(_cfg(tmp_path / "a"), _sim(), clock=TickClock())
    b = Agent(_cfg(tmp_path / "b"), _sim(), clock=TickClock())
    a.cycle(a.clock())
    assert a.metrics.registry.get_sample_value("gpufleet_agent_samples_total") == 4
    assert b.metrics.registry.get_sample_value("gpufleet_agent_samples_total") == 0


def test_spool_bound_applies_while_collector_is_down(tmp_path: Path) -> None:
    a = Agent(_cfg(tmp_path, spool_max_bytes=2**20), _sim(gpus=8), clock=TickClock())
    a.start()
    for _ in range(60):
        for _ in range(50):
            a.cycle(a.clock())
        a.flush()
    dropped = a.metrics.registry.get_sample_value("gpufleet_agent_rows_dropped_total")
    assert a.spool.pending_bytes <= 2**20
    assert dropped and dropped == 60 * 50 * 8 - a.spool.pending_rows
    assert msgspec.json.encode(a.spool.pending_batches)


def test_disk_full_keeps_rows_in_memory_then_spools_them(tmp_path: Path) -> None:
    from tests.reliability.faultfs import SmallDisk

    disk = SmallDisk(tmp_path, capacity=2**30)
    a = Agent(_cfg(tmp_path), _sim(), clock=TickClock(), opener=disk)
    a.start()
    disk.fill()
    for _ in range(3):
        a.cycle(a.clock())
        assert a.flush() is True, "the spool takes the batch into memory"
    assert (a.metrics.registry.get_sample_value("gpufleet_agent_disk_errors_total", {"what": "spool"}) or 0) >= 3
    assert a.spool.memory_batches == 3
    disk.capacity = 2**30
    a.cycle(a.clock())
    assert a.flush() is True
    rows = sum(b.n_rows() for b in _batches(tmp_path / "spool"))
    assert rows == 16, "nothing sampled while the disk was full was lost"


def test_rows_held_in_memory_are_bounded(tmp_path: Path) -> None:
    from tests.reliability.faultfs import SmallDisk

    disk = SmallDisk(tmp_path, capacity=2**30)
    a = Agent(_cfg(tmp_path, flush_s=2.0, spool_memory_max_bytes=8000), _sim(), clock=TickClock(), opener=disk)
    a.start()
    disk.fill()
    for _ in range(30):
        a.cycle(a.clock())
        a.cycle(a.clock())
        a.flush()
    dropped = a.metrics.registry.get_sample_value("gpufleet_agent_rows_dropped_total")
    assert dropped and dropped + a.spool.pending_rows == 30 * 2 * 4
    assert a.spool.memory_bytes <= 8000


def test_two_agents_cannot_share_a_spool(tmp_path: Path) -> None:
    import pytest

    a = Agent(_cfg(tmp_path), _sim(), clock=TickClock())
    a.start()
    b = Agent(_cfg(tmp_path), _sim(), clock=TickClock())
    with pytest.raises(RuntimeError, match="in use by pid"):
        b.start()
    a.spool.unlock()
    b.start()


def test_a_failing_source_does_not_end_the_agent(tmp_path: Path) -> None:
    class Flaky:
        name = "flaky"

        def __init__(self) -> None:
            self.inner = _sim()
            self.n = 0

        def devices(self):  # type: ignore[no-untyped-def]
            return self.inner.devices()

        def read(self, now: float):  # type: ignore[no-untyped-def]
            self.n += 1
            if self.n % 2 == 0:
                raise RuntimeError("driver hiccup")
            return self.inner.read(now)

        def drain_events(self):  # type: ignore[no-untyped-def]
            return []

        def attribution(self, now: float):  # type: ignore[no-untyped-def]
            return self.inner.attribution(now)

        def close(self) -> None:
            pass

    src = Flaky()
    agent = Agent(_cfg(tmp_path, interval_s=0.02, flush_s=0.1), src, [], clock=TickClock())  # type: ignore[arg-type]
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,))
    t.start()
    deadline = time.monotonic() + 20
    while src.n < 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    t.join(20)
    failures = agent.metrics.registry.get_sample_value("gpufleet_agent_cycle_failures_total")
    cycles = agent.metrics.registry.get_sample_value("gpufleet_agent_cycles_total")
    assert src.n >= 10 and failures and cycles and abs(failures - cycles) <= 1


def test_nvml_agent_adds_infiniband_rates_by_pcie_affinity(tmp_path: Path) -> None:
    from .test_infiniband import SWITCH_A, SWITCH_B, _gpu, _hca, _set

    sys_root = tmp_path / "sys"
    port = _hca(sys_root, "mlx5_0", f"{SWITCH_A}/0000:03:00.0", 0, ext=True)
    _gpu(sys_root, "0000:17:00.0", f"{SWITCH_A}/0000:17:00.0", 0)  # the fake's GPU 0 is at 00000000:17:00.0
    _gpu(sys_root, "0000:18:00.0", f"{SWITCH_B}/0000:18:00.0", 1)
    port_b = _hca(sys_root, "mlx5_1", f"{SWITCH_B}/0000:83:00.0", 1, ext=True)
    _set(port_b, 0, 0)
    fake = FakeNvml([h100(0), h100(1)])
    src = NvmlSource(fake, xid_events=False)
    a = Agent(_cfg(tmp_path, sys_root=sys_root), src, [], clock=TickClock())  # default enrichers from config
    a.start()
    t0 = time.time() - 60
    _set(port, 0, 0)
    a.cycle(t0)
    _set(port, 1000, 2000)
    s = a.cycle(t0 + 1.0)
    src.close()
    by = {r.uuid: r.values for r in s.readings}
    assert by[fake.gpus[0].uuid]["ib_tx_bytes_s"] == 4000.0 and by[fake.gpus[0].uuid]["ib_rx_bytes_s"] == 8000.0
    assert by[fake.gpus[1].uuid]["ib_tx_bytes_s"] == 0.0, "GPU 1 carries its own (idle) HCA, not GPU 0's"


def test_last_cycle_age_grows_while_the_loop_is_stuck(tmp_path: Path) -> None:
    a = Agent(_cfg(tmp_path), _sim(), clock=TickClock())
    a.cycle(a.clock())
    fresh = a.metrics.registry.get_sample_value("gpufleet_agent_last_cycle_age_seconds")
    time.sleep(0.3)  # no cycle runs: as if a source call hung
    stale = a.metrics.registry.get_sample_value("gpufleet_agent_last_cycle_age_seconds")
    assert fresh is not None and stale is not None and stale >= fresh + 0.25
