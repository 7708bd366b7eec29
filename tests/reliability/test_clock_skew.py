"""Clock skew between a node and the collector, over real HTTP with `gpufleet serve`: a clock
within the collector's tolerance (GPUFLEET_INGEST_MAX_FUTURE_S, 300 s) loses nothing; a clock
far ahead has its batches refused for good (422), dead-lettered on the node with the reason,
and nothing of them stored: produced == stored + dead-lettered rows, nothing silently lost."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.simulator import SimulatedFleet

from ..agent.conftest import AgentThread, TickClock, stored

pytestmark = pytest.mark.slow
NODE = "sim-node-000"


def _run(url: str, spool: Path, skew_s: float, seconds: float = 2.0) -> Agent:
    fleet = SimulatedFleet(nodes=1, gpus_per_node=4, start_ts=time.time() - 7200)
    cfg = AgentConfig(collector_url=url, node=NODE, spool_dir=spool, interval_s=0.05, flush_s=0.25,
                      backoff_base_s=0.05, backoff_max_s=0.3, timeout_s=5.0)
    # 0.01 s of sample time per cycle: the batches stay near "now + skew" however long the run
    agent = Agent(cfg, fleet.source(NODE), clock=TickClock(start=time.time() + skew_s, step=0.01))
    with AgentThread(agent) as at:
        time.sleep(seconds)
        at.stop()
    return agent


def _dead_rows(spool: Path) -> int:
    reasons = spool / "dead" / "reasons.jsonl"
    if not reasons.exists():
        return 0
    return sum(json.loads(line)["rows"] for line in reasons.read_text().splitlines())


@pytest.mark.parametrize("skew_s", [120.0, 900.0])
def test_clock_skew(database_url, collector_process, tmp_path, skew_s: float):  # type: ignore[no-untyped-def]
    coll = collector_process(database_url).start()
    agent = _run(coll.url, tmp_path / "spool", skew_s)
    produced = int(agent.metrics.registry.get_sample_value("gpufleet_agent_samples_total") or 0)
    rows, distinct = stored(database_url)
    dead = _dead_rows(tmp_path / "spool")
    left = agent.spool.pending_rows
    print(f"FAULT clock-skew-{skew_s:+.0f}s: produced={produced} stored={rows} dead_lettered={dead} left={left} "
          f"duplicated={rows - distinct}")
    assert produced > 0 and distinct == rows
    assert rows + dead + left == produced, "every row is stored, dead-lettered with a reason, or still spooled"
    if skew_s < 300:
        assert dead == 0 and rows + left == produced
    else:
        assert rows == 0 and dead > 0
        reasons = (tmp_path / "spool" / "dead" / "reasons.jsonl").read_text()
        assert "future" in reasons and "clock" in reasons, "the reason tells the operator what to fix"
