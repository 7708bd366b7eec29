"""InfiniBand / RoCE traffic from sysfs, as per-port byte rates added to GPU readings.

``/sys/class/infiniband/<hca>/ports/<n>/counters/port_{xmit,rcv}_data`` count octets
divided by 4; ``counters_ext/port_*_data_64`` (when present) are the 64-bit versions and
are preferred: the 32-bit ones saturate within seconds at 400 Gb/s.

Which GPU gets which HCA's traffic, one rule for the whole node, in order of preference:
1. PCIe switch, when every GPU has an HCA under its own PCIe switch (GPUDirect RDMA pairs);
2. NUMA, when every GPU has an HCA on its NUMA node;
3. otherwise every GPU carries the node's total (the field is then per node, as documented).
A GPU with an affine HCA carries that HCA's full rate (shared HCAs are not split).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.protocol import GpuInfo

from .base import GpuReading

log = logging.getLogger(__name__)

SATURATED_32 = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class IbPort:
    hca: str
    port: str
    path: Path
    pci_path: str  # resolved PCIe device path ("" when unknown)
    numa: int  # -1 when unknown

    @property
    def name(self) -> str:
        return f"{self.hca}/{self.port}"


def _read_int(p: Path) -> int | None:
    try:
        return int(p.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _pci_path(sys_root: Path, link: Path) -> str:
    try:
        real = os.path.realpath(link)
    except OSError:
        return ""
    devices = os.path.realpath(sys_root / "devices")
    return real[len(devices):] if real.startswith(devices) else real


def _switch_of(pci_path: str) -> str:
    """The PCIe path up to the device's parent bridge below the root port: devices under
    the same switch share it; devices straight on a root port get '' (no switch)."""
    parts = [p for p in pci_path.split("/") if p]
    # /pci0000:00/<root port>/<switch upstream>/<switch downstream>/<device>
    return "/".join(parts[:3]) if len(parts) >= 5 else ""


class InfinibandSampler:
    def __init__(self, sys_root: Path = Path("/sys"),
                 gpu_pci: Callable[[], dict[str, str]] | None = None) -> None:
        self.sys_root = Path(sys_root)
        self.gpu_pci = gpu_pci  # uuid -> PCI bus id ("0000:17:00.0"), from the GPU source
        self._ports: list[IbPort] | None = None
        self._prev: dict[str, tuple[float, int, int]] = {}
        self._affinity: dict[str, list[str]] | None = None
        self.mode = "node"

    def ports(self) -> list[IbPort]:
        if self._ports is None:
            base = self.sys_root / "class" / "infiniband"
            ports = []
            for hca in sorted(base.iterdir()) if base.is_dir() else []:
                numa = _read_int(hca / "device" / "numa_node")
                pci = _pci_path(self.sys_root, hca / "device") if (hca / "device").exists() else ""
                for port in sorted((hca / "ports").iterdir()) if (hca / "ports").is_dir() else []:
                    if (port / "counters" / "port_xmit_data").exists() or (port / "counters_ext").is_dir():
                        ports.append(IbPort(hca.name, port.name, port, pci, -1 if numa is None else numa))
            self._ports = ports
        return self._ports

    def _counters(self, p: IbPort) -> tuple[int, int] | None:
        for sub, tx, rx in (("counters_ext", "port_xmit_data_64", "port_rcv_data_64"),
                            ("counters", "port_xmit_data", "port_rcv_data")):
            t, r = _read_int(p.path / sub / tx), _read_int(p.path / sub / rx)
            if t is not None and r is not None:
                if sub == "counters" and SATURATED_32 in (t, r):
                    return None  # a stuck 32-bit counter says nothing about the rate
                return t * 4, r * 4
        return None

    def rates(self, now: float) -> dict[str, tuple[float, float]]:
        """Port name -> (tx bytes/s, rx bytes/s) since the previous call."""
        out = {}
        for p in self.ports():
            c = self._counters(p)
            if c is None:
                continue
            prev = self._prev.get(p.name)
            self._prev[p.name] = (now, c[0], c[1])
            if prev is not None and now > prev[0] and c[0] >= prev[1] and c[1] >= prev[2]:
                dt = now - prev[0]
                out[p.name] = ((c[0] - prev[1]) / dt, (c[1] - prev[2]) / dt)
        return out

    def affinity(self, devices: list[GpuInfo]) -> dict[str, list[str]]:
        """GPU uuid -> the ports whose traffic it carries."""
        if self._affinity is not None and set(self._affinity) >= {d.uuid for d in devices}:
            return self._affinity
        ports = self.ports()
        all_ports = [p.name for p in ports]
        bus = self.gpu_pci() if self.gpu_pci else {}
        gpu_pci = {}
        for d in devices:
            b = bus.get(d.parent_uuid or d.uuid)
            if b:
                link = self.sys_root / "bus" / "pci" / "devices" / b
                gpu_pci[d.uuid] = (_pci_path(self.sys_root, link) if link.exists() else "",
                                   _read_int(link / "numa_node") if link.exists() else None)
        by_switch = {d.uuid: [p.name for p in ports if _switch_of(p.pci_path)
                              and _switch_of(p.pci_path) == _switch_of(gpu_pci.get(d.uuid, ("", None))[0])]
                     for d in devices}
        by_numa = {d.uuid: [p.name for p in ports if p.numa >= 0 and p.numa == gpu_pci.get(d.uuid, ("", None))[1]]
                   for d in devices}
        if devices and all(by_switch.values()):
            self.mode, aff = "pcie", by_switch
        elif devices and all(by_numa.values()):
            self.mode, aff = "numa", by_numa
        else:
            self.mode, aff = "node", {d.uuid: all_ports for d in devices}
        log.info("InfiniBand: %d ports, mapped to GPUs by %s", len(ports), self.mode)
        self._affinity = aff
        return aff

    def augment(self, devices: list[GpuInfo], readings: list[GpuReading], now: float) -> None:
        rates = self.rates(now)
        if not rates:
            return
        aff = self.affinity(devices)
        for r in readings:
            names = [n for n in aff.get(r.uuid, ()) if n in rates]
            if names:
                r.values["ib_tx_bytes_s"] = sum(rates[n][0] for n in names)
                r.values["ib_rx_bytes_s"] = sum(rates[n][1] for n in names)
