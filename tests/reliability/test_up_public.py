"""Issue 18 item 4: `gpufleet up --host 0.0.0.0` stores data. Anonymous access is off there (as
it must be), so the embedded agents use a token `up` mints for them; a browser still needs to
sign in. A real subprocess, real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from gpufleet.storage.raw_read import count_raw_samples

from ..agent.conftest import free_port

pytestmark = pytest.mark.slow


def _rows(db: Path) -> int:
    if not db.exists():
        return 0
    e = sa.create_engine(f"sqlite:///{db}")
    try:
        with e.connect() as c:
            return int(count_raw_samples(c))
    except sa.exc.OperationalError:  # schema not there yet
        return 0
    finally:
        e.dispose()


def _up(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    return subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "up", "--host", "0.0.0.0", "--port", str(port), "--data-dir",
         str(tmp_path), "--simulate", "2", "--gpus-per-node", "2", "--flush-s", "1", "--history-minutes", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)


def test_up_on_all_interfaces_stores_what_its_agents_sample(tmp_path: Path) -> None:
    port = free_port()
    proc = _up(tmp_path, port)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and _rows(tmp_path / "gpufleet.db") == 0:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.5)
        assert _rows(tmp_path / "gpufleet.db") > 0, "the embedded agents' samples were stored"
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/fleet/summary", timeout=5)
        assert r.status_code == 401, "anonymous access stays off on 0.0.0.0"
        assert httpx.get(f"http://127.0.0.1:{port}/signin", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
    # a second start mints a new token and revokes the first: only the live process knows it
    proc = _up(tmp_path, port)
    try:
        before = _rows(tmp_path / "gpufleet.db")
        deadline = time.time() + 90
        while time.time() < deadline and _rows(tmp_path / "gpufleet.db") <= before:
            time.sleep(0.5)
        assert _rows(tmp_path / "gpufleet.db") > before
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
    e = sa.create_engine(f"sqlite:///{tmp_path / 'gpufleet.db'}")
    with e.connect() as c:
        live = c.execute(sa.text("select count(*) from api_tokens where name like 'gpufleet-up-agents-%' "
                                 "and revoked_at is null")).scalar_one()
    e.dispose()
    assert live == 1
