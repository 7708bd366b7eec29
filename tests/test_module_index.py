"""docs/architecture.md lists every module with its docstring's first sentence (scripts/module_index.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_module_list_is_current() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "module_index.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_module_says_its_job() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "(no docstring)" not in text
