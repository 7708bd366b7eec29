"""A gpufleet for the progress must-shows: the real app under uvicorn (live_server), one agent
thread with its relay on a Unix socket, pushing over real HTTP; and the ground truth a
training script writes about itself (examples/progress/train_cpu.py --truth)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.progress_relay import ProgressRelay
from gpufleet.agent.runner import Agent, AgentConfig
from gpufleet.agent.simulator import SimulatedFleet

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "progress" / "train_cpu.py"
PY = sys.executable


class NodeAgent:
    """One agent (a simulated node, so it has something to sample) with a progress relay."""

    def __init__(self, collector_url: str, tmp: Path, expire_s: float = 2.0) -> None:
        fleet = SimulatedFleet(nodes=1, gpus_per_node=1, start_ts=time.time() - 600)
        cfg = AgentConfig(collector_url=collector_url, node="torch-node", spool_dir=tmp / "spool", fsync=False,
                          interval_s=0.5, flush_s=1.0, backoff_max_s=0.5)
        self.agent = Agent(cfg, fleet.source(fleet.node_names()[0]))
        d = Path("/tmp") / f"gpf-{uuid.uuid4().hex[:10]}"
        d.mkdir()
        self.socket = str(d / "progress.sock")
        self.relay = ProgressRelay(self.socket, expire_s=expire_s)
        self.agent.progress = self.relay
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.agent.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def env(self, job: str, **extra: str) -> dict[str, str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLEET_", "RANK", "WORLD_SIZE"))}
        return {**e, "GPUFLEET_PROGRESS": self.socket, "GPUFLEET_JOB_ID": job, "PYTHONPATH": str(REPO),
                "OMP_NUM_THREADS": "1", **extra}

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.relay.close()


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def read_truth(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # the line being written when the process was killed
    return out


def job(url: str, job_id: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/api/v1/jobs/{job_id}", timeout=30)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def stored_steps(url: str, job_id: str) -> int:
    r = httpx.get(f"{url}/api/v1/jobs/{job_id}/progress", timeout=30)
    if r.status_code == 404:
        return -1
    return sum(sum(rk["steps"]) for rk in r.json()["ranks"])
