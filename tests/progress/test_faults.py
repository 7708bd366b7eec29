"""The agent's no-loss guarantee extended to progress: the collector (a real ``gpufleet serve``
process) is SIGKILLed twice while windows stream through the agent; afterwards every step the
client delivered to the relay is stored exactly once, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from gpufleet.progress import Reporter
from tests.agent.conftest import CollectorProcess

from .harness import NodeAgent, wait_until


def _stored(url: str) -> tuple[int, int, int]:
    """(sum of steps, window rows, distinct (pid, rank, start) windows)."""
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            steps = c.execute(sa.text("select coalesce(sum(steps), 0) from job_progress")).scalar_one()
            rows = c.execute(sa.text("select count(*) from job_progress")).scalar_one()
            d = c.execute(sa.text("select count(*) from (select distinct pid, rank, start_ts from job_progress) x")
                          ).scalar_one()
    finally:
        eng.dispose()
    return int(steps), int(rows), int(d)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the waits' bounds only catch a hang
def test_collector_killed_while_progress_streams(database_url: str, tmp_path: Path) -> None:
    coll = CollectorProcess(database_url, tmp_path).start()
    node = NodeAgent(coll.url, tmp_path)
    total = 0
    try:
        reporters = [Reporter(node.socket) for _ in range(2)]
        for rank, r in enumerate(reporters):
            r.init(job_id="faulty", rank=rank)
        stop = threading.Event()

        def train() -> None:
            nonlocal total
            i = 0
            while not stop.is_set():
                i += 1
                for r in reporters:
                    r.step(i, tokens=1)
                time.sleep(0.004)
            total = i

        t = threading.Thread(target=train)
        t.start()
        for _ in range(2):
            wait_until(lambda: _stored(database_url)[0] > 0, 300, "windows stored")
            time.sleep(1.0)
            coll.kill()
            time.sleep(1.5)
            coll.start()
        time.sleep(2.0)
        stop.set()
        t.join()
        for r in reporters:
            r.shutdown()
        wait_until(lambda: _stored(database_url)[0] >= 2 * total, 300, f"all {2 * total} steps stored")
        time.sleep(2.0)
        delivered = node.relay.events  # step events plus each reporter's exit
    finally:
        node.close()
        coll.stop()
    steps, rows, distinct = _stored(database_url)
    assert sum(r.dropped for r in reporters) == 0 and delivered >= 2 * total
    assert steps == 2 * total  # none lost, none twice
    assert rows == distinct
