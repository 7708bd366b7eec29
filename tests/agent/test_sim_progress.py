"""The demo's progress stories through the real client and relay: simulated training processes
(agent/sim_progress.py) report with ``gpufleet.progress.Reporter`` on the simulated clock to a
``ProgressRelay`` socket; the windows it folds go through the goodput accounting and the progress
detectors, which raise each story's kind and nothing for a healthy job."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from gpufleet.agent.progress_relay import ProgressRelay
from gpufleet.agent.sim_progress import ProgressDriver
from gpufleet.agent.simulator import PROFILES, make_job
from gpufleet.analysis.progress.detect import detect_all
from gpufleet.analysis.progress.goodput import job_goodput
from gpufleet.analysis.progress.model import Allocation, Window

T0 = 1_790_000_000.0
MINUTES = 32


def _windows(profile: str, tmp: Path, minutes: float = MINUTES, job_id: str = "7401") -> tuple[list[Window], float]:
    job = make_job(profile, job_id, 4, T0, minutes * 60)
    sim = [T0]  # the relay's wall clock is the simulated one: windows it closes at the end are "now"
    relay = ProgressRelay(tmp / "p.sock", wall=lambda: sim[0])
    driver = ProgressDriver([job], str(tmp / "p.sock"), storied_only=False, received=lambda: relay.received)
    out = []
    try:
        t = T0
        while t <= T0 + minutes * 60:
            sim[0] = t
            driver.advance(t)
            if int(t - T0) % 30 == 0:  # as an agent's cycle would, only less often (cheaper)
                # the relay's thread folds what was sent before we close windows; a datagram the
                # socket took is never lost, so wait for all of it (a 2 s bound went on without it
                # on a loaded box, and late steps fell into the next windows)
                deadline = time.monotonic() + 60
                while relay.received < driver.sent:
                    assert time.monotonic() < deadline, f"relay read {relay.received} of {driver.sent} datagrams"
                    time.sleep(0.002)
                out += relay.drain(t)
            t += 1.0
        out += relay.drain_all()
    finally:
        relay.close()
    keys = set(Window.__dataclass_fields__) - {"start", "end", "node"}
    ws = []
    for pw in out:
        d = msgspec.to_builtins(pw)
        assert d["job_id"] == job_id
        ws.append(Window(start=d["start"], end=d["end"], **{k: d[k] for k in keys if k in d}))
    return ws, t


# Every story, at the shortest and longest age a demo job has when the first analysis pass runs
# (agent/simulator.py _age: 30-35 min, then up to 2 min of replay), and a healthy job (no kind).
STORIED = ["step_time_regression", "slow_rank", "restart_lost_progress", "checkpoint_overhead", "startup_overhead"]


@pytest.mark.parametrize("minutes", [30, 37])
@pytest.mark.parametrize("profile", [*STORIED, "llm_pretrain"])
def test_progress_stories_raise_their_kinds(profile: str, minutes: int, tmp_path: Path) -> None:
    ws, now = _windows(profile, tmp_path, minutes)
    assert {w.rank for w in ws} == {0, 1, 2, 3}
    assert max(w.end for w in ws) <= now + 10.0  # on the simulated clock (10 s windows), none in the future
    g = job_goodput(ws, Allocation(T0, now, "job"))
    assert g is not None
    kinds = {f.kind for f in detect_all(ws, g, now)}
    assert kinds == set(PROFILES[profile].progress_flags), (kinds, g.badput_s)


def test_every_story_has_a_profile() -> None:
    assert {k for p in PROFILES.values() for k in p.progress_flags} == set(STORIED)


def test_each_simulated_rank_reports_to_its_own_nodes_relay(tmp_path: Path) -> None:
    """The demo runs one relay per simulated node (gpufleet up): a rank's windows arrive through
    the relay of the node its GPU is on, so a progress flag names the rank's node, not the
    first node's (issue 37)."""
    job = make_job("slow_rank", "7402", 4, T0, 5 * 60)
    job.gpus = [("sim-a", 0), ("sim-a", 1), ("sim-b", 0), ("sim-b", 1)]  # ranks 0-1 on one node, 2-3 on another
    nodes = ["sim-a", "sim-b"]
    relays = {n: ProgressRelay(tmp_path / f"p{i}.sock", wall=lambda: T0 + 300) for i, n in enumerate(nodes)}
    driver = ProgressDriver([job], lambda n: str(relays[n].path), storied_only=False,
                            received=lambda: sum(r.received for r in relays.values()))
    try:
        for t in range(int(T0), int(T0) + 300, 5):
            driver.advance(float(t))
        deadline = time.monotonic() + 60
        while sum(r.received for r in relays.values()) < driver.sent:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        ranks_by_node = {n: {w.rank for w in r.drain_all()} for n, r in relays.items()}
    finally:
        for r in relays.values():
            r.close()
    want: dict[str, set[int]] = {n: set() for n in nodes}
    for rank, (node, _) in enumerate(job.gpus):
        want[node].add(rank)
    assert ranks_by_node == want == {"sim-a": {0, 1}, "sim-b": {2, 3}}, ranks_by_node
