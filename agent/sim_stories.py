"""What a simulated training job's processes do over time, drawn per job: its progress story.

Shared by the GPU profiles (agent/simulator.py: the GPUs idle while a process initialises,
compiles, loads or saves a checkpoint, or between a crash and the restart) and the progress
emitters (agent/sim_progress.py: the same job reporting steps and spans through
``gpufleet.progress``), so the hardware samples and the job's own progress tell one story.

Stories (job time ``t`` in seconds since the job started):

* ``healthy``: one process; a short init/compile/checkpoint load; periodic checkpoint saves.
* ``step_time_regression``: 12-25 minutes in, the step time rises 35-80% and stays
  (a data-loader worker lost, a memory-fragmentation slowdown, a changed sequence-length mix).
* ``slow_rank``: independent ranks (a sharded evaluation/inference sweep); one shares its
  host's CPUs with another tenant and steps 30-70% slower (the step-time histogram is 10% wide).
* ``restart_lost_progress``: the job crashes (NCCL timeout, a node reboot) long after its
  last checkpoint and restarts from it: the steps since are redone.
* ``checkpoint_overhead``: synchronous saves to a slow file system every few minutes.
* ``startup_overhead``: minutes of init and torch.compile max-autotune, then a short load
  of the model's weights, before the first step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

STORIES = ("step_time_regression", "slow_rank", "restart_lost_progress", "checkpoint_overhead", "startup_overhead")


@dataclass(frozen=True, slots=True)
class Process:
    start: float  # job time the process starts
    end: float | None  # job time it dies (None: runs on)
    first_step: int  # the step it resumes from (the last checkpoint's)
    init_s: float
    compile_s: float
    load_s: float

    @property
    def training_from(self) -> float:
        return self.start + self.init_s + self.compile_s + self.load_s


@dataclass(frozen=True, slots=True)
class Story:
    kind: str
    step_s: float
    procs: tuple[Process, ...]
    ckpt_every: float  # seconds of training between saves
    ckpt_len: float
    regress_at: float = 1e18  # step_time_regression
    regress_k: float = 1.0
    slow_rank: int = -1
    slow_k: float = 1.0

    def step_time(self, t: float, rank: int) -> float:
        k = self.regress_k if t >= self.regress_at else 1.0
        return self.step_s * k * (self.slow_k if rank == self.slow_rank else 1.0)

    def process_at(self, t: float) -> Process | None:
        for p in self.procs:
            if p.start <= t and (p.end is None or t < p.end):
                return p
        return None

    def phase(self, t: float) -> str:
        """What the job's GPUs do at job time ``t``: down, init, compile, checkpoint_load,
        checkpoint_save or train."""
        p = self.process_at(t)
        if p is None:
            return "down"
        if t < p.start + p.init_s:
            return "init"
        if t < p.start + p.init_s + p.compile_s:
            return "compile"
        if t < p.training_from:
            return "checkpoint_load"
        if (t - p.training_from) % (self.ckpt_every + self.ckpt_len) >= self.ckpt_every:
            return "checkpoint_save"
        return "train"


@lru_cache(maxsize=4096)
def story(kind: str, job_seed: int) -> Story:
    r = random.Random(f"story/{kind}/{job_seed}")
    step_s = r.uniform(0.6, 2.0)
    # A start-up of 35-90 s: under startup_overhead's 10% of a half-hour run, restart included.
    init, comp, load = r.uniform(10, 25), r.uniform(15, 40), r.uniform(10, 25)
    every, length = r.uniform(900, 2400), r.uniform(15, 60)
    one = (Process(0.0, None, 0, init, comp, load),)
    if kind == "step_time_regression":
        return Story(kind, step_s, one, every, length, regress_at=r.uniform(720, 1500), regress_k=r.uniform(1.35, 1.8))
    if kind == "slow_rank":
        return Story(kind, step_s, one, every, length, slow_rank=r.randrange(4), slow_k=r.uniform(1.3, 1.7))
    if kind == "restart_lost_progress":
        # The first checkpoint comes late (every 40-60 min); the crash lands 15-25 min after
        # the process started training, so everything since the start is redone.
        crash = r.uniform(900, 1500)
        first = Process(0.0, crash, 0, init, comp, load)
        again = Process(crash + r.uniform(60, 180), None, 0, r.uniform(5, 15), r.uniform(5, 20), load)  # warm caches
        return Story(kind, step_s, (first, again), r.uniform(2400, 3600), length)
    if kind == "checkpoint_overhead":
        return Story(kind, step_s, one, r.uniform(180, 420), r.uniform(60, 120))
    if kind == "startup_overhead":
        # The load is of a warm-started model's weights only (optimizer state comes later, lazily):
        # the start-up is init and compile; a long load would be checkpoint overhead as well.
        return Story(kind, step_s, (Process(0.0, None, 0, r.uniform(60, 150), r.uniform(300, 540),
                                            r.uniform(20, 60)),), every, length)
    # A healthy job: a small model with a warm compile cache starts in under a minute.
    quick = (Process(0.0, None, 0, r.uniform(5, 15), r.uniform(10, 25), r.uniform(5, 15)),)
    return Story("healthy", step_s, quick, every, length)
