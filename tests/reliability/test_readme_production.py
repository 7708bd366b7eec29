"""Issue 18 item 13: the README's production example works as written: a token created for
`--cluster prod --node gpu-a017` and an agent run with that `--cluster` and `--node` (simulated
here) store data; without `--cluster` the collector refuses it with 403, as the README warns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from gpufleet.storage.db import make_engine
from gpufleet.storage.raw_read import count_raw_samples
from gpufleet.storage.tokens import create_token

REPO = Path(__file__).resolve().parents[2]


def test_token_and_agent_flags_from_the_readme(sqlite_url: str, live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    readme = (REPO / "README.md").read_text()
    assert "gpufleet token create node-a017 --role agent --cluster prod --node gpu-a017" in readme
    assert '--token "$TOKEN" --cluster prod --node gpu-a017' in readme
    e = make_engine(sqlite_url)
    token = create_token(e, "node-a017", "agent", cluster="prod", node="gpu-a017")
    e.dispose()
    srv = live_server(sqlite_url, allow_anonymous=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}

    def agent(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpufleet.cli", "agent", "--collector", srv.url, "--token", token,
                               *extra, "--simulate", "1", "--gpus-per-node", "2", "--once",
                               "--spool-dir", str(tmp_path / "-".join(extra or ("none",)))],
                              capture_output=True, text=True, timeout=120, cwd=REPO, env=env)

    r = agent("--node", "gpu-a017")  # the old README: no --cluster
    assert "403" in r.stdout + r.stderr
    # Every batch refused: `--once` fails, so it serves as a node bring-up check (issue 37).
    assert r.returncode == 1 and "not stored" in r.stderr, r.stdout + r.stderr
    r = agent("--cluster", "prod", "--node", "gpu-a017")
    assert r.returncode == 0 and "sent 1 batch" in r.stdout, r.stdout + r.stderr
    eng = sa.create_engine(sqlite_url)
    with eng.connect() as c:
        assert count_raw_samples(c) == 2
    eng.dispose()
