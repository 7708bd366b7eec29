"""`gpufleet analyze` over a database; `gpufleet worker/beat --help` parse."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from gpufleet.agent.simulator import make_job
from gpufleet.cli import main
from gpufleet.storage.db import make_engine

from .conftest import T0, ingest


def test_analyze_command(sqlite_url: str, capsys: Any) -> None:
    e = make_engine(sqlite_url)
    ingest(e, make_job("no_tensor_cores", "c-1", 2, T0, 3600, node_prefix="c"), T0, T0 + 40 * 60)
    e.dispose()
    assert main(["analyze", "--database-url", sqlite_url, "--now", str(T0 + 40 * 60)]) == 0
    out = capsys.readouterr().out
    assert "analyzed 1/1 jobs" in out
    assert main(["analyze", "--database-url", sqlite_url, "--job", "c-1", "--json", "--now", str(T0 + 2400)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["reports_written"] == 0  # idempotent
    (job,) = doc["jobs"]
    assert [f["kind"] for f in job["flags"]] == ["no_tensor_cores"]
    assert "autocast" in job["flags"][0]["suggestion"]
    assert job["report"]["mfu"]["basis"] == "tensor_active x peak dense bf16 (estimate)"
    assert main(["analyze", "--database-url", sqlite_url, "--job", "nope"]) == 1


def test_worker_and_beat_parse() -> None:
    for cmd in ("worker", "beat"):
        r = subprocess.run([sys.executable, "-m", "gpufleet.cli", cmd, "--help"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and "--redis-url" in r.stdout
