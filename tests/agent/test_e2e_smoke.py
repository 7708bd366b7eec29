"""The agent against the real collector and database (in-thread server): rows arrive once."""

from __future__ import annotations

import time

import sqlalchemy as sa
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.simulator import SimulatedFleet


def test_cycles_arrive_once(database_url, live_server, tmp_path):
    srv = live_server(database_url)
    fleet = SimulatedFleet(nodes=1, start_ts=time.time())
    node = fleet.node_names()[0]
    agent = Agent(AgentConfig(collector_url=srv.url, node=node, spool_dir=tmp_path / "spool"), fleet.source(node))
    t0 = time.time()
    for i in range(5):
        agent.cycle(t0 + i)
    agent.flush()
    while agent.sender.send_one() is not None:
        pass
    eng = sa.create_engine(database_url)
    with eng.connect() as c:
        n = c.execute(sa.text("select count(*) from gpu_samples")).scalar()
    assert n == 40
