"""What the serving detectors share: the deployment they judge and the finding they return (pure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gpufleet.flagkinds import flag_kinds

from ..config import ServingKindConfig
from ..measures import ServingMinute, ServingSummary, by_replica, summarize
from ..slo import Slo


@dataclass(frozen=True)
class DeploymentView:
    """One deployment's replica-minutes over the judged window, with its SLO."""

    deployment: str
    slo: Slo
    minutes: Sequence[ServingMinute]

    @cached_property
    def replicas(self) -> dict[str, list[ServingMinute]]:
        return {r: sorted(ms, key=lambda m: m.minute) for r, ms in sorted(by_replica(self.minutes).items())}

    @cached_property
    def summary(self) -> ServingSummary:
        return summarize(self.deployment, self.minutes, self.slo)

    @cached_property
    def replica_summaries(self) -> dict[str, ServingSummary]:
        return {r: summarize(r, ms, self.slo) for r, ms in self.replicas.items()}

    @property
    def n_minutes(self) -> int:
        return len({m.minute for m in self.minutes})


@dataclass(frozen=True)
class ServingFinding:
    kind: str
    scope: str  # "deployment" or "replica"
    deployment: str
    target: str  # the deployment, or the replica the finding names
    severity: str
    suggestion: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "scope": self.scope, "deployment": self.deployment, "target": self.target,
                "severity": self.severity, "suggestion": self.suggestion, "evidence": self.evidence}


@dataclass(frozen=True)
class ServingDetector:
    kind: str
    config: type[ServingKindConfig]
    detect: Callable[[DeploymentView, Any], list[ServingFinding]]


def r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def make_finding(view: DeploymentView, kind: str, cfg: ServingKindConfig, target: str,
                 evidence: dict[str, Any]) -> ServingFinding:
    """The finding with the registry's scope, severity (or the section's) and the suggestion filled in."""
    k = flag_kinds().get(kind)
    evidence = {key: r3(v) if isinstance(v, float) else v for key, v in evidence.items()}
    return ServingFinding(kind, k.scope, view.deployment, target, cfg.severity or k.severity,
                          k.suggestion_with(evidence, "serving"), evidence)


def longest_run(flags: Sequence[bool]) -> int:
    best = run = 0
    for f in flags:
        run = run + 1 if f else 0
        best = max(best, run)
    return best
