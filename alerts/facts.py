"""Plain data the decision and rendering functions work on (no database, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FlagFact:
    kind: str
    scope: str  # "" = whole job; else a node or GPU name
    severity: str
    wasted_gpu_hours: float = 0.0
    evidence: dict[str, Any] = field(default_factory=dict)
    suggestion: str = ""
    start_ts: float = 0.0
    end_ts: float = 0.0
    open: bool = True


@dataclass(frozen=True)
class JobFacts:
    job_pk: int
    cluster: str
    job_id: str
    user: str | None = None
    name: str | None = None
    account: str | None = None
    partition: str | None = None
    state: str = "running"
    start_ts: float | None = None
    end_ts: float | None = None
    n_gpus: int = 0
    nodes: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    goodput_score: float | None = None
    allocated_gpu_hours: float = 0.0
    wasted_gpu_hours_total: float = 0.0
    flags: tuple[FlagFact, ...] = ()
    # The job's GPU-time ledger summary (the report's "ledger": analysis/ledger.py ``summary``):
    # goodput, coverage and waste by category; None for a report written before the ledger.
    ledger: dict[str, Any] | None = None

    def runtime_s(self, now: float) -> float:
        if self.start_ts is None:
            return 0.0
        return max(0.0, (self.end_ts if self.end_ts is not None else now) - self.start_ts)


@dataclass(frozen=True)
class AlertState:
    """What the database remembers about one (job, kind) alert."""

    kind: str
    state: str  # pending | firing | resolved
    suppressed_by: str | None = None
    fired_at: float | None = None
    last_notified_at: float | None = None


@dataclass(frozen=True)
class GroupState:
    """What the database remembers about one job's messages."""

    state: str  # firing | resolved
    notify_seq: int
    last_notified_at: float


@dataclass(frozen=True)
class SilenceFact:
    id: int
    expires_at: float
    job: str | None = None
    user: str | None = None
    kind: str | None = None
    cluster: str | None = None
