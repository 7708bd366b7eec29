"""What Grafana does to a PostgreSQL panel query before it reaches the database, in Python.

Grafana itself cannot be installed here, so the tests reproduce its three steps:
1. the frontend replaces template variables (``$var``, ``${var}``, ``[[var]]``): a multi-value or
   include-All variable becomes a comma list of single-quoted values, a single-value one its
   value with quotes doubled and no quotes around it; "All" means every option's value;
2. the backend replaces ``$__interval``, ``$__interval_ms``, ``$__unixEpochFrom()`` and
   ``$__unixEpochTo()``;
3. the PostgreSQL macro engine rewrites every ``$__name(args)`` (the regex, argument split and
   expansions follow grafana/pkg/tsdb/grafana-postgresql-datasource/macros.go); an unknown
   macro is an error there, and here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_INTERVAL_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)$")
_MACRO_RE = re.compile(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)")
_VAR_RE = re.compile(r"\$(\w+)|\[\[(\w+?)\]\]|\$\{(\w+)\}")
# Steps Grafana rounds a computed interval to (a subset of its roundInterval table).
_STEPS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


class MacroError(ValueError):
    pass


def parse_interval(text: str) -> float:
    m = _INTERVAL_RE.match(text.strip().strip("'"))
    if not m:
        raise MacroError(f"error parsing interval {text}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def format_interval(seconds: float) -> str:
    for unit in ("d", "h", "m", "s"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{int(seconds * 1000)}ms"


def auto_interval(start: datetime, end: datetime, max_points: int = 1000, min_interval: float = 60) -> float:
    """Roughly what Grafana computes for ``$__interval`` from the range and the panel width,
    never below the panel's min interval (the dashboards set 1m: the rollups' resolution)."""
    raw = max((end - start).total_seconds() / max_points, min_interval)
    return next((s for s in _STEPS if s >= raw), _STEPS[-1])


def _rfc3339(t: datetime) -> str:
    s = t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return s + "Z"


def _num(x: float) -> str:
    # Go's %v of a float64: integers print without a decimal point.
    return str(int(x)) if float(x).is_integer() else repr(x)


@dataclass(frozen=True)
class TimeRange:
    start: datetime
    end: datetime

    @property
    def from_s(self) -> int:
        return math.floor(self.start.timestamp())

    @property
    def to_s(self) -> int:
        return math.floor(self.end.timestamp())


def quote_literal(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def interpolate_variables(sql: str, values: Mapping[str, Sequence[str]], multi: Mapping[str, bool]) -> str:
    """Step 1. ``values[name]`` holds the selected values (all options when "All" is selected);
    ``multi[name]`` is True for multi-value or include-All variables."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            return m.group(0)  # not a template variable (e.g. $__unixEpochFrom): left for the backend
        vals = list(values[name])
        if multi.get(name):
            return ",".join(quote_literal(v) for v in vals)
        if len(vals) != 1:
            raise MacroError(f"single-value variable {name} has {len(vals)} values")
        return str(vals[0]).replace("'", "''")

    return _VAR_RE.sub(repl, sql)


def interpolate_backend(sql: str, rng: TimeRange, interval_s: float) -> str:
    """Step 2 (sqleng.Interpolate)."""
    sql = sql.replace("$__interval_ms", str(int(interval_s * 1000)))
    sql = sql.replace("$__interval", format_interval(interval_s))
    sql = sql.replace("$__unixEpochFrom()", str(rng.from_s))
    return sql.replace("$__unixEpochTo()", str(rng.to_s))


def _group(col: str, args: list[str], name: str, epoch: bool) -> str:
    if len(args) < 2:
        raise MacroError(f"macro {name} needs time column and interval and optional fill value")
    secs = _num(parse_interval(args[1]))
    if len(args) == 3 and not (args[2] in ("NULL", "previous") or _is_number(args[2])):
        raise MacroError(f"invalid fill value {args[2]}")
    return f"floor(({col})/{secs})*{secs}" if epoch else f"floor(extract(epoch from {col})/{secs})*{secs}"


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _evaluate(name: str, args: list[str], rng: TimeRange) -> str:
    frm, to = rng.start, rng.end
    need_col = {"__time", "__timeEpoch", "__timeFilter", "__unixEpochFilter", "__unixEpochNanoFilter"}
    if name in need_col and (not args or not args[0]):
        raise MacroError(f"missing time column argument for macro {name}")
    if name == "__time":
        return f'{args[0]} AS "time"'
    if name == "__timeEpoch":
        return f'extract(epoch from {args[0]}) as "time"'
    if name == "__timeFilter":
        return f"{args[0]} BETWEEN '{_rfc3339(frm)}' AND '{_rfc3339(to)}'"
    if name == "__timeFrom":
        return f"'{_rfc3339(frm)}'"
    if name == "__timeTo":
        return f"'{_rfc3339(to)}'"
    if name == "__timeGroup":
        return _group(args[0], args, name, epoch=False)
    if name == "__timeGroupAlias":
        return _group(args[0], args, name, epoch=False) + ' AS "time"'
    if name == "__unixEpochFilter":
        return f"{args[0]} >= {rng.from_s} AND {args[0]} <= {rng.to_s}"
    if name == "__unixEpochNanoFilter":
        return f"{args[0]} >= {rng.from_s * 10**9} AND {args[0]} <= {rng.to_s * 10**9}"
    if name == "__unixEpochNanoFrom":
        return str(rng.from_s * 10**9)
    if name == "__unixEpochNanoTo":
        return str(rng.to_s * 10**9)
    if name == "__unixEpochGroup":
        return _group(args[0], args, name, epoch=True)
    if name == "__unixEpochGroupAlias":
        return _group(args[0], args, name, epoch=True) + ' AS "time"'
    raise MacroError(f'unknown macro "{name}"')


def expand_macros(sql: str, rng: TimeRange) -> str:
    """Step 3 (postgresMacroEngine.Interpolate)."""
    original = sql

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        # pre-5.3 compatibility: "$__timeGroup(...)," means $__timeGroupAlias
        if name == "__timeGroup":
            i = original.find(m.group(0))
            if i >= 0 and original[i + len(m.group(0)):i + len(m.group(0)) + 1] == ",":
                name = "__timeGroupAlias"
        args = [a.strip(" ") for a in m.group(2).split(",")]
        return _evaluate(name, args, rng)

    return _MACRO_RE.sub(repl, sql)


def render(sql: str, rng: TimeRange, interval_s: float, values: Mapping[str, Sequence[str]],
           multi: Mapping[str, bool]) -> str:
    """All three steps, in Grafana's order."""
    sql = interpolate_variables(sql, {**values, "__interval": [format_interval(interval_s)],
                                      "__interval_ms": [str(int(interval_s * 1000))]}, multi)
    return expand_macros(interpolate_backend(sql, rng, interval_s), rng)
