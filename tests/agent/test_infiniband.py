"""InfiniBand/RoCE rates from a fake sysfs tree, and their mapping onto GPUs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufleet.agent.sources.base import GpuReading
from gpufleet.agent.sources.infiniband import InfinibandSampler
from gpufleet.protocol import GpuInfo

# Two PCIe switches under one root port each; GPU0 + mlx5_0 share switch A, GPU1 + mlx5_1 switch B.
SWITCH_A = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0"
SWITCH_B = "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0"


def _dev(sys: Path, pci_path: str, numa: int) -> Path:
    d = sys / "devices" / pci_path
    d.mkdir(parents=True, exist_ok=True)
    (d / "numa_node").write_text(f"{numa}\n")
    return d


def _hca(sys: Path, name: str, pci_path: str | None, numa: int, ext: bool) -> Path:
    hca = sys / "class" / "infiniband" / name
    port = hca / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    if pci_path is not None:
        os.symlink(_dev(sys, pci_path, numa), hca / "device")
    if ext:
        (port / "counters_ext").mkdir()
    return port


def _set(port: Path, tx: int, rx: int) -> None:
    if (port / "counters_ext").is_dir():
        (port / "counters_ext" / "port_xmit_data_64").write_text(f"{tx}\n")
        (port / "counters_ext" / "port_rcv_data_64").write_text(f"{rx}\n")
        # the 32-bit counters are saturated at these rates: they must not be used
        (port / "counters" / "port_xmit_data").write_text("4294967295\n")
        (port / "counters" / "port_rcv_data").write_text("4294967295\n")
    else:
        (port / "counters" / "port_xmit_data").write_text(f"{tx}\n")
        (port / "counters" / "port_rcv_data").write_text(f"{rx}\n")


def _gpu(sys: Path, bus: str, pci_path: str, numa: int) -> None:
    link = sys / "bus" / "pci" / "devices"
    link.mkdir(parents=True, exist_ok=True)
    os.symlink(_dev(sys, pci_path, numa), link / bus)


GPUS = [GpuInfo(index=0, uuid="GPU-0"), GpuInfo(index=1, uuid="GPU-1")]


def _readings() -> list[GpuReading]:
    return [GpuReading("GPU-0"), GpuReading("GPU-1")]


def test_pcie_switch_affinity_and_64bit_counters(tmp_path: Path) -> None:
    p0 = _hca(tmp_path, "mlx5_0", f"{SWITCH_A}/0000:03:00.0", 0, ext=True)
    p1 = _hca(tmp_path, "mlx5_1", f"{SWITCH_B}/0000:83:00.0", 1, ext=True)
    _gpu(tmp_path, "0000:04:00.0", f"{SWITCH_A}/0000:04:00.0", 0)
    _gpu(tmp_path, "0000:84:00.0", f"{SWITCH_B}/0000:84:00.0", 1)
    ib = InfinibandSampler(tmp_path, gpu_pci=lambda: {"GPU-0": "0000:04:00.0", "GPU-1": "0000:84:00.0"})
    assert [p.name for p in ib.ports()] == ["mlx5_0/1", "mlx5_1/1"]
    _set(p0, 10_000_000_000, 0)
    _set(p1, 0, 0)
    r = _readings()
    ib.augment(GPUS, r, 100.0)
    assert "ib_tx_bytes_s" not in r[0].values, "a rate needs two reads"
    _set(p0, 10_000_000_000 + 250_000_000, 500)  # x4 octets: 1 GB in 2 s
    _set(p1, 2_500_000, 0)
    r = _readings()
    ib.augment(GPUS, r, 102.0)
    assert ib.mode == "pcie"
    assert r[0].values["ib_tx_bytes_s"] == pytest.approx(500_000_000.0)
    assert r[0].values["ib_rx_bytes_s"] == pytest.approx(1000.0)
    assert r[1].values["ib_tx_bytes_s"] == pytest.approx(5_000_000.0)


def test_numa_affinity_when_no_shared_switch(tmp_path: Path) -> None:
    p0 = _hca(tmp_path, "mlx5_0", "pci0000:00/0000:00:02.0/0000:05:00.0", 0, ext=False)
    p1 = _hca(tmp_path, "mlx5_1", "pci0000:80/0000:80:02.0/0000:85:00.0", 1, ext=False)
    _gpu(tmp_path, "0000:04:00.0", f"{SWITCH_A}/0000:04:00.0", 0)
    _gpu(tmp_path, "0000:84:00.0", f"{SWITCH_B}/0000:84:00.0", 1)
    ib = InfinibandSampler(tmp_path, gpu_pci=lambda: {"GPU-0": "0000:04:00.0", "GPU-1": "0000:84:00.0"})
    _set(p0, 0, 0)
    _set(p1, 0, 0)
    ib.augment(GPUS, _readings(), 10.0)
    _set(p0, 100, 0)
    _set(p1, 300, 0)
    r = _readings()
    ib.augment(GPUS, r, 11.0)
    assert ib.mode == "numa"
    assert r[0].values["ib_tx_bytes_s"] == 400.0 and r[1].values["ib_tx_bytes_s"] == 1200.0


def test_per_node_when_topology_is_unknown(tmp_path: Path) -> None:
    p0 = _hca(tmp_path, "mlx5_0", None, -1, ext=False)
    p1 = _hca(tmp_path, "mlx5_1", None, -1, ext=False)
    ib = InfinibandSampler(tmp_path)  # no GPU PCI addresses either
    _set(p0, 0, 0)
    _set(p1, 0, 0)
    ib.augment(GPUS, _readings(), 10.0)
    _set(p0, 100, 25)
    _set(p1, 100, 25)
    r = _readings()
    ib.augment(GPUS, r, 12.0)
    assert ib.mode == "node"
    assert r[0].values["ib_tx_bytes_s"] == r[1].values["ib_tx_bytes_s"] == 400.0  # (2 ports x 400 B) / 2 s
    assert r[0].values["ib_rx_bytes_s"] == 100.0


def test_saturated_32bit_counters_and_resets_give_no_rate(tmp_path: Path) -> None:
    p = _hca(tmp_path, "mlx5_0", None, -1, ext=False)
    ib = InfinibandSampler(tmp_path)
    _set(p, 1000, 1000)
    assert ib.rates(1.0) == {}
    _set(p, 4294967295, 2000)
    assert ib.rates(2.0) == {}
    _set(p, 10, 10)  # driver reload: counters went back
    assert ib.rates(3.0) == {}
    _set(p, 20, 30)
    assert ib.rates(4.0) == {"mlx5_0/1": (40.0, 80.0)}


def test_no_hcas_no_ports(tmp_path: Path) -> None:
    assert InfinibandSampler(tmp_path).ports() == []
