"""What the checkpoint kinds share: the job's checkpoint cost and interval, its observed MTBF
and Young/Daly's interval (not a detector: no ``KIND``)."""

from __future__ import annotations

import math
from typing import Any

from .base import ProgressContext, r


def young_daly_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young/Daly's first-order optimum checkpoint interval: sqrt(2 x C x MTBF)."""
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def checkpoint_evidence(ctx: ProgressContext) -> dict[str, Any]:
    lowest = min(w.rank for w in ctx.windows)
    ws = [w for w in ctx.windows if w.rank == lowest]
    total = sum(w.spans.get("checkpoint_save", 0.0) for w in ws)
    n = sum(int(w.span_counts.get("checkpoint_save", 0)) for w in ws)
    g = ctx.goodput
    cost = total / n if n else None
    interval = g.productive_s / n if n else None
    failures = g.restarts
    mtbf = g.allocated_s / failures if failures else None
    suggested = young_daly_s(cost, mtbf) if (cost and mtbf) else None
    return {"checkpoint_cost_s": r(cost, 2), "checkpoints": n, "checkpoint_interval_s": r(interval, 1),
            "failures": failures, "mtbf_s": r(mtbf, 1), "young_daly_interval_s": r(suggested, 1)}


def extent(ctx: ProgressContext) -> tuple[float, float]:
    return min(w.start for w in ctx.windows), ctx.newest
