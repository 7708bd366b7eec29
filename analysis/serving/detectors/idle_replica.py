"""idle_replica: a replica held its GPUs for a long stretch while it served (almost) nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import ServingKindConfig
from .base import DeploymentView, ServingDetector, ServingFinding, make_finding

KIND = "idle_replica"


@dataclass(frozen=True, kw_only=True)
class Config(ServingKindConfig):
    SECTION: ClassVar[str] = KIND
    requests_per_minute: float


def idle_stretch(counts: list[float], per_minute: float) -> tuple[int, int]:
    """The longest run of consecutive minutes whose mean request rate is under ``per_minute`` (a
    stray request does not end an idle night); (start index, length), length 0 when none."""
    best = (0, 0)
    prefix = [0.0]
    for c in counts:
        prefix.append(prefix[-1] + c)
    n = len(counts)
    for i in range(n):
        for j in range(n, i + best[1], -1):  # longest first: stop at the first that qualifies
            if prefix[j] - prefix[i] < per_minute * (j - i):
                best = (i, j - i)
                break
    return best


def detect(view: DeploymentView, cfg: Config) -> list[ServingFinding]:
    out = []
    for replica, ms in view.replicas.items():
        known = [m for m in ms if m.scalar("requests") is not None]  # no counter: not judged (unknown)
        counts = [m.scalar("requests") or 0.0 for m in known]
        start, run = idle_stretch(counts, cfg.requests_per_minute)
        if run < cfg.min_minutes:
            continue
        out.append(make_finding(view, KIND, cfg, replica, {
            "replica": replica, "requests_per_minute": sum(counts[start:start + run]) / run,
            "gpus": max(m.gpus for m in ms), "idle_minutes": run,
            "threshold_requests_per_minute": cfg.requests_per_minute, "flagged_minutes": run,
            "judged_minutes": len(known)}))
    return out


DETECTOR = ServingDetector(KIND, Config, detect)
