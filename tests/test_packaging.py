"""The wheel users install: it holds every file of the package folders (the dashboard's JS, CSS
and SVG, TOML, migrations), and `pip install 'gpufleet[agent]'` from it gives a working agent
without the server's packages. scripts/smoke_wheel.sh (run by scripts/test.sh) goes on to
install `[server]` and run the README's production section on it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVER_PACKAGES = ["fastapi", "sqlalchemy", "celery", "alembic", "numpy", "pydantic"]
PIP_ENV = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _smoke() -> ModuleType:
    """scripts/smoke_wheel.py: the one home of what the wheel must hold."""
    spec = importlib.util.spec_from_file_location("smoke_wheel", REPO / "scripts" / "smoke_wheel.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, the tree copy it was built from), built as the README says: pip wheel --no-deps."""
    # Build from a copy: an in-place build would race with other test processes.
    src = tmp_path_factory.mktemp("src") / "gpufleet"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info",
                                                             "artifacts", "gpufleet-data", "__pycache__", ".*_cache",
                                                             ".hypothesis", "node_modules"))
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600, env=PIP_ENV)
    if r.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{r.stdout}\n{r.stderr}")
    return next(out.glob("gpufleet-*.whl")), src


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory: pytest.TempPathFactory, built: tuple[Path, Path]) -> Path:
    d = tmp_path_factory.mktemp("agent-venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(d)
    py = d / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", f"gpufleet[agent] @ file://{built[0]}"],
                       capture_output=True, text=True, timeout=600, env=PIP_ENV)
    if r.returncode != 0:
        pytest.fail(f"pip install 'gpufleet[agent]' from the wheel failed:\n{r.stdout}\n{r.stderr}")
    return d


def test_wheel_holds_every_file_of_the_package_folders(built: tuple[Path, Path]) -> None:
    """The server's parts too: the dashboard's static files once were missing (api/static/ is no
    package), and `serve` answered 500 on /static/app.css."""
    wheel, src = built
    names = zipfile.ZipFile(wheel).namelist()
    assert _smoke().check_wheel(names, src) == []
    for asset in ("gpufleet/api/static/app.css", "gpufleet/api/static/app.js", "gpufleet/api/static/favicon.svg",
                  "gpufleet/api/static/auth/signin.js", "gpufleet/catalog.toml", "gpufleet/migrations/script.py.mako",
                  "gpufleet/migrations/versions/0001_initial.py", "gpufleet/dashboards/gpufleet-fleet.json"):
        assert asset in names, asset


def test_server_extra_has_what_worker_and_beat_import() -> None:
    """`gpufleet worker`/`beat` after pip install 'gpufleet[server]': celery imports packaging, and
    kombu's Redis transport comes with celery[redis]."""
    import tomllib

    server = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["server"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in server}
    assert {"celery[redis]", "packaging", "redis"} <= names, names


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


