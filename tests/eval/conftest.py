"""The scenario library lives in bench/realworld (a benchmark, not an installed package):
put bench/ on sys.path so tests import it as ``realworld``."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
