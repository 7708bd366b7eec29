"""The NVML source against a fake pynvml modelling A100 (MIG), H100 and H200 devices."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpufleet.agent.sources.nvml import NvmlSource
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
    clock.t += 1.0
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
    """bench/agent/nvml_real_gpu.py has not met a GPU yet: at least its own code paths run."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "agent" / "nvml_real_gpu.py"
    r = subprocess.run([sys.executable, str(script), "--fake", "--cycles", "4", "--interval", "0.12"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "GPM supported on 2 of 7" in r.stdout and "per cycle over" in r.stdout
    assert "sm_active" in r.stdout and "PROBLEMS" not in r.stdout


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
