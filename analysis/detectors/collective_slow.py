"""collective_slow: a communicator's bus bandwidth well below the job's own baseline for a
while, per (communicator, collective, message-size bucket), from NCCL Inspector aggregates
(pure decisions in analysis/collectives/detect.py; docs/nccl.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gpufleet.flagkinds import flag_kinds

from ..collectives.detect import SlowEpisode, SlowParams, slow_episodes
from ..collectives.features import FabricView, build_series, nic_nominal
from ..config import KindConfig
from .base import Finding, Found, JobView, r3

KIND = "collective_slow"


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    bin_s: float  # busbw is judged per bin of this length (median over ranks)
    drop: float  # slow: busbw this share below the baseline
    baseline_quantile: float  # the baseline: this quantile of the series' bins (the best it sustained)
    min_baseline_bins: int
    min_calls_per_bin: int

    def params(self) -> SlowParams:
        return SlowParams(self.bin_s, self.drop, self.min_duration_s, self.baseline_quantile, self.min_baseline_bins,
                          self.min_calls_per_bin)


def fabric_busbw_bytes_s(view: FabricView, ep: SlowEpisode, nvlink_bytes_s: float) -> float | None:
    """What the fabric should give this series: NVLink inside a node; across nodes, a ring over
    one channel per rail is bounded by the rails of a node at the rate their links trained at."""
    if ep.n_nodes <= 1:
        return nvlink_bytes_s or None
    nominal = nic_nominal(view)
    per_node: dict[str, list[float]] = {}
    for (node, _nic), rate in nominal.items():
        per_node.setdefault(node, []).append(rate)
    if not per_node:
        return None
    return min(len(r) * min(r) for r in per_node.values()) * 1e9 / 8


def series_evidence(ep: SlowEpisode) -> dict[str, Any]:
    comm, coll, size = ep.key
    return {"comm": comm, "collective": coll, "message_size_bytes": size, "n_nodes": ep.n_nodes,
            "baseline_busbw_bytes_s": r3(ep.baseline_gbs * 1e9, 0), "busbw_bytes_s": r3(ep.observed_gbs * 1e9, 0),
            "busbw_drop": r3(ep.drop)}


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    view: FabricView | None = job.fabric
    if view is None or not view.colls:
        return []
    eps = slow_episodes(build_series(view, cfg.bin_s), cfg.params())
    if not eps:
        return []
    spec = flag_kinds().get(KIND)
    worst = max(eps, key=lambda e: (e.lost_gpu_s, e.drop))
    fabric = fabric_busbw_bytes_s(view, worst, job.ctx.limits.nvlink_bytes_s)
    evidence = {**series_evidence(worst), "fabric_busbw_bytes_s": r3(fabric, 0) if fabric else None,
                "of_fabric": r3(worst.observed_gbs * 1e9 / fabric) if fabric else None,
                "slow_series": [f"{e.key[1]} {e.key[2]} B on {e.key[0]} ({e.n_nodes} nodes): busbw {-e.drop:+.0%}"
                                for e in sorted(eps, key=lambda e: -e.lost_gpu_s)][:8],
                "flagged_minutes": round(sum(e.end - e.start for e in eps) / 60, 1), "episodes": len(eps),
                "longest_episode_minutes": round(max(e.end - e.start for e in eps) / 60, 1),
                "judged_from": ["nccl_inspector"]}
    lost = sum(e.lost_gpu_s for e in eps) / 3600.0
    return [Finding(KIND, "", cfg.severity or spec.severity, max(job.ctx.first_ts, min(e.start for e in eps)),
                    max(e.end for e in eps), any(e.ongoing for e in eps), round(lost, 4), evidence,
                    spec.suggestion_for(job.ctx.workload_class))]
