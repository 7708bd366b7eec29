"""Sources of GPU readings, one interface (see ``base.Source``), chosen by config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import GpuReading, Source, SourceAttribution

if TYPE_CHECKING:
    from ..config import AgentConfig

__all__ = ["GpuReading", "Source", "SourceAttribution", "open_source"]


def open_source(cfg: AgentConfig) -> list[tuple[str, Source]]:
    """(node name, source) pairs: one for a real node, ``cfg.simulate`` for a simulation.
    RuntimeError says what to do when the chosen source cannot work here."""
    kind = cfg.source
    if kind == "simulator" or (kind == "auto" and cfg.simulate):
        import time

        from ..simulator import SimulatedFleet

        fleet = SimulatedFleet(nodes=max(1, cfg.simulate), gpus_per_node=cfg.gpus_per_node, start_ts=time.time(),
                               node_name=cfg.node if cfg.node_given else None)
        return [(n, fleet.source(n)) for n in fleet.node_names()]
    if kind == "dcgm-exporter":
        from gpufleet.pod_jobs import PodJobs

        from .dcgm_exporter import DcgmExporterSource

        return [(cfg.node, DcgmExporterSource(cfg.dcgm_exporter_url, pod_jobs=PodJobs(cfg.kubernetes_job_patterns)))]
    from .nvml import NvmlSource, NvmlUnavailable

    try:
        src = NvmlSource(gpm=cfg.gpm, xid_events=cfg.xid_events)
        src.devices()
    except NvmlUnavailable as e:
        raise RuntimeError(f"NVML is not usable here ({e}). On a machine without NVIDIA GPUs use --simulate; "
                           f"next to dcgm-exporter use --source dcgm-exporter.") from None
    return [(cfg.node, src)]
