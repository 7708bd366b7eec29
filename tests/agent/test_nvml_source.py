"""The NVML source against a fake pynvml modelling A100 (MIG), H100 and H200 devices."""

from __future__ import annotations

import subprocess
import sys
import time

import pynvml
import pytest

from gpufleet.agent.sources.nvml import SLOW_EVERY_S, NvmlSource
from gpufleet.agent.sources.nvml_lib import NvmlUnavailable
from gpufleet.catalog import CATALOG

from ..support.fake_nvml import FakeNvml, a100, h100, h200


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _two_reads(src: NvmlSource, clock: Clock) -> list:
    src.read(clock.t)
    clock.t += SLOW_EVERY_S  # so the second read has the slow counters too (energy, PCIe replays)
    time.sleep(0.11)  # GPM samples must be >= 100 ms apart (monotonic clock)
    return src.read(clock.t)


def test_hopper_gets_every_catalog_field_nvml_can_give(clock: Clock) -> None:
    fake = FakeNvml([h100(0), h200(1)], clock=clock)
    src = NvmlSource(fake, xid_events=True)
    try:
        devs = src.devices()
        assert [d.model for d in devs] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
        assert devs[1].memory_total_bytes == 143771 * 2**20
        first = {r.uuid: r.values for r in src.read(clock.t)}
        assert "sm_active" not in first[devs[0].uuid], "GPM needs two samples: the first cycle only primes"
        readings = _two_reads(src, clock)
        v = readings[0].values
        ib = {"ib_tx_bytes_s", "ib_rx_bytes_s"}  # from sysfs, not NVML
        assert set(CATALOG.names) - ib == set(v), set(CATALOG.names) - ib ^ set(v)
        for name, value in v.items():
            assert CATALOG[name].check(value) is None, (name, value)
        assert v["sm_active"] == pytest.approx(0.88) and v["tensor_active"] == pytest.approx(0.52)
        assert v["gr_engine_active"] == pytest.approx(0.91) and v["sm_occupancy"] == pytest.approx(0.44)
        assert v["pcie_rx_bytes_s"] == pytest.approx(200 * 2**20)
        assert v["nvlink_tx_bytes_s"] == pytest.approx(100 * 2**30)
        assert v["power_w"] == 612.0 and v["gpu_util"] == 0.97 and v["fb_used_bytes"] == 60 * 2**30
        assert readings[1].values["mem_clock_mhz"] == 3201.0
    finally:
        src.close()


def test_memory_used_leaves_out_the_drivers_reservation(clock: Clock) -> None:
    """An idle H200 (driver 580) had 616 MiB reserved and 0 MiB used by nvidia-smi's count, but
    NVML's v1 call said 616 MiB used: a reading that would show every idle GPU holding memory.
    A driver without the v2 call (before R510) falls back to v1, once, and stays there."""
    idle = h200(0)
    idle.used = 0
    old = h100(1)
    old.reserved, old.used = 512 * 2**20, 2**30
    old.unsupported.add("nvmlDeviceGetMemoryInfo_v2")
    fake = FakeNvml([idle, old], clock=clock)
    src = NvmlSource(fake, xid_events=False)
    try:
        for _ in range(3):
            clock.t += 1
            rows = {r.uuid: r.values for r in src.read(clock.t)}
        assert rows[idle.uuid]["fb_used_bytes"] == 0.0
        assert rows[idle.uuid]["fb_total_bytes"] == 143771 * 2**20
        # the old driver's figure includes its reservation: the most that driver can say
        assert rows[old.uuid]["fb_used_bytes"] == 2**30 + 512 * 2**20
        assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 3 + 1, "v2 asked of the old driver once only"
        assert src.errors == 0
    finally:
        src.close()


