"""Fault tests over real HTTP with the real collector (a `gpufleet serve` subprocess) and
database: whatever happens, samples produced == rows stored, with no duplicates."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.agent.batching import Journal
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.simulator import SimulatedFleet
from gpufleet.agent.spool import Spool
from tests.raw_samples_helpers import uuid_keys

from .conftest import PY, REPO, AgentThread, DropAckProxy, TickClock, stored

pytestmark = pytest.mark.slow


def _agent(url: str, spool: Path, node: str = "sim-node-000", **kw: object) -> Agent:
    fleet = SimulatedFleet(nodes=1, gpus_per_node=4, start_ts=time.time() - 7200)
    cfg = AgentConfig(collector_url=url, node=node, spool_dir=spool, interval_s=0.05, flush_s=0.25,
                      backoff_base_s=0.05, backoff_max_s=0.3, timeout_s=5.0, **kw)  # type: ignore[arg-type]
    return Agent(cfg, fleet.source(node), clock=TickClock())


def _produced(agent: Agent) -> int:
    return int(agent.metrics.registry.get_sample_value("gpufleet_agent_samples_total") or 0)


def _report(name: str, produced: int, rows: int, distinct: int) -> None:
    """One row of docs/reliability.md's fault matrix (shown with pytest -s)."""
    print(f"FAULT {name}: produced={produced} stored={rows} duplicated={rows - distinct}")


