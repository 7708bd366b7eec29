"""The progress library: jobs' own step streams (what ``gpufleet.progress`` sends), each rank a
process with its own clock, labelled with the flag kinds a correct engine raises and when each
fault began (its onset), for precision, recall and time to detect.

Written from public descriptions, not from the detectors:

- clean exits: ``torch.distributed.elastic`` / torchrun end each worker when its loop ends; in
  unsynchronised jobs (parameter-server training as in Alibaba PAI, Weng et al. NSDI'22) fast
  workers finish first and exit while the slow ones go on;
- elastic resizes: TorchElastic (torchrun --nnodes=MIN:MAX) re-forms the group when nodes
  leave or join: workers exit cleanly and new processes (new pids, init again) join;
- a rank that slows late: Falcon (Wu et al., NSDI'24 "Falcon: Pinpointing and Mitigating
  Stragglers for Large-Scale Hybrid-Parallel Training") and Meta's RSC study (Kokolis et al.,
  arXiv 2410.21680) report fail-slow GPUs that appear mid-run (thermal, a degraded link) and
  make one rank several times slower;
- stragglers that come and go: Falcon's traces show transient stragglers of minutes that
  recover (CPU contention, a noisy neighbour);
- a hang: NCCL collectives that never complete leave every process alive and stepping never
  (PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING / watchdog docs: the default timeout is 10-30 min);
- a job-wide slowdown: every rank's step time rises together (a data-pipeline regression,
  power capping of the whole job), the case ``step_time_regression`` exists for.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

StepFn = Callable[[float], float]  # step time (s) at job time t


@dataclass
class Rank:
    rank: int
    pid: int
    t0: float  # process start (job seconds)
    end: float  # last datagram (job seconds)
    step_s: StepFn
    exit: str = "clean"  # "clean" (exit record), "vanish" (datagrams stop), "hang" (alive, no steps after hang_at)
    hang_at: float | None = None
    host: str = ""
    gpu: str = ""
    first_step: int = 1  # the step a process starts counting at (a joiner resumes the group's step)
    steps: list[float] = field(default_factory=list)  # step completion times (job seconds), filled by plan()

    def plan(self, rng: np.random.Generator) -> None:
        t = self.t0 + 5.0  # init
        stop = self.hang_at if self.hang_at is not None else self.end
        while True:
            t += self.step_s(t) * float(rng.uniform(0.97, 1.03))
            if t >= stop:
                break
            self.steps.append(t)


@dataclass
class ProgressCase:
    name: str
    seed: int
    why: str
    duration_s: float
    ranks: list[Rank]
    expect: dict[str, float | None]  # "kind" or "kind@progress:rankN" -> onset (job seconds; None = not timed)
    allowed: frozenset[str] = frozenset()

    @property
    def healthy(self) -> bool:
        return not self.expect


BUILDERS: dict[str, Callable[[np.random.Generator, int], ProgressCase]] = {}


def case(name: str) -> Callable[[Callable[[np.random.Generator, int], ProgressCase]],
                                 Callable[[np.random.Generator, int], ProgressCase]]:
    def deco(fn: Callable[[np.random.Generator, int], ProgressCase]) -> Callable[[np.random.Generator, int],
                                                                                ProgressCase]:
        BUILDERS[name] = fn
        return fn
    return deco


def const(v: float) -> StepFn:
    return lambda t: v


def _ranks(n: int, step: float, dur: float, **kw: object) -> list[Rank]:
    return [Rank(r, 1000 + r, 0.0, dur, const(step), host=f"h{r // 8}", gpu=str(r % 8), **kw)  # type: ignore[arg-type]
            for r in range(n)]


@case("healthy_sync")
def healthy_sync(rng: np.random.Generator, seed: int) -> ProgressCase:
    dur = float(rng.uniform(3600, 5400))
    step = float(rng.uniform(0.3, 1.2))
    return ProgressCase("healthy_sync", seed, "8 data-parallel ranks step together and exit cleanly at the end",
                        dur, _ranks(8, step, dur), {})


@case("clean_exits_staggered")
def clean_exits_staggered(rng: np.random.Generator, seed: int) -> ProgressCase:
    """Unsynchronised workers (PAI-style): each has its own pace and iteration budget; the
    fast ones finish 5-20 min early and exit cleanly."""
    dur = float(rng.uniform(3600, 5400))
    out = []
    for r in range(10):
        step = float(rng.uniform(0.44, 0.47))  # workers alike within a few percent (healthy)
        end = dur - float(rng.uniform(0, 1200)) if r % 2 else dur
        out.append(Rank(r, 1000 + r, 0.0, end, const(step), host=f"h{r // 4}", gpu=str(r % 4)))
    return ProgressCase("clean_exits_staggered", seed, "workers finish at different times and exit cleanly: no hang, "
                        "no regression", dur, out, {})


@case("elastic_resize")
def elastic_resize(rng: np.random.Generator, seed: int) -> ProgressCase:
    """torchrun --nnodes=1:2: the second node leaves at ~40% (its workers exit cleanly), a
    node joins at ~70% (new processes, ranks 4-7 again, init first)."""
    dur = float(rng.uniform(3600, 5400))
    step = float(rng.uniform(0.4, 0.8))
    leave, join = 0.4 * dur, 0.7 * dur
    out = [Rank(r, 1000 + r, 0.0, dur, const(step), host="h0", gpu=str(r)) for r in range(4)]
    out += [Rank(r, 1000 + r, 0.0, leave, const(step), host="h1", gpu=str(r - 4)) for r in range(4, 8)]
    # the joiners load the group's state and go on from its step (TorchElastic re-rendezvous)
    out += [Rank(r, 2000 + r, join, dur, const(step), host="h2", gpu=str(r - 4), first_step=int(join / step))
            for r in range(4, 8)]
    return ProgressCase("elastic_resize", seed, "the group shrinks then grows again; every exit is clean", dur, out, {})


@case("late_slowdown_one_rank")
def late_slowdown_one_rank(rng: np.random.Generator, seed: int) -> ProgressCase:
    """A fail-slow GPU appears late (Falcon; RSC): one rank of 10 runs 3.5x slower from ~70%
    of the run; unsynchronised as in the PAI trace, so only it slows."""
    dur = float(rng.uniform(3600, 5400))
    onset = float(rng.uniform(0.65, 0.75)) * dur
    bad = int(rng.integers(0, 10))
    step = float(rng.uniform(0.4, 0.6))
    out = _ranks(10, step, dur)
    out[bad].step_s = lambda t, s=step, o=onset: s * (3.5 if t >= o else 1.0)
    return ProgressCase("late_slowdown_one_rank", seed, "one rank 3.5x slower late in the run", dur, out,
                        {f"slow_rank@progress:rank{bad}": onset})


@case("straggler_comes_and_goes")
def straggler_comes_and_goes(rng: np.random.Generator, seed: int) -> ProgressCase:
    """A transient straggler (Falcon): 1.6x slower for 5-8 min, fine for 10-15 min, three times."""
    dur = 4200.0
    step = float(rng.uniform(0.4, 0.6))
    bad = int(rng.integers(0, 8))
    spans = []
    t = float(rng.uniform(600, 900))
    for _ in range(3):
        d = float(rng.uniform(300, 480))
        spans.append((t, t + d))
        t += d + float(rng.uniform(600, 900))
    out = _ranks(8, step, dur)
    out[bad].step_s = lambda t, s=step, sp=tuple(spans): s * (1.6 if any(a <= t < b for a, b in sp) else 1.0)
    return ProgressCase("straggler_comes_and_goes", seed, "one rank slow for minutes at a time, three times", dur, out,
                        {f"slow_rank@progress:rank{bad}": spans[0][0]})


@case("hang_all_ranks")
def hang_all_ranks(rng: np.random.Generator, seed: int) -> ProgressCase:
    """A collective that never completes: every process alive (heartbeats), no step after it."""
    dur = float(rng.uniform(2400, 3600))
    at = float(rng.uniform(0.4, 0.7)) * dur
    step = float(rng.uniform(0.3, 1.0))
    out = _ranks(8, step, dur, exit="hang", hang_at=at)
    return ProgressCase("hang_all_ranks", seed, "every rank alive, none stepping after the hang", dur, out,
                        {"hung": at})


@case("job_slowdown")
def job_slowdown(rng: np.random.Generator, seed: int) -> ProgressCase:
    """Every rank 1.4-1.8x slower from mid-run (a data-pipeline regression, a power cap)."""
    dur = float(rng.uniform(3600, 5400))
    onset = float(rng.uniform(0.45, 0.6)) * dur
    f = float(rng.uniform(1.4, 1.8))
    step = float(rng.uniform(0.4, 0.6))
    out = _ranks(8, step, dur)
    for r in out:
        r.step_s = lambda t, s=step, o=onset, k=f: s * (k if t >= o else 1.0)
    return ProgressCase("job_slowdown", seed, "every rank slower from mid-run", dur, out,
                        {"step_time_regression": onset})


PAI = Path(__file__).resolve().parents[3] / "shared" / "data" / "pai-minibatch"
# From the trace's README and a reading of its per-worker medians (tests/progress/test_pai_replay.py):
# job 1: worker 6 becomes a straggler mid-run; job 2: stable differences under 15%;
# job 3: workers 6-9 slow down late. Onsets are not given by the trace: not timed.
PAI_LABELS: dict[str, dict[str, float | None]] = {
    "job_1_norm.csv": {"slow_rank@progress:rank6": None},
    "job_2_norm.csv": {},
    "job_3_norm.csv": {f"slow_rank@progress:rank{r}": None for r in (6, 7, 8, 9)},
}


def pai_case(name: str, ms_per_unit: float = 1.0) -> ProgressCase | None:
    """The PAI trace's per-worker mini-batch times, each worker exiting cleanly after its last
    iteration. The release normalises times to 0-1000, so "its own pace" is a choice: 1 unit =
    1 ms (0.4-1.0 s steps; 22-33 minutes for the ~2,500-3,000 iterations) by default;
    ``ms_per_unit`` stretches it (10: 4-10 s steps, 3.7-5.7 hours)."""
    path = PAI / name
    if not path.exists():
        return None
    per: dict[int, list[tuple[int, int]]] = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            per[int(row["worker"])].append((int(row["time"]), int(row["batch_time_norm"])))
    ranks = []
    for worker, its in sorted(per.items()):
        t = 5.0
        steps = []
        rows = sorted(its)
        for i, (it, norm) in enumerate(rows):
            # The release samples one iteration in ten (iterations 1, 11, 21, ...): the ones
            # in between ran too, at a time the trace does not give; each is replayed at its
            # sampled neighbour's time, so the job lasts as long as its iterations did.
            for _ in range(max(1, rows[i + 1][0] - it) if i + 1 < len(rows) else 1):
                t += norm * ms_per_unit / 1000.0
                steps.append(t)
        ranks.append(Rank(worker, 1000 + worker, 0.0, t + 1.0, const(0.0), host=f"pai-{worker // 4}",
                          gpu=str(worker % 4), steps=steps))
    dur = max(r.end for r in ranks)
    pace = "" if ms_per_unit == 1.0 else f"@{ms_per_unit:g}ms"
    return ProgressCase(f"pai:{name}{pace}", 0, "Alibaba PAI mini-batch trace, replayed at its own pace", dur, ranks,
                        PAI_LABELS[name], frozenset())
