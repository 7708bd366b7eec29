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
    """Optional extras a source may offer (the agent looks them up with ``getattr``):
    ``errors: int`` (failed reads so far, exported as a metric), ``pci_bus_ids() -> {uuid:
    "0000:17:00.0"}`` (maps InfiniBand HCAs to GPUs), ``gpu_instance_ids() -> {MIG uuid: GPU
    instance id}`` (Slurm names MIG mapping files ``<index>.<gpu instance>``)."""

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
