"""The one interface every GPU source implements (NVML, dcgm-exporter, simulator)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gpufleet.protocol import Event, GpuInfo, JobInfo


@dataclass(slots=True)
class GpuReading:
    """One GPU (or MIG instance) at one instant. A field absent from ``values`` is "not
    available" on this device; it is never a failed sample."""

    uuid: str
    values: dict[str, float] = field(default_factory=dict)
    pids: tuple[int, ...] = ()


@dataclass(slots=True)
class SourceAttribution:
    """Attribution a source knows by itself (simulator ground truth, dcgm-exporter pod or
    hpc_job labels). Attributors on the node may add to it."""

    jobs: dict[str, JobInfo] = field(default_factory=dict)
    gpu_job: dict[str, str] = field(default_factory=dict)  # gpu uuid -> job id


@runtime_checkable
class Source(Protocol):
    name: str

    def devices(self) -> list[GpuInfo]:
        """The GPUs (and MIG instances, as their own rows) this source reports."""
        ...

    def read(self, now: float) -> list[GpuReading]:
        """One reading per device that answered; a device that failed is left out."""
        ...

    def drain_events(self) -> list[Event]:
        """Events (XID, ECC, fell off the bus) seen since the last call."""
        ...

    def attribution(self, now: float) -> SourceAttribution:
        """What the source itself says about which job owns which GPU (may be empty)."""
        ...

    def close(self) -> None: ...
