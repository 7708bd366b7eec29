"""Issue 18 item 11: `gpufleet agent --simulate` takes its node name(s) from --node, so two
simulated agents (each with its own --node) report different nodes and GPUs instead of clashing
with 409 forever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from gpufleet.storage.raw_read import count_raw_samples

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "GPUFLEET_TEST": "1"}


def _agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpufleet.cli", "agent", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=ENV)


def test_simulate_uses_node_name(tmp_path: Path) -> None:
    r = _agent("--simulate", "1", "--node", "gpu-a017", "--gpus-per-node", "2", "--once", "--print", "--json",
               "--spool-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["node"] == "gpu-a017"
    r = _agent("--simulate", "2", "--node", "rack7", "--gpus-per-node", "1", "--once", "--print", "--json",
               "--spool-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert [d["node"] for d in json.loads(r.stdout)] == ["rack7-000", "rack7-001"]


def test_without_node_the_simulator_keeps_its_names(tmp_path: Path) -> None:
    env_node = {k: v for k, v in ENV.items() if k != "GPUFLEET_NODE"}
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "agent", "--simulate", "1", "--gpus-per-node", "1",
                        "--once", "--print", "--json", "--spool-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=env_node)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["node"] == "sim-node-000"


def test_two_simulated_agents_both_store(tmp_path: Path, sqlite_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(sqlite_url)
    for node in ("gpu-a017", "gpu-a018"):
        r = _agent("--simulate", "1", "--node", node, "--gpus-per-node", "2", "--once", "--collector", srv.url,
                   "--spool-dir", str(tmp_path / node))
        assert r.returncode == 0, r.stderr
        assert "sent 1 batch" in r.stdout, r.stdout + r.stderr
    eng = sa.create_engine(sqlite_url)
    with eng.connect() as c:
        nodes = c.execute(sa.text("select distinct n.name from gpus g join nodes n on n.id = g.node_id "
                                  "order by n.name")).scalars().all()
        rows = count_raw_samples(c)
    eng.dispose()
    assert list(nodes) == ["gpu-a017", "gpu-a018"]
    assert rows == 4
