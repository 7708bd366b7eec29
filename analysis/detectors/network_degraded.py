"""network_degraded: the node, NIC and rail whose timings or counters explain a slow
collective. In a ring the rank behind the slow link waits least (its exec times are the
shortest while its peers' grow); link rate, port_xmit_wait and port state name the NIC
(pure decisions in analysis/collectives/detect.py; docs/nccl.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.flagkinds import flag_kinds

from ..collectives.detect import LocaliseParams, localise, slow_episodes
from ..collectives.features import FabricView, build_series
from ..config import KindConfig
from . import collective_slow
from .base import Finding, Found, JobView, r3

KIND = "network_degraded"
# The NIC evidence's basis -> the cause whose suggestion fits (registry: suggestion_by_cause),
# strongest first (a port that left ACTIVE explains a rate drop and the waits).
CAUSES = (("port_state", "port_down"), ("link_rate", "link_rate"), ("xmit_wait", "congestion"))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    late_ratio: float
    late_share: float
    rate_drop: float
    xmit_wait_ratio: float
    xmit_wait_min_per_s: float

    def params(self) -> LocaliseParams:
        return LocaliseParams(self.late_ratio, self.late_share, self.rate_drop, self.xmit_wait_ratio,
                              self.xmit_wait_min_per_s)


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    view: FabricView | None = job.fabric
    if view is None or not view.colls:
        return []
    slow_cfg = job.th.get(collective_slow.Config)
    series = {s.key: s for s in build_series(view, slow_cfg.bin_s)}
    eps = slow_episodes(list(series.values()), slow_cfg.params())
    spec = flag_kinds().get(KIND)
    by_node: dict[str, Finding] = {}
    # multi-node series first: only they carry the late-rank timing signal
    for ep in sorted(eps, key=lambda e: (-e.n_nodes, -e.lost_gpu_s)):
        c = localise(view, series[ep.key], ep, cfg.params())
        if c is None or c.node in by_node:
            continue
        ev = c.nic_evidence
        cause = next((name for basis, name in CAUSES if ev is not None and basis in ev.basis), None)
        evidence = {"nic": c.nic, "rank": c.rank, "gpu_uuid": c.gpu_uuid,
                    "late_exec_ratio": r3(c.exec_ratio) if c.exec_ratio is not None else None,
                    "link_rate_bytes_s": ev.rate_gbps * 1e9 / 8 if ev and ev.rate_gbps else None,
                    "nominal_rate_bytes_s": ev.nominal_gbps * 1e9 / 8 if ev and ev.nominal_gbps else None,
                    "xmit_wait_per_s": r3(ev.xmit_wait_per_s, 0) if ev and ev.xmit_wait_per_s is not None else None,
                    "xmit_wait_before_per_s": r3(ev.xmit_wait_before_per_s, 0)
                    if ev and ev.xmit_wait_before_per_s is not None else None,
                    "port_state": ev.state if ev else None, **collective_slow.series_evidence(ep),
                    "confidence": c.confidence, "judged_from": c.basis,
                    "flagged_minutes": round((ep.end - ep.start) / 60, 1), **({"cause": cause} if cause else {})}
        by_node[c.node] = Finding(KIND, c.node, cfg.severity or spec.severity, max(job.ctx.first_ts, ep.start), ep.end,
                                  ep.ongoing, 0.0, evidence, spec.suggestion_for(job.ctx.workload_class, cause))
    return list(by_node.values())
