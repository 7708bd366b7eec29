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

# Error counter -> the cause whose suggestion fits (registry: suggestion_by_cause).
CAUSE_OF_COUNTER = {"link_downed": "link_down", "symbol_error": "signal", "port_rcv_errors": "signal",
                    "local_link_integrity_errors": "signal", "port_rcv_remote_physical_errors": "signal",
                    "link_error_recovery": "signal", "excessive_buffer_overrun_errors": "buffer_overrun",
                    "packet_seq_err": "roce_sequence", "out_of_sequence": "roce_sequence",
                    "local_ack_timeout_err": "roce_sequence"}


def cause_of(ports: list[ErrorPort]) -> str | None:
    """A link that went down is the cause whatever else grew (its retraining makes the other
    errors); else the cause whose counters grew most over the node's erring ports."""
    grown: dict[str, float] = {}
    for p in ports:
        for counter, v in p.by_counter.items():
            if counter in CAUSE_OF_COUNTER:
                grown[CAUSE_OF_COUNTER[counter]] = grown.get(CAUSE_OF_COUNTER[counter], 0.0) + v
    if grown.get("link_down", 0.0) > 0:
        return "link_down"
    return max(grown, key=lambda c: grown[c]) if grown else None


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
        cause = cause_of(ports)
        if cause:
            evidence["cause"] = cause
        start = max(job.ctx.first_ts, min(p.first_ts for p in ports))
        out.append(Finding(KIND, node, cfg.severity or spec.severity, start, max(p.last_ts for p in ports), True, 0.0,
                           evidence,
                           spec.suggestion_for(job.ctx.workload_class, cause)))
    return out