def _wait_until(pred, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_collector_down_then_back(database_url, collector_process, tmp_path):
    coll = collector_process(database_url)  # not started: the collector is down
    agent = _agent(coll.url, tmp_path / "spool")
    with AgentThread(agent) as at:
        _wait_until(lambda: len(agent.spool) >= 3)  # batches pile up in the spool while it is down
        failures = agent.metrics.registry.get_sample_value("gpufleet_agent_send_failures_total", {"reason": "failed"})
        assert failures and failures >= 1
        coll.start()
        _wait_until(lambda: (agent.metrics.registry.get_sample_value("gpufleet_agent_batches_sent_total") or 0) >= 4)
        at.stop()
    assert len(agent.spool) == 0, "everything spooled was delivered once the collector came back"
    produced = _produced(agent)
    rows, distinct = stored(database_url)
    _report("collector-down-then-back", produced, rows, distinct)
    assert produced > 0
    assert rows == produced
    assert distinct == rows


def test_collector_killed_mid_stream(database_url, collector_process, tmp_path):
    coll = collector_process(database_url).start()
    agent = _agent(coll.url, tmp_path / "spool")
    with AgentThread(agent) as at:
        for _ in range(2):
            _wait_until(lambda: (agent.metrics.registry.get_sample_value("gpufleet_agent_batches_sent_total")
                                 or 0) >= 2)
            time.sleep(0.3)  # batches are in flight every 250 ms: the kill lands among them
            coll.kill()
            time.sleep(0.5)
            coll.start()
        sent_before = agent.metrics.registry.get_sample_value("gpufleet_agent_batches_sent_total") or 0
        _wait_until(lambda: (agent.metrics.registry.get_sample_value("gpufleet_agent_batches_sent_total")
                             or 0) > sent_before + 2)
        at.stop()
    assert len(agent.spool) == 0
    produced = _produced(agent)
    rows, distinct = stored(database_url)
    _report("collector-killed-twice", produced, rows, distinct)
    assert rows == produced
    assert distinct == rows


def test_lost_acknowledgement_counts_once(database_url, collector_process, tmp_path):
    coll = collector_process(database_url).start()
    proxy = DropAckProxy(coll.port, drop=3)
    try:
        agent = _agent(proxy.url, tmp_path / "spool")
        agent.start()
        for _ in range(12):
            agent.cycle(agent.clock())
            if agent._open is not None and agent._open.n_rows >= 16:
                agent.flush()
        agent.flush()
        deadline = time.monotonic() + 30
        while len(agent.spool) and time.monotonic() < deadline:
            got = agent.sender.send_one()
            if got and got[1]:
                time.sleep(min(got[1], 0.3))
        assert proxy.dropped == 3, "the proxy threw away three acknowledgements"
        assert len(agent.spool) == 0
        dup = agent.metrics.registry.get_sample_value("gpufleet_agent_batches_duplicate_total")
        assert dup == 3, "each retried batch was recognised by its idempotency key"
        rows, distinct = stored(database_url)
        _report("lost-acks", _produced(agent), rows, distinct)
        assert rows == _produced(agent) == 48
        assert distinct == rows
    finally:
        proxy.close()


def test_agent_killed_and_restarted_with_spool(database_url, collector_process, tmp_path):
    coll = collector_process(database_url)  # down at first, so the first agent fills its spool
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    first = subprocess.Popen(
        [PY, "-m", "gpufleet.cli", "agent", "--simulate", "1", "--gpus-per-node", "4", "--collector", coll.url,
         "--spool-dir", str(spool), "--interval", "0.05", "--flush", "0.25", "--attributors", "none"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent1.log", "wb"))  # noqa: SIM115
    try:
        _wait_until(lambda: len(list((spool / "queue").glob("*.batch"))) >= 3 if (spool / "queue").exists()
                    else False)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    # What the killed agent produced is what it persisted: spooled batches + the open journal.
    left = Spool(spool, 2**30, fsync=False)
    journal = Journal(left.journal_path).recover()
    produced_first = left.pending_rows + (journal.n_rows if journal else 0)
    assert left.pending_batches >= 3

    coll.start()
    agent = _agent(coll.url, spool, node="sim-node-000")
    with AgentThread(agent) as at:
        _wait_until(lambda: len(agent.spool) == 0 and _produced(agent) >= 40)
        at.stop()
    rows, distinct = stored(database_url)
    _report("agent-sigkill-restart", produced_first + _produced(agent), rows, distinct)
    assert rows == produced_first + _produced(agent)
    assert distinct == rows


def _disk_keys(spool: Path) -> set[tuple[str, float]]:
    """(gpu, ts) of every row an agent left on disk: spooled batches and the open journal."""
    import zstandard

    from gpufleet.protocol import decode

    keys: set[tuple[str, float]] = set()
    s = Spool(spool, 2**30, fsync=False)
    for it in s._items:
        header, body = it.read()
        raw = zstandard.ZstdDecompressor().decompress(body)
        b = decode(raw, header["headers"]["Content-Type"])
        keys.update(zip(b.samples["gpu"], b.samples["ts"], strict=True))
    ob = Journal(s.journal_path).recover()
    if ob is not None:
        keys.update((r.gpu, ts) for ts, r in ob.rows)
    return keys


def _db_keys(database_url: str) -> set[tuple[str, float]]:
    import sqlalchemy as sa

    eng = sa.create_engine(database_url)
    try:
        with eng.connect() as c:
            return set(uuid_keys(c))
    finally:
        eng.dispose()


def test_agent_killed_while_sending(database_url, collector_process, tmp_path):
    """SIGKILL the agent while the collector is up: a batch stored but not yet removed from
    the spool is sent again by the next agent and must count once."""
    coll = collector_process(database_url).start()
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    first = subprocess.Popen(
        [PY, "-m", "gpufleet.cli", "agent", "--simulate", "1", "--gpus-per-node", "4", "--collector", coll.url,
         "--spool-dir", str(spool), "--interval", "0.02", "--flush", "0.1", "--attributors", "none"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent1.log", "wb"))  # noqa: SIM115
    try:
        _wait_until(lambda: stored(database_url)[0] >= 200)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    produced_first = _db_keys(database_url) | _disk_keys(spool)
    agent = _agent(coll.url, spool, node="sim-node-000")
    with AgentThread(agent) as at:
        _wait_until(lambda: len(agent.spool) == 0 and _produced(agent) >= 20)
        at.stop()
    rows, distinct = stored(database_url)
    _report("agent-sigkill-while-sending", len(produced_first) + _produced(agent), rows, distinct)
    assert distinct == rows, "no row stored twice"
    assert rows == len(produced_first) + _produced(agent), "nothing the killed agent had persisted was lost"
    assert produced_first <= _db_keys(database_url)
