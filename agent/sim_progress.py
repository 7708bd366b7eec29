"""The demo's training processes reporting their own progress, as real ones do: through the
``gpufleet.progress`` client to the node agent's relay socket (agent/progress_relay.py).

Each simulated job with a progress story (agent/sim_stories.py) runs ``RANKS`` reporting ranks;
each rank's processes are ``gpufleet.progress.Reporter`` objects on the simulated clock (a
replayed past reports in the past), sending datagrams to the relay, which folds them into 10 s
windows that travel with the agent's batches. A crash is a process that stops reporting (no
clean exit); its restart is a new process resuming from its last checkpoint's step.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpufleet.progress import Reporter

from .sim_stories import Story, story
from .simulator import SimJob

RANKS = 4  # ranks per job that report (a real job's every rank may; four show a slow one)
FLUSH_S = 5.0  # simulated seconds between flushes (under the relay's 10 s expiry)
# A replayed past runs many times faster than real time, and the relay's socket queues only a few
# datagrams (net.unix.max_dgram_qlen, 10 by default): a burst beyond it is dropped by the client.
# Given the relay's count of datagrams received, the driver keeps at most QUEUE_ROOM in flight
# (waiting at most PACE_WAIT_S for the relay's thread); without it each flush yields PACE_S.
PACE_S = 0.001
QUEUE_ROOM = 6
PACE_WAIT_S = 1.0
TOKENS_PER_STEP = 4 * 4096  # micro-batch of four 4k-token sequences


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


Event = tuple[float, str, Any]  # (job time, "start" | "b" | "e" | "s" | "crash", payload)


def events(st: Story, rank: int, seed: int, t_from: float) -> Iterator[Event]:
    """One rank's process starts, spans and steps in time order, from job time ``t_from`` on."""
    rng = random.Random(f"progress/{seed}/{rank}")
    for p in st.procs:
        if p.end is not None and p.end <= t_from:
            continue
        yield (max(p.start, t_from), "start", p)
        t = p.start
        for kind, d in (("init", p.init_s), ("compile", p.compile_s), ("checkpoint_load", p.load_s)):
            if t + d > t_from:
                yield (max(t, t_from), "b", kind)
                yield (t + d, "e", kind)
            t += d
        step, save_at = p.first_step, p.training_from + st.ckpt_every
        while p.end is None or t < p.end:
            if t >= save_at:  # a synchronous save: no steps until it is written
                end = save_at + st.ckpt_len
                if end > t_from:
                    yield (max(t, t_from), "b", "checkpoint_save")
                    yield (end, "e", "checkpoint_save")
                t, save_at = end, end + st.ckpt_every
                continue
            t += st.step_time(t, rank) * math.exp(rng.gauss(0.0, 0.03))
            step += 1
            if p.end is not None and t >= p.end:
                break  # died inside this step
            if t > t_from:
                yield (t, "s", step)
        if p.end is not None:
            yield (p.end, "crash", None)


@dataclass
class _RankStream:
    job: SimJob
    rank: int
    gen: Iterator[Event]
    pending: Event | None
    clock: _Clock = field(default_factory=_Clock)
    rep: Reporter | None = None
    spans: list[contextlib.AbstractContextManager[None]] = field(default_factory=list)
    restarts: int = 0


class ProgressDriver:
    """``advance(now)`` each agent cycle (the agent that owns the relay): every reporting rank
    emits what its processes did up to ``now`` and flushes every FLUSH_S."""

    def __init__(self, jobs: list[SimJob], destination: str | Callable[[str], str], *, storied_only: bool = True,
                 received: Callable[[], int] | None = None) -> None:
        # destination: one relay, or a node's relay by node name (each rank reports to its
        # own node's, as on a cluster)
        self.destination = destination
        self.received = received  # the relay's datagrams received (ProgressRelay.received), to pace by
        # storied_only: the jobs whose profile has a progress story; else every job given
        # reports (the others with a healthy story: tests, false positives)
        self.jobs = [j for j in jobs if j.profile.progress_flags or not storied_only]
        self.flushes = 0  # flushes (one datagram per stream and flush: < 512 events each)
        self.sent = 0  # ... of them the socket took (the others' events are the Reporter's dropped)
        self.streams: list[_RankStream] = []
        self._seen: set[str] = set()
        self._flushed = -math.inf

    def _open(self, job: SimJob, now: float) -> None:
        st = story(job.profile.name, job.seed)
        for rank in range(min(RANKS, len(job.gpus))):
            gen = events(st, rank, job.seed, max(0.0, now - job.start_ts))
            self.streams.append(_RankStream(job, rank, gen, next(gen, None)))

    def _apply(self, s: _RankStream, ev: Event) -> None:
        t, what, payload = ev
        s.clock.t = t
        job = s.job
        if what == "start":
            dest = self.destination if isinstance(self.destination, str) else self.destination(job.gpus[s.rank][0])
            s.rep = Reporter(dest, start_thread=False, clock=s.clock,
                             wall=lambda: job.start_ts + s.clock.t, pid=41000 + 1000 * s.restarts + s.rank)
            s.rep.init(job_id=job.job_id, rank=s.rank, world_size=len(job.gpus))
            s.spans = []
        elif s.rep is None:
            return
        elif what == "b":
            cm = s.rep.span(payload)
            cm.__enter__()
            s.spans.append(cm)
        elif what == "e" and s.spans:
            s.spans.pop().__exit__(None, None, None)
        elif what == "s":
            s.rep.step(payload, tokens=TOKENS_PER_STEP)
        elif what == "crash":  # what it buffered went out at its last flush or goes now; then silence
            self._flush(s.rep)
            s.rep, s.spans = None, []
            s.restarts += 1

    def advance(self, now: float) -> None:
        for j in self.jobs:
            if j.job_id not in self._seen and j.start_ts <= now and (j.end_ts is None or now < j.end_ts):
                self._seen.add(j.job_id)
                self._open(j, now)
        for s in self.streams:
            t_now = now - s.job.start_ts
            while s.pending is not None and s.pending[0] <= t_now:
                self._apply(s, s.pending)
                s.pending = next(s.gen, None)
        if now - self._flushed >= FLUSH_S:
            self._flushed = now
            for s in self.streams:
                if s.rep is not None:
                    s.clock.t = now - s.job.start_ts  # the heartbeat's "now"
                    self._flush(s.rep)

    def _flush(self, rep: Reporter) -> None:
        dropped = rep.dropped
        rep.flush()
        self.flushes += 1
        if rep.dropped == dropped:
            self.sent += 1
        if self.received is None:
            time.sleep(PACE_S)
            return
        deadline = time.monotonic() + PACE_WAIT_S
        while self.sent - self.received() >= QUEUE_ROOM and time.monotonic() < deadline:
            time.sleep(0.0005)
