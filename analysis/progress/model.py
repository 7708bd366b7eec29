"""Typed inputs and outputs of the progress analysis (no database, no HTTP)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.progress_fold import HIST_MAX_BUCKET, HIST_MIN_BUCKET

SPAN_CAUSES = ("init", "compile", "data_wait", "checkpoint_save", "checkpoint_load", "eval")
OTHER_CAUSES = ("restart_lost", "idle", "hung", "unexplained")


@dataclass(frozen=True, slots=True)
class Window:
    """One stored ``job_progress`` row (protocol.ProgressWindow)."""

    rank: int
    pid: int
    start: float
    end: float
    host: str | None = None
    node: str | None = None
    gpu: str | None = None
    world_size: int | None = None
    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    max_step: int | None = None
    restarts: int = 0
    lost_steps: int = 0
    tokens: int | None = None
    samples: int | None = None
    productive_s: float = 0.0
    stall_s: float = 0.0
    unfinished_s: float = 0.0
    spans: Mapping[str, float] = field(default_factory=dict)
    span_counts: Mapping[str, int] = field(default_factory=dict)
    step_time_p50_s: float | None = None
    step_time_p95_s: float | None = None
    step_hist: Mapping[str, int] = field(default_factory=dict)
    last_step_ts: float | None = None
    since_step_s: float | None = None
    open_span: str | None = None
    open_span_s: float | None = None
    alive: bool = True
    ended: bool = False
    process_start: float | None = None
    flops_per_step: float | None = None
    params: int | None = None
    dropped: int = 0

    @property
    def accounted_s(self) -> float:
        return self.productive_s + sum(self.spans.values()) + self.stall_s + self.unfinished_s

    @classmethod
    def from_row(cls, row: Mapping[Any, Any], node: str | None = None) -> Window:  # a RowMapping: str or Column keys
        import json

        def js(v: Any) -> dict[str, Any]:
            if v is None:
                return {}
            return json.loads(v) if isinstance(v, str) else dict(v)

        return cls(rank=row["rank"], pid=row["pid"], start=row["start_ts"], end=row["end_ts"], host=row["host"],
                   node=node, gpu=row["gpu"], world_size=row["world_size"], steps=row["steps"],
                   first_step=row["first_step"], last_step=row["last_step"], max_step=row["max_step"],
                   restarts=row["restarts"], lost_steps=row["lost_steps"], tokens=row["tokens"],
                   samples=row["samples"], productive_s=row["productive_s"], stall_s=row["stall_s"],
                   unfinished_s=row["unfinished_s"], spans=js(row["spans"]), span_counts=js(row["span_counts"]),
                   step_time_p50_s=row["step_time_p50_s"], step_time_p95_s=row["step_time_p95_s"],
                   step_hist=_hist(js(row["step_hist"])), last_step_ts=row["last_step_ts"],
                   since_step_s=row["since_step_s"], open_span=row["open_span"], open_span_s=row["open_span_s"],
                   alive=bool(row["alive"]), ended=bool(row["ended"]), process_start=row["process_start"],
                   flops_per_step=row["flops_per_step"], params=row["params"], dropped=row["dropped"])


def _hist(h: dict[str, Any]) -> dict[str, int]:
    """The histogram's buckets a reader can use: a row stored before the intake bounded them
    (or written by another path) may hold a bucket past any float (1.1^8000) or no number."""
    out: dict[str, int] = {}
    for k, v in h.items():
        try:
            b = int(k)
        except (TypeError, ValueError):
            continue
        if HIST_MIN_BUCKET <= b <= HIST_MAX_BUCKET and isinstance(v, int) and v > 0:
            out[str(b)] = v
    return out


@dataclass(frozen=True, slots=True)
class Allocation:
    """The job's allocated wall time: [start, end]; ``source`` says where it came from."""

    start: float
    end: float
    source: str  # "allocations" | "job" | "progress"


@dataclass
class RankGoodput:
    rank: int
    host: str | None
    node: str | None
    gpu: str | None
    productive_s: float
    badput_s: dict[str, float]
    steps: int
    restarts: int
    lost_steps: int
    step_time_p50_s: float | None
    step_time_p95_s: float | None
    processes: int


@dataclass
class Goodput:
    """``GET /api/v1/jobs/{id}`` ``goodput``; None = not known (never zero)."""

    ettr: float | None
    allocated_s: float
    productive_s: float
    badput_s: dict[str, float]
    tokens_per_s: float | None
    tokens_per_gpu_s: float | None
    mfu: float | None
    achieved_tflops: float | None
    step_time_p50_s: float | None
    step_time_p95_s: float | None
    restarts: int
    lost_steps: int
    steps: int
    ranks: int
    allocation_source: str
    eval_productive: bool
    source: str = "progress"
    per_rank: list[RankGoodput] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        r = _round
        return {"ettr": r(self.ettr, 4), "allocated_s": r(self.allocated_s, 3), "productive_s": r(self.productive_s, 3),
                "badput_s": {k: r(v, 3) for k, v in self.badput_s.items()}, "tokens_per_s": r(self.tokens_per_s, 3),
                "tokens_per_gpu_s": r(self.tokens_per_gpu_s, 3), "mfu": r(self.mfu, 4),
                "achieved_tflops": r(self.achieved_tflops, 3), "step_time_p50_s": r(self.step_time_p50_s, 6),
                "step_time_p95_s": r(self.step_time_p95_s, 6), "restarts": self.restarts,
                "lost_steps": self.lost_steps, "steps": self.steps, "ranks": self.ranks,
                "allocation_source": self.allocation_source, "eval_productive": self.eval_productive,
                "source": self.source}


def _round(v: float | None, nd: int) -> float | None:
    return None if v is None else round(float(v), nd)
