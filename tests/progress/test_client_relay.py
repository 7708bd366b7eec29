"""The client never blocks or raises; the relay folds what it receives; the agent journals and
spools the windows with its batches, so a crash loses none and a retry stores none twice."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import zstandard

from gpufleet import progress
from gpufleet.agent.progress_relay import ProgressRelay, attach
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.simulator import SimulatedFleet
from gpufleet.agent.spool import Spool
from gpufleet.progress import Reporter
from gpufleet.protocol import Batch, decode

DOWN = "http://127.0.0.1:9"


def sock_path(tmp_path: Path) -> str:
    # AF_UNIX paths are limited to 108 bytes; pytest's tmp paths can be longer.
    d = Path("/tmp") / f"gpf-{os.getpid()}-{abs(hash(tmp_path)) % 10**8}"
    d.mkdir(exist_ok=True)
    return str(d / "p.sock")


def wait_for(cond, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_no_listener_never_raises_and_counts_drops(tmp_path: Path) -> None:
    r = Reporter(str(tmp_path / "nobody.sock"), start_thread=False)
    for i in range(100):
        r.step(i, tokens=5)
    with r.span("checkpoint_save"):
        pass
    r.event("odd", obj=object(), n=1)
    r.flush()
    assert r.stats()["dropped"] == 103 and r.stats()["sent"] == 0


def test_buffer_is_bounded_and_overflow_is_counted(tmp_path: Path) -> None:
    r = Reporter(str(tmp_path / "x.sock"), start_thread=False, max_buffer=10)
    for i in range(25):
        r.step(i)
    assert len(r._buf) == 10 and r.dropped == 15


def test_disabled_reporter_does_nothing() -> None:
    r = Reporter("off")
    r.step(1)
    assert r.disabled and not r._buf and r._thread is None


def test_events_reach_the_relay_and_fold_exactly(tmp_path: Path) -> None:
    path = sock_path(tmp_path)
    relay = ProgressRelay(path)
    try:
        r = Reporter(path)
        r.init(job_id="job-7", rank=3, world_size=4, flops_per_step=1e12)
        with r.span("init"):
            time.sleep(0.02)
        for i in range(1, 501):
            r.step(i, tokens=128)
        r.event("lr", value=0.1)
        r.flush()
        wait_for(lambda: relay.events >= 503)
        windows = relay.drain_all()
        r.shutdown()
    finally:
        relay.close()
    assert {w.job_id for w in windows} == {"job-7"} and {w.rank for w in windows} == {3}
    assert sum(w.steps for w in windows) == 500
    assert sum(w.tokens or 0 for w in windows) == 500 * 128
    assert sum(w.spans.get("init", 0.0) for w in windows) >= 0.02
    assert windows[0].flops_per_step == 1e12 and windows[0].world_size == 4
    assert any(e["name"] == "lr" for w in windows for e in w.events)
    assert r.stats()["dropped"] == 0
    assert not os.path.exists(path)


def test_module_api_survives_fork_and_reports_from_the_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sock_path(tmp_path)
    monkeypatch.setenv("GPUFLEET_PROGRESS", path)
    monkeypatch.setenv("GPUFLEET_JOB_ID", "forky")
    relay = ProgressRelay(path)
    try:
        progress.shutdown()
        progress.step(1)
        pid = os.fork()
        if pid == 0:  # a DataLoader worker: keeps none of the parent's events
            progress.step(99)
            os._exit(0 if progress._reporter is not None and progress._reporter.sent == 0 else 1)
        _, status = os.waitpid(pid, 0)
        assert status == 0
        progress.step(2)
        progress.flush()
        wait_for(lambda: relay.events >= 2)
        time.sleep(0.3)  # the child's flusher (0.2 s) would have sent by now if it did
        windows = relay.drain_all()
    finally:
        progress.shutdown()
        relay.close()
    parent = [w for w in windows if w.pid == os.getpid()]
    assert sum(w.steps for w in parent) == 2 and parent[0].job_id == "forky"


def _batches(spool_dir: Path) -> list[Batch]:
    s = Spool(spool_dir, 2**30)
    out = []
    for it in s._items:
        header, body = it.read()
        raw = zstandard.ZstdDecompressor().decompress(body) if header["headers"].get("Content-Encoding") == "zstd" \
            else body
        out.append(decode(raw, header["headers"]["Content-Type"]))
    return out


def _agent(tmp_path: Path) -> Agent:
    fleet = SimulatedFleet(nodes=1, gpus_per_node=2, start_ts=time.time() - 600)
    cfg = AgentConfig(collector_url=DOWN, node="n1", spool_dir=tmp_path / "spool", fsync=False)
    return Agent(cfg, fleet.source(fleet.node_names()[0]))


def test_agent_journals_windows_so_a_crash_loses_none(tmp_path: Path) -> None:
    path = sock_path(tmp_path)
    a1 = _agent(tmp_path)
    relay = attach(a1, path)
    assert relay is not None
    a1.start()
    r = Reporter(path)
    r.init(job_id="train-1", rank=0)
    for i in range(1, 201):
        r.step(i, tokens=10)
    r.flush()
    wait_for(lambda: relay.events >= 200)
    # The windows close 1.5 s after their end: cycle until the relay has handed them over.
    t = time.time() + 12
    while a1._open is not None and not a1._open.progress:  # type: ignore[union-attr]
        a1.cycle(t)
        t += 1
        time.sleep(0.05)
        assert t < time.time() + 60
    key = (a1.boot_id, a1._open.agent.seq)  # type: ignore[union-attr]
    held = sum(w.steps for w in a1._open.progress)  # type: ignore[union-attr]
    r.shutdown()
    relay.close()
    a1.journal.close()  # SIGKILL here: no flush
    a1.spool.unlock()
    a2 = _agent(tmp_path)
    a2.start()
    (b,) = _batches(tmp_path / "spool")
    assert (b.agent.boot_id, b.agent.seq) == key
    assert sum(w.steps for w in b.progress) == held == 200


def test_agent_run_flushes_open_windows_at_shutdown(tmp_path: Path) -> None:
    path = sock_path(tmp_path)
    a = _agent(tmp_path)
    a.config.interval_s = 0.05
    a.config.flush_s = 0.2
    relay = attach(a, path)
    assert relay is not None
    stop = threading.Event()
    th = threading.Thread(target=a.run, args=(stop,))
    th.start()
    r = Reporter(path)
    r.init(job_id="train-2")
    for i in range(1, 51):
        r.step(i)
    r.flush()
    wait_for(lambda: relay.events >= 50)
    stop.set()
    th.join(30)
    r.shutdown()
    relay.close()
    batches = _batches(tmp_path / "spool")
    assert sum(w.steps for b in batches for w in b.progress) == 50


def test_a_second_relay_does_not_steal_a_live_socket_but_replaces_a_stale_one(tmp_path: Path) -> None:
    path = sock_path(tmp_path)
    first = ProgressRelay(path)
    try:
        with pytest.raises(OSError, match="another agent listens"):
            ProgressRelay(path)
    finally:
        first._stop.set()
        first._thread.join(2)
        first._sock.close()  # dies without unlinking: the socket file stays, stale
    assert os.path.exists(path)
    second = ProgressRelay(path)
    second.close()


def test_a_stream_without_a_job_goes_to_the_job_of_the_gpu_its_process_runs_on() -> None:
    """Two process-attributed jobs on a node (no scheduler): each trainer's stream follows the
    GPU NVML lists its pid on; an unknown pid with two jobs stays unnamed (stored under
    unattributed-<host>-<pid> by the relay), with one job it goes to that job."""
    from types import SimpleNamespace

    from gpufleet.agent.progress_relay import one_job_on_node
    from gpufleet.agent.runner import Sample
    from gpufleet.agent.sources.base import GpuReading, SourceAttribution

    two = SourceAttribution(gpu_job={"GPU-a": "n:100:1", "GPU-b": "n:200:2"})
    agent = SimpleNamespace(last=Sample(ts=0.0, devices=[], attribution=two, readings=[
        GpuReading("GPU-a", pids=(100,)), GpuReading("GPU-b", pids=(200, 201))]))
    job_for = one_job_on_node(agent)
    assert job_for({"pid": 200}) == "n:200:2" and job_for({"pid": 201}) == "n:200:2"
    assert job_for({"pid": 100}) == "n:100:1"
    assert job_for({"pid": 999}) is None, "two jobs and no GPU lists the pid: no guess"
    agent.last = Sample(ts=0.0, devices=[], attribution=SourceAttribution(gpu_job={"GPU-a": "n:100:1"}),
                        readings=[GpuReading("GPU-a", pids=(100,))])
    assert job_for({"pid": 999}) == "n:100:1", "one job on the node: a containerised pid still lands"
    assert one_job_on_node(SimpleNamespace(last=None))({"pid": 1}) is None
