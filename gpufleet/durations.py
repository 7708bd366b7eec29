"""One duration grammar for every part: ``90`` (seconds), ``250ms``, ``90s``, ``30m``, ``4h``,
``7d``, ``2w``. Alert rules, API windows and offsets (``-24h``) all read durations with it, so
``30m`` means the same everywhere. Core: imports nothing of the project.

Hand-written rather than a library (pytimeparse, isodate): the grammar is one regular expression,
and those accept forms (``1:30``, ``PT1H``, ``1.5 hours``) we would then have to document and
keep accepting in rule files and URLs."""

from __future__ import annotations

import re

UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(v: str | int | float) -> float:
    """Seconds; ValueError (saying what is accepted) for anything else, booleans included."""
    if isinstance(v, bool):
        raise ValueError(f"expected a duration like 30m, 4h or 7d, got {v!r}")
    if isinstance(v, int | float):
        if v < 0:
            raise ValueError(f"a duration must not be negative, got {v!r}")
        return float(v)
    m = _RE.match(str(v))
    if not m:
        raise ValueError(f"expected a duration like 30m, 4h or 7d, got {v!r}")
    return float(m.group(1)) * UNITS[m.group(2) or "s"]
