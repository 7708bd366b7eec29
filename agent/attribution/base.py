"""The attribution interface: who owns which GPU, from the node's own point of view."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from gpufleet.protocol import GpuInfo, JobInfo

from ..sources.base import GpuReading, SourceAttribution


@runtime_checkable
class Attributor(Protocol):
    name: str

    def attribute(self, devices: list[GpuInfo], readings: list[GpuReading], now: float) -> SourceAttribution:
        """GPU uuid -> job id for the GPUs this attributor can place, with what it knows of the jobs."""
        ...


def _fill(known: JobInfo, more: JobInfo) -> JobInfo:
    """``known`` with its empty facts filled from ``more`` (same job seen by two attributors)."""
    changes = {f: getattr(more, f) for f in known.__struct_fields__
               if getattr(known, f) in (None, {}) and getattr(more, f) not in (None, {})}
    return msgspec.structs.replace(known, **changes) if changes else known


def merge(into: SourceAttribution, more: SourceAttribution) -> SourceAttribution:
    """Add ``more`` to ``into`` in place: GPUs already placed keep their job (earlier
    attributors win), job facts only fill gaps."""
    for uuid, job in more.gpu_job.items():
        into.gpu_job.setdefault(uuid, job)
    for job_id, info in more.jobs.items():
        have = into.jobs.get(job_id)
        into.jobs[job_id] = info if have is None else _fill(have, info)
    return into
