"""How fast an agent catches up after a collector outage: build a backlog of spooled batches
(an 8-GPU simulated node, 10 cycles per batch, as during an outage), then time the sender
draining it over real HTTP to a stub collector running in another process.

    .venv/bin/python bench/agent/spool_replay.py            # 1 h outage: 360 batches
    .venv/bin/python bench/agent/spool_replay.py --quick    # 10 min: 60 batches

Reference: the node's own production rate (one batch per 10 s flush). The catch-up factor is
replay rate / production rate: how many seconds of outage one second of replay clears.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="60 batches instead of 360")
    ap.add_argument("--batches", type=int)
    args = ap.parse_args()
    n = args.batches or (60 if args.quick else 360)

    from gpufleet.agent.runner import Agent, AgentConfig
    from gpufleet.agent.simulator import SimulatedFleet

    stub = subprocess.Popen([sys.executable, str(HERE / "agent_overhead.py"), "--stub"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert stub.stdout is not None
        url = f"http://127.0.0.1:{stub.stdout.readline().strip()}"
        tmp = Path(tempfile.mkdtemp(prefix="gf-bench-replay-"))
        fleet = SimulatedFleet(nodes=1, gpus_per_node=8, start_ts=time.time() - 7200)
        t = [time.time() - n * 10 - 10]
        agent = Agent(AgentConfig(collector_url=url, node="bench", spool_dir=tmp), fleet.source("sim-node-000"),
                      clock=lambda: t[0])
        agent.start()
        b0 = time.perf_counter()
        for _ in range(n):
            for _ in range(10):
                t[0] += 1.0
                agent.cycle(t[0])
            agent.flush()
        build_s = time.perf_counter() - b0
        backlog = (len(agent.spool), agent.spool.pending_rows, agent.spool.pending_bytes)
        r0 = time.perf_counter()
        sent = agent.sender.drain(600)
        replay_s = time.perf_counter() - r0
        agent.sender.close()
    finally:
        stub.terminate()
        stub.wait(10)
    assert sent == n, f"sent {sent} of {n}"
    rate = sent / replay_s
    print(f"spool replay: backlog of {backlog[0]} batches, {backlog[1]} rows, {backlog[2] / 2**20:.2f} MiB "
          f"({n * 10 / 60:.0f} min of an 8-GPU node); built in {build_s:.2f} s")
    print(f"{'':<20} {'batches/s':>10} {'rows/s':>10}")
    print(f"{'replay (agent)':<20} {rate:>10.1f} {rate * 80:>10.0f}")
    print(f"{'production (node)':<20} {0.1:>10.1f} {8:>10.0f}")
    print(f"catch-up factor: {rate / 0.1:.0f}x (seconds of outage cleared per second of replay); "
          f"spool at 1 GiB holds ~{2**30 / (backlog[2] / n) * 10 / 86400:.0f} days of this node")
    return 0


if __name__ == "__main__":
    sys.exit(main())
