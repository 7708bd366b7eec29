"""`gpufleet agent` as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import sqlalchemy as sa

from gpufleet.storage.raw_read import count_raw_samples

from .conftest import PY, REPO

ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}


def _agent(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "gpufleet.cli", "agent", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**ENV, **(env or {})})


def test_once_print_shows_a_table(tmp_path: Path) -> None:
    r = _agent("--simulate", "1", "--once", "--print", "--spool-dir", str(tmp_path / "spool"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("GPU-") == 8
    assert "sm_active (ratio)" in r.stdout and "job " in r.stdout
    assert not (tmp_path / "spool").exists(), "--print sends nothing and leaves no spool"


def test_once_print_json_from_env_twins(tmp_path: Path) -> None:
    r = _agent(env={"GPUFLEET_SIMULATE": "1", "GPUFLEET_GPUS_PER_NODE": "2", "GPUFLEET_SPOOL_DIR": str(tmp_path),
                    "GPUFLEET_ONCE": "1", "GPUFLEET_PRINT": "true", "GPUFLEET_JSON": "yes"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["node"] == "sim-node-000" and len(doc["gpus"]) == 2
    assert 0.0 <= doc["gpus"][0]["values"]["sm_active"] <= 1.0


def test_nvml_source_without_a_driver_says_what_to_do(tmp_path: Path) -> None:
    r = _agent("--source", "nvml", "--once", "--print", "--spool-dir", str(tmp_path))
    assert r.returncode == 2
    assert "--simulate" in r.stderr and "NVML" in r.stderr


def test_bad_setting_is_reported(tmp_path: Path) -> None:
    r = _agent("--simulate", "--interval", "5", "--flush", "1", "--spool-dir", str(tmp_path))
    assert r.returncode == 2 and "flush_s" in r.stderr


def test_once_sends_to_the_collector(tmp_path: Path, sqlite_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(sqlite_url)
    r = _agent("--simulate", "1", "--once", "--collector", srv.url, "--spool-dir", str(tmp_path / "spool"))
    assert r.returncode == 0, r.stderr
    assert "sent 1 batch" in r.stdout
    eng = sa.create_engine(sqlite_url)
    with eng.connect() as c:
        assert count_raw_samples(c) == 8
    eng.dispose()


def test_daemon_runs_several_simulated_nodes_and_stops_on_sigterm(tmp_path: Path) -> None:
    p = subprocess.Popen([PY, "-m", "gpufleet.cli", "agent", "--simulate", "2", "--collector", "http://127.0.0.1:9",
                          "--spool-dir", str(tmp_path), "--interval", "0.1", "--flush", "0.3"],
                         cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (time.monotonic() < deadline and not all(
                list((tmp_path / n / "queue").glob("*.batch")) for n in ("sim-node-000", "sim-node-001")
                if (tmp_path / n / "queue").exists())) or len(list(tmp_path.iterdir())) < 2:
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert sorted(d.name for d in tmp_path.iterdir()) == ["sim-node-000", "sim-node-001"]
    for n in ("sim-node-000", "sim-node-001"):
        assert list((tmp_path / n / "queue").glob("*.batch"))


def test_a_missing_module_names_the_right_fix() -> None:
    """On a bare GPU box, `python -m gpufleet.cli agent` run from the checkout's root found the
    checkout's gpufleet/ folder (the core, no agent/) and was told to install the server parts."""
    from gpufleet.cli import missing_module_hint

    own = missing_module_hint(ModuleNotFoundError("x", name="gpufleet.agent"), "agent")
    assert "working directory" in own and "server" not in own
    dep = missing_module_hint(ModuleNotFoundError("x", name="zstandard"), "agent")
    assert "gpufleet[agent]" in dep and "zstandard" in dep
    assert "gpufleet[server]" in missing_module_hint(ModuleNotFoundError("x", name="fastapi"), "serve")
