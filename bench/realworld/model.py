"""What a scenario is: jobs with metadata, GPUs, per-second truth, and the labels a correct
engine must meet (the flag kinds it requires, those it allows, and why).

Labels are per sampling interval, because what can be known depends on it: a 10 s
DataLoader stall cycle is visible at 1 s and averages into a steady low mean at 60 s, where
the honest demand is "flag the waste" (``any_of``), not "name the input stall"."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .hardware import Device
from .signals import GpuTruth

# The engine's flag kinds (docs/architecture.md, issue 13's new `hung`). Kinds the engine
# raises that are not listed here are reported as "other" (e.g. a pipeline-imbalance finding)
# and scored only through `allowed`.
KINDS = ("idle_gpu", "low_sm_activity", "no_tensor_cores", "input_stall", "comm_bound", "straggler",
         "memory_underuse", "throttled", "oversized_allocation", "hw_fault", "hung", "crash_loop")
INTERVALS = (1, 10, 30, 60)

# Names an engine may reasonably give the findings issue 13 asks to keep apart from the core
# kinds: pipeline-stage imbalance and over-provisioned serving replicas.
PIPELINE_KINDS = frozenset({"pipeline_imbalance", "stage_imbalance"})
REPLICA_KINDS = frozenset({"overprovisioned_replica", "over_provisioned_replica", "idle_replica",
                           "serving_overprovisioned"})


@dataclass(frozen=True)
class Expect:
    """``required``: each must be raised. ``any_of``: each group must be met by one raised kind
    (the first member is the one counted missed when none is). ``allowed``: may be raised
    without counting as false. Anything else raised is a false positive. ``low_confidence``:
    the job's flags must not carry confidence "high" (judged from fallback signals).
    ``deadline_s``: kind -> seconds from the job's start by which it must be raised and open."""

    required: frozenset[str] = frozenset()
    allowed: frozenset[str] = frozenset()
    any_of: tuple[tuple[str, ...], ...] = ()  # ordered: the head is the kind counted
    low_confidence: bool = False
    deadline_s: tuple[tuple[str, float], ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.required and not self.any_of

    def expected(self) -> frozenset[str]:
        out = set(self.required)
        for g in self.any_of:
            out |= set(g)
        return frozenset(out)

    def ok_kinds(self) -> frozenset[str]:
        return self.expected() | self.allowed


def expect(required: Iterable[str] = (), allowed: Iterable[str] = (), any_of: Iterable[Iterable[str]] = (),
           *, low_confidence: bool = False, deadline_s: dict[str, float] | None = None) -> Expect:
    return Expect(frozenset(required), frozenset(allowed), tuple(tuple(g) for g in any_of), low_confidence,
                  tuple(sorted((deadline_s or {}).items())))


@dataclass
class Slot:
    """A GPU the job holds: on ``node`` at NVML ``index``."""

    node: str
    index: int
    uuid: str
    device: Device
    parent_uuid: str | None = None


@dataclass
class JobSpec:
    job_id: str
    meta: dict[str, Any]  # protocol JobInfo fields besides job_id (source, user, name, partition, labels, ...)
    duration_s: int
    slots: list[Slot]
    truths: list[GpuTruth]
    expect: Callable[[int], Expect]
    why: str
    field_set: str = "dcgm"
    path: str = "batch"  # "batch" (protocol v1 through the write path) or "ndjson" (gpufleet import)
    offset_s: float = 0.0  # start relative to the scenario's base time
    gaps: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # node -> agent-down spans
    profiling_paused: list[tuple[float, float]] = field(default_factory=list)
    node_field_set: dict[str, str] = field(default_factory=dict)  # nodes whose fleet image differs


@dataclass(frozen=True)
class Scenario:
    name: str
    why: str  # one sentence: what it is and why its labels are right
    requires: frozenset[str]  # summary for docs; per-job, per-interval labels are in each JobSpec
    allows: frozenset[str]
    build: Callable[[np.random.Generator, int], list[JobSpec]]
    intervals: tuple[int, ...] = INTERVALS
    seeds: tuple[int, ...] = (1, 2, 3)
    doc: str = ""

    @property
    def healthy(self) -> bool:
        return not self.requires


REGISTRY: dict[str, Scenario] = {}
Build = Callable[[np.random.Generator, int], list[JobSpec]]


def scenario(name: str, *, why: str, requires: Sequence[str] = (), allows: Sequence[str] = (),
             intervals: tuple[int, ...] = INTERVALS, seeds: tuple[int, ...] = (1, 2, 3)
             ) -> Callable[[Build], Build]:
    """Register a generator ``build(rng, seed) -> [JobSpec]`` under ``name``."""
    def deco(fn: Build) -> Build:
        if name in REGISTRY:
            raise ValueError(f"scenario {name!r} registered twice")
        REGISTRY[name] = Scenario(name, why, frozenset(requires), frozenset(allows), fn, intervals, seeds,
                                  (fn.__doc__ or "").strip())
        return fn
    return deco


def instantiate(sc: Scenario, seed: int) -> list[JobSpec]:
    """The scenario's jobs for ``seed``: deterministic (its own generator seeded from the name)."""
    digest = sum((i + 1) * ord(c) for i, c in enumerate(sc.name))
    rng = np.random.default_rng([seed, digest])
    return sc.build(rng, seed)
