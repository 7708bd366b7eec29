"""`pip install 'gpufleet[agent]'` gives a working agent without the server's packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVER_PACKAGES = ["fastapi", "sqlalchemy", "celery", "alembic", "numpy", "pydantic"]


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("agent-venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(d)
    py = d / "bin" / "python"
    # Build from a copy: an in-place build would race with other test processes.
    src = tmp_path_factory.mktemp("src") / "gpufleet"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "artifacts",
                                                             "gpufleet-data", "__pycache__", ".*_cache"))
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", f"{src}[agent]"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if r.returncode != 0:
        pytest.fail(f"pip install '.[agent]' failed:\n{r.stdout}\n{r.stderr}")
    return d


def test_agent_extra_pulls_no_server_packages(agent_venv: Path) -> None:
    py = agent_venv / "bin" / "python"
    for pkg in SERVER_PACKAGES:
        r = subprocess.run([str(py), "-c", f"import {pkg}"], capture_output=True, text=True)
        assert r.returncode != 0, f"{pkg} is importable in an agent-only install"
    r = subprocess.run([str(py), "-c", "import pynvml, httpx, msgspec, zstandard"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_test_scaffolding_is_not_in_the_wheel(agent_venv: Path) -> None:
    """The fake NVML and the crash-injecting worker live under tests/, which the wheel leaves out."""
    pkg = next((agent_venv / "lib").glob("python3*/site-packages/gpufleet"))
    shipped = [str(p.relative_to(pkg)) for p in pkg.rglob("*.py")]
    assert len(shipped) > 20  # the package is there: the check below is not vacuous
    scaffolding = [s for s in shipped if "fake_nvml" in s or "crash_worker" in s or s.startswith(("tests/",
                                                                                                   "agent/testing"))]
    assert not scaffolding, scaffolding


def test_agent_runs_simulated_once(agent_venv: Path, tmp_path: Path) -> None:
    exe = agent_venv / "bin" / "gpufleet"
    r = subprocess.run(
        [str(exe), "agent", "--simulate", "1", "--once", "--print", "--spool-dir", str(tmp_path / "spool")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")},
    )
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    # One row per simulated GPU with its SM activity printed.
    assert "sm_active" in r.stdout
    assert r.stdout.count("GPU-") >= 8, r.stdout


def test_server_command_explains_missing_extra(agent_venv: Path, tmp_path: Path) -> None:
    exe = agent_venv / "bin" / "gpufleet"
    r = subprocess.run([str(exe), "migrate", "--data-dir", str(tmp_path)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 2
    assert "gpufleet[server]" in r.stderr


