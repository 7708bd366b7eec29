"""link_errors: an InfiniBand/RoCE port whose error counters grew during the job (symbol and
receive errors, link down, integrity and buffer-overrun errors, RoCE sequence errors), per node
with the port named (docs/nccl.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.flagkinds import flag_kinds

from ..collectives.detect import ErrorPort, error_ports
from ..collectives.features import FabricView
from ..config import KindConfig
from .base import Finding, Found, JobView

KIND = "link_errors"


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    errors_min: float  # error-counter increases on one port during the job
    link_downed_min: float  # any link-down counts on its own


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    view: FabricView | None = job.fabric
    if view is None or not view.nics:
        return []
    spec = flag_kinds().get(KIND)
    by_node: dict[str, list[ErrorPort]] = {}
    for p in error_ports(view, cfg.errors_min, cfg.link_downed_min):
        by_node.setdefault(p.node, []).append(p)
    out = []
    for node, ports in by_node.items():
        evidence = {"nic": ports[0].nic, "ports": [{"nic": p.nic, "errors": p.errors, "counters": p.by_counter}
                                                   for p in ports][:18],
                    "errors": sum(p.errors for p in ports), "judged_from": ["nic_counters"]}
        start = max(job.ctx.first_ts, min(p.first_ts for p in ports))
        out.append(Finding(KIND, node, cfg.severity or spec.severity, start, max(p.last_ts for p in ports), True, 0.0,
                           evidence,
                           spec.suggestion_for(job.ctx.workload_class)))
    return out
