"""The agent's fabric sections: NCCL collectives (Inspector files), NIC health and the GPU <->
NIC rails, added to each cycle's journal part (protocol ``collectives``, ``nics``, ``gpu_nics``).

The Agent calls ``fill(part, ...)`` every cycle and ``committed()`` once the part is in its
journal: only then are the Inspector offsets persisted, so a killed agent neither loses nor
repeats a collective (the journal becomes a batch on the next start).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.protocol import GpuInfo

from .base import GpuReading
from .nic_health import NicHealthSampler, rails

if TYPE_CHECKING:
    from ..config import AgentConfig
    from .infiniband import InfinibandSampler
    from .nccl_inspector import InspectorSource

log = logging.getLogger(__name__)

STATE_FILE = "nccl_offsets.json"  # next to the spool queue: offsets travel with the spool


class FabricSections:
    def __init__(self, inspector: InspectorSource | None = None, nics: NicHealthSampler | None = None,
                 ib: InfinibandSampler | None = None, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.inspector = inspector
        self.nics = nics
        self.ib = ib
        self.monotonic = monotonic
        self._dirty = False
        self.failures = 0
        self._last_log = -1e18

    def fill(self, part: Any, now: float, devices: list[GpuInfo], readings: list[GpuReading]) -> None:
        """Add this cycle's sections to ``part``. A failure here is logged (once a minute) and
        counted, never raised: the cycle's GPU rows must not be lost to a fabric problem."""
        try:
            self._fill(part, now, devices, readings)
        except Exception as e:  # see the docstring; the next cycle tries again
            self.failures += 1
            t = self.monotonic()
            if t - self._last_log >= 60:
                self._last_log = t
                log.warning("fabric sections failed (%d so far): %s", self.failures, e,
                            exc_info=log.isEnabledFor(logging.DEBUG))

    def _fill(self, part: Any, now: float, devices: list[GpuInfo], readings: list[GpuReading]) -> None:
        if self.inspector is not None:
            self.inspector.update_gpus(devices, readings)
            aggs = self.inspector.poll(self.monotonic(), wall=now)
            if aggs:
                part.collectives = aggs
                self._dirty = True
        if self.nics is not None:
            samples = self.nics.sample(now)
            if samples:
                part.nics = samples
                if self.ib is not None and devices:
                    part.gpu_nics = rails(self.ib.affinity(devices), self.ib.mode)

    def committed(self) -> None:
        """The part is journaled: persist the offsets of what it handed out."""
        if self.inspector is not None and self._dirty:
            try:
                self.inspector.commit()
                self._dirty = False
            except OSError as e:  # a full disk: try again next cycle; a restart would re-read a little
                log.warning("cannot save NCCL Inspector offsets to %s: %s", self.inspector.state_path, e)


def build_fabric(cfg: AgentConfig, source: object) -> FabricSections | None:
    """What the config asks for and the node has; None when nothing applies."""
    if getattr(source, "name", "") == "simulator" and cfg.nccl_inspector_dir is None and cfg.sys_root == Path("/sys"):
        return None  # simulated GPUs read fabric files only where told (the demo's, agent/sim_fabric.py)
    inspector = None
    if cfg.nccl_inspector_dir is not None:
        from .nccl_inspector import InspectorSource

        # The Inspector names files <host>-pid<pid>.log: this agent's host is its --node.
        inspector = InspectorSource(cfg.nccl_inspector_dir, cfg.spool_dir / STATE_FILE, hostname=cfg.node,
                                    proc_root=cfg.proc_root)
        log.info("NCCL Inspector: following files under %s", cfg.nccl_inspector_dir)
    nics = ib = None
    if cfg.nic_health and cfg.infiniband:
        from .infiniband import InfinibandSampler

        nics = NicHealthSampler(cfg.sys_root, interval_s=max(cfg.flush_s, cfg.interval_s))
        if nics.ports():
            ib = InfinibandSampler(sys_root=cfg.sys_root, gpu_pci=getattr(source, "pci_bus_ids", None))
        else:
            nics = None
    if inspector is None and nics is None:
        return None
    return FabricSections(inspector, nics, ib)
