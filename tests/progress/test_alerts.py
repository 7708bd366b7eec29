"""Slack: a hung job (from its own progress) alerts at once under the default rules, even a
CPU-only one; the same kind at warning severity waits for the waste rule like any flag."""

from __future__ import annotations

import time

from gpufleet.alerts.config import AlertConfig
from gpufleet.alerts.decide import alerting_kinds
from gpufleet.alerts.facts import FlagFact, JobFacts


def _job(severity: str, n_gpus: int) -> JobFacts:
    now = time.time()
    flag = FlagFact(kind="hung", scope="progress", severity=severity, wasted_gpu_hours=0.05,
                    evidence={"confidence": "high", "stuck_ranks": [1]}, start_ts=now - 150, end_ts=now)
    return JobFacts(job_pk=1, cluster="default", job_id="j", start_ts=now - 300, n_gpus=n_gpus, flags=(flag,))


def test_a_critical_hang_pages_within_minutes() -> None:
    cfg = AlertConfig()
    now = time.time()
    assert "hung" in alerting_kinds(_job("critical", 8), cfg, now)
    assert "hung" in alerting_kinds(_job("critical", 0), cfg, now)  # a CPU-only training job
    assert "hung" not in alerting_kinds(_job("warning", 8), cfg, now)  # 5 minutes old, 0.05 GPU-h: not yet
