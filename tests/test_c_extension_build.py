"""setup.py's two C passes (the remote-write decoder, the export encoder): optional for a pip
install, where a box without a compiler warns and runs the Python paths; required where
GPUFLEET_REQUIRE_C_EXTENSIONS=1, as the Docker image's build stage sets it, so an image cannot
ship the slow paths unnoticed. ``CC=false`` stands in for a missing compiler: every compile
fails the way a box without gcc fails it (setuptools' CompileError)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _build_ext(tmp_path: Path, *, require: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_REQUIRE_C_EXTENSIONS"}
    env.update(CC="false", LDSHARED="false")
    if require is not None:
        env["GPUFLEET_REQUIRE_C_EXTENSIONS"] = require
    return subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--force", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_missing_compiler_only_warns_by_default(tmp_path: Path) -> None:
    r = _build_ext(tmp_path, require=None)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "_decode_c" in out and "_encode_c" in out  # setuptools names each extension it skipped
    assert not list((tmp_path / "lib").rglob("*.so"))


@pytest.mark.parametrize("value", ["1", "true"])
def test_a_missing_compiler_fails_the_build_when_required(tmp_path: Path, value: str) -> None:
    r = _build_ext(tmp_path, require=value)
    assert r.returncode != 0
    assert "_encode_c" in r.stdout + r.stderr or "_decode_c" in r.stdout + r.stderr


def test_the_docker_build_requires_them() -> None:
    """No container engine runs here, so the image is not built in the suite: its Dockerfile is
    checked for the three things that make the image carry the C passes."""
    text = (REPO / "Dockerfile").read_text()
    build, _, runtime = text.partition("\nFROM python:3.11-slim\n")
    assert "gcc" in build and "libc6-dev" in build  # a compiler in the build stage only
    assert "gcc" not in runtime
    assert "ENV GPUFLEET_REQUIRE_C_EXTENSIONS=1" in build
    assert "from gpufleet.collector.remote_write import _decode_c" in runtime  # the installed wheel has them