def test_a_gpu_without_nvlink_has_no_nvlink_readings(clock: Clock) -> None:
    """Seen on an H200 passed through to a VM: every link's state NOT_SUPPORTED, while GPM said
    0 MiB/s NVLink. Unknown is not zero: the rates are left out, not sent as an idle NVLink."""
    pcie, sxm = h200(0), h200(1)
    pcie.nvlinks = 0
    pcie.nvlink_tx = pcie.nvlink_rx = 0.0
    pcie.unsupported_fields = {38, 138, 139}
    fake = FakeNvml([pcie, sxm], clock=clock)
    src = NvmlSource(fake, xid_events=False)
    try:
        rows = {r.uuid: r.values for r in _two_reads(src, clock)}
        assert not {"nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "nvlink_error_count"} & set(rows[pcie.uuid])
        assert rows[pcie.uuid]["tensor_active"] == pytest.approx(0.52), "the rest of GPM is still read"
        assert rows[sxm.uuid]["nvlink_tx_bytes_s"] == pytest.approx(100 * 2**30)
        links = pynvml.NVML_NVLINK_MAX_LINKS  # 36 in nvidia-ml-py 13
        assert fake.calls["nvmlDeviceGetNvLinkState"] == links + 1, "asked at discovery only: each link of one"
    finally:
        src.close()


def test_energy_and_pcie_replays_are_read_every_10_s_not_every_cycle(clock: Clock) -> None:
    """The energy counter was 2.7-3.0 ms of a 4 ms field batch on an H200 (driver 580); it and
    the PCIe replay counter are lifetime counters, so a reading every 10 s loses nothing."""
    fake = FakeNvml([h200(0)], clock=clock)
    src = NvmlSource(fake, xid_events=False)
    try:
        seen = []
        for _ in range(25):  # 1 Hz for 25 s: t = 0, 10 and 20 carry the slow counters
            (row,) = src.read(clock.t)
            seen.append({"energy_j", "pcie_replay_count"} <= set(row.values))
            assert "ecc_dbe_volatile" in row.values, "the other counters every cycle"
            clock.t += 1.0
        assert [i for i, s in enumerate(seen) if s] == [0, 10, 20]
        assert fake.calls.get("nvmlDeviceGetTotalEnergyConsumption", 0) == 0, "no per-cycle fallback call"
        clock.t -= 100.0  # a clock stepped back must not stall the slow counters
        (row,) = src.read(clock.t)
        assert "energy_j" in row.values
    finally:
        src.close()


def test_a_failed_memory_read_is_left_out_not_read_as_v1(clock: Clock) -> None:
    g = h200(0)
    fake = FakeNvml([g], clock=clock)
    src = NvmlSource(fake, xid_events=False)
    real = fake.nvmlDeviceGetMemoryInfo
    try:
        def flaky(h, version=None):  # type: ignore[no-untyped-def]
            if version:
                raise fake.NVMLError(999)  # NVML_ERROR_UNKNOWN: a failure, not an old driver
            return real(h, version)
        fake.nvmlDeviceGetMemoryInfo = flaky  # type: ignore[method-assign]
        clock.t += 1
        (row,) = src.read(clock.t)
        assert "fb_used_bytes" not in row.values and src.errors == 1
        fake.nvmlDeviceGetMemoryInfo = real  # type: ignore[method-assign]
        clock.t += 1
        (row,) = src.read(clock.t)
        assert row.values["fb_used_bytes"] == g.used, "still on v2: the reservation stays out"
    finally:
        src.close()


def test_a100_without_gpm_falls_back_cleanly(clock: Clock) -> None:
    fake = FakeNvml([a100(0)], clock=clock)
    src = NvmlSource(fake)
    try:
        v = _two_reads(src, clock)[0].values
        for gpm_only in ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp16_active"):
            assert gpm_only not in v, f"{gpm_only} is not available without GPM, not zero"
        # NVLink from the byte counters turned into a rate; PCIe from nvmlDeviceGetPcieThroughput
        assert v["nvlink_tx_bytes_s"] == pytest.approx(60 * 2**30, rel=1e-6)
        assert v["pcie_tx_bytes_s"] == pytest.approx(50 * 2**20, rel=1e-3)
        assert v["sm_clock_mhz"] == 1410.0 and v["mem_clock_mhz"] == 1593.0
        assert fake.calls.get("nvmlGpmSampleGet", 0) == 0
    finally:
        src.close()


def test_not_supported_fields_are_left_out_not_failed(clock: Clock) -> None:
    g = h100(0)
    g.unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature", "nvmlDeviceGetUtilizationRates"}
    g.unsupported_fields = {3, 4, 145}
    src = NvmlSource(FakeNvml([g, h100(1)], clock=clock))
    try:
        r = _two_reads(src, clock)
        v = r[0].values
        for missing in ("power_w", "temp_c", "gpu_util", "ecc_sbe_volatile", "ecc_dbe_volatile", "row_remap_failure"):
            assert missing not in v
        assert "sm_active" in v and "fb_used_bytes" in v and "power_w" in r[1].values
        assert src.errors == 0, "NOT_SUPPORTED is not an error"
    finally:
        src.close()


def test_mig_instances_are_their_own_rows(clock: Clock) -> None:
    g = a100(0, mig=True)
    g.mig[1].used = 5 * 2**30
    g.mig[1].pids = [4242]
    src = NvmlSource(FakeNvml([g], clock=clock))
    try:
        devs = src.devices()
        assert len(devs) == 5
        parent, migs = devs[0], devs[1:]
        assert all(m.parent_uuid == parent.uuid and m.mig_profile == "1g.20gb" and m.index == 0 for m in migs)
        assert all(m.uuid.startswith("MIG-") for m in migs)
        assert migs[0].memory_total_bytes == 19968 * 2**20
        rows = {r.uuid: r for r in _two_reads(src, clock)}
        assert rows[migs[1].uuid].values["fb_used_bytes"] == 5 * 2**30
        assert rows[migs[1].uuid].pids == (4242,)
        assert "gpu_util" not in rows[parent.uuid].values, "utilization is not supported in MIG mode"
        assert rows[parent.uuid].values["power_w"] == 312.0
    finally:
        src.close()


def test_gpu_falling_off_the_bus_leaves_the_others_sampling(clock: Clock) -> None:
    fake = FakeNvml([h100(i) for i in range(4)], clock=clock)
    src = NvmlSource(fake, xid_events=False)
    try:
        assert len(src.read(clock.t)) == 4
        fake.fall_off_bus(2)
        clock.t += 1
        rows = src.read(clock.t)
        lost = src.devices()
        assert len(rows) == 3 and len(lost) == 3
        ev = src.drain_events()
        assert [e.kind for e in ev] == ["fell_off_bus"] and ev[0].gpu_uuid == fake.gpus[2].uuid
        clock.t += 1
        assert len(src.read(clock.t)) == 3 and src.drain_events() == [], "reported once"
    finally:
        src.close()


def test_xid_events_arrive_from_the_event_thread(clock: Clock) -> None:
    fake = FakeNvml([h100(0), h100(1)], clock=clock)
    src = NvmlSource(fake, event_poll_ms=50)
    try:
        src.devices()
        fake.inject_xid(1, 79)
        deadline = time.monotonic() + 5
        events = []
        while not events and time.monotonic() < deadline:
            events = src.drain_events()
            time.sleep(0.02)
        assert [(e.kind, e.code, e.gpu_uuid) for e in events] == [("xid", 79, fake.gpus[1].uuid)]
        values = {r.uuid: r.values for r in src.read(clock.t)}
        assert values[fake.gpus[1].uuid]["xid_last"] == 79 and values[fake.gpus[0].uuid]["xid_last"] == 0
    finally:
        src.close()
    assert src._xid_thread is not None and not src._xid_thread.is_alive(), "close stops the event thread"


def test_calls_per_cycle_are_bounded(clock: Clock) -> None:
    fake = FakeNvml([h100(i) for i in range(8)], clock=clock)
    src = NvmlSource(fake, xid_events=False)
    try:
        _two_reads(src, clock)
        before = sum(fake.calls.values())
        clock.t += 1
        time.sleep(0.11)
        src.read(clock.t)
        per_gpu = (sum(fake.calls.values()) - before) / 8
        # field values batch + util + memory + power + temp + 2 clocks + reasons + GPM (2) + processes
        assert per_gpu <= 12, fake.calls
        assert fake.calls["nvmlDeviceGetFieldValues"] == 8 * 3, "one batched field read per GPU per cycle"
    finally:
        src.close()


def test_nvml_unavailable_is_a_clear_error() -> None:
    import pynvml

    src = NvmlSource(FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(NvmlUnavailable, match="nvmlInit"):
        src.devices()


def test_importing_the_agent_touches_no_nvml_and_no_server_packages() -> None:
    code = (
        "import sys\n"
        "import gpufleet.agent.runner, gpufleet.agent.sources.nvml, gpufleet.agent.sources.dcgm_exporter\n"
        "import gpufleet.agent.attribution.slurm, gpufleet.agent.attribution.kubernetes\n"
        "import gpufleet.agent.sources.infiniband, gpufleet.agent.oneshot, gpufleet.commands.agent\n"
        "bad = [m for m in ('fastapi', 'sqlalchemy', 'celery', 'numpy', 'pydantic', 'gpufleet.collector',\n"
        "       'gpufleet.storage', 'gpufleet.analysis', 'gpufleet.alerts', 'gpufleet.api') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "import pynvml\n"
        "assert pynvml.nvmlLib is None, 'NVML library loaded at import time'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_hopper_mig_instances_get_gpm_and_slurm_mapping_files(clock: Clock, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpufleet.agent.attribution.slurm import SlurmAttributor

    g = h100(0, mig=True)
    g.mig[0].sm_util, g.mig[1].sm_util = 25.0, 75.0
    src = NvmlSource(FakeNvml([g], clock=clock), xid_events=False)
    try:
        devs = src.devices()
        migs = [d for d in devs if d.mig_profile]
        assert [m.mig_profile for m in migs] == ["3g.40gb", "3g.40gb"]
        rows = {r.uuid: r.values for r in _two_reads(src, clock)}
        assert rows[migs[0].uuid]["sm_active"] == pytest.approx(0.25)
        assert rows[migs[1].uuid]["sm_active"] == pytest.approx(0.75)
        jobs = tmp_path / "jobs"
        jobs.mkdir()
        (jobs / "0.2").write_text("5150\n")  # Slurm names a MIG instance <gpu index>.<gpu instance id>
        a = SlurmAttributor(jobs, tmp_path / "x", tmp_path / "proc", gpu_instance_ids=src.gpu_instance_ids)
        assert a.attribute(devs, [], 0.0).gpu_job == {migs[1].uuid: "5150"}
    finally:
        src.close()


def test_xid_on_a_mig_instance_names_the_instance(clock: Clock) -> None:
    fake = FakeNvml([a100(0, mig=True)], clock=clock)
    src = NvmlSource(fake, event_poll_ms=50)
    try:
        devs = src.devices()
        fake.inject_xid(0, 31, gi_id=5)  # GPU instance 5 is the third 1g.20gb instance
        deadline = time.monotonic() + 5
        events = []
        while not events and time.monotonic() < deadline:
            events = src.drain_events()
            time.sleep(0.02)
        assert [(e.code, e.gpu_uuid) for e in events] == [(31, devs[3].uuid)]
        assert devs[3].mig_profile == "1g.20gb"
    finally:
        src.close()


def test_real_gpu_script_runs_against_the_fake() -> None:
    """bench/agent/nvml_real_gpu.py runs on GPU nodes (docs/real-gpu.md); CI has none, so at
    least its own code paths run here, the per-call timing table too."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "agent" / "nvml_real_gpu.py"
    r = subprocess.run([sys.executable, str(script), "--fake", "--cycles", "4", "--interval", "0.12"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "GPM supported on 2 of 7" in r.stdout and "per cycle over" in r.stdout
    assert "sm_active" in r.stdout and "PROBLEMS" not in r.stdout
    assert "nvmlDeviceGetFieldValues" in r.stdout.split("NVML time by call")[1]


def test_a_reset_gpu_comes_back_with_its_mig_instances(clock: Clock) -> None:
    fake = FakeNvml([h100(0), a100(1, mig=True)], clock=clock)
    src = NvmlSource(fake, event_poll_ms=50, reprobe_s=0.0)
    try:
        assert len(src.read(clock.t)) == 6
        fake.fall_off_bus(1)
        assert len(src.read(clock.t + 1)) == 1, "the A100 and its 4 MIG instances are gone"
        assert len(src.read(clock.t + 2)) == 1, "still gone while it does not answer"
        fake.gpus[1].lost = False  # nvidia-smi -r
        rows = src.read(clock.t + 3)
        assert sorted(r.uuid for r in rows) == sorted(d.uuid for d in src.devices())
        assert len(rows) == 6 and len(src.devices()) == 6
        kinds = [e.kind for e in src.drain_events()]
        assert kinds == ["fell_off_bus", "other"]
        fake.inject_xid(1, 94)  # XID events still name the GPU after it came back
        deadline = time.monotonic() + 5
        ev = []
        while not ev and time.monotonic() < deadline:
            ev = src.drain_events()
            time.sleep(0.02)
        assert [(e.code, e.gpu_uuid) for e in ev] == [(94, fake.gpus[1].uuid)]
    finally:
        src.close()


def test_slow_counters_stay_on_the_metrics_endpoint_between_reads(clock: Clock) -> None:
    """Energy is read every 10 s, but a Prometheus scrape at any second still finds it (its last
    reading, at most 30 s old): a gap would break rate() on the counter. Batches carry it only
    when read."""
    from gpufleet.agent.metrics import HELD_MAX_AGE_S, AgentMetrics

    g = h200(0)
    fake = FakeNvml([g], clock=clock)
    src = NvmlSource(fake, xid_events=False)
    m = AgentMetrics("n")
    devs = {d.uuid: d for d in src.devices()}
    labels = {"gpu": "0", "uuid": g.uuid, "model": "NVIDIA H200", "node": "n", "job": ""}
    try:
        in_rows, scraped = 0, []
        for _ in range(12):
            rows = src.read(clock.t)
            in_rows += "energy_j" in rows[0].values
            m.gpu.update(devs, rows, {})
            scraped.append(m.registry.get_sample_value("gpufleet_gpu_energy_j", labels))
            clock.t += 1.0
        assert in_rows == 2 and all(v is not None for v in scraped), scraped
        assert m.registry.get_sample_value("gpufleet_gpu_pcie_replay_count", labels) is not None
    finally:
        src.close()
    # A GPU that stops answering the counter: the held reading goes once it is too old.
    for r in rows:
        r.values.pop("energy_j", None)
    m.gpu.update(devs, rows, {}, now=time.monotonic() + HELD_MAX_AGE_S + 1)
    assert m.registry.get_sample_value("gpufleet_gpu_energy_j", labels) is None
