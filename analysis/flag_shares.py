"""Each progress flag's share of its job's ledger (pure): what ``flags.wasted_gpu_hours`` stores
for the ``progress`` scopes and what ``GET /api/v1/jobs/{id}/ledger`` reports per flag
(docs/goodput.md, "Progress flags' waste"). The hardware flags' shares are the fold's own
(``Ledger.flag_s``); this is the rule for the kinds that claim no GPU-windows (progress and
serving).

- A job-wide progress flag (scope ``progress``) gets its kind's categories (``[flags]`` in
  ``ledger_categories.toml``) less what the hardware flags hold of a category both views share
  (a hardware kind that is also a progress cause): the hardware flag already has those seconds.
- A category goes to one progress flag only: the first in ``[flags]`` order.
- A flag on one rank (``progress:rank<N>``: the slow-rank and step-time kinds) gets 0: those
  kinds have no category. A slow step is still a step, so the time a slow rank costs its
  peers is inside their steps, which the progress view counts productive; the ledger holds no
  second of it to give (the detector's estimate is not waste).
- A serving flag (scope ``serving:<deployment>`` or ``serving:<deployment>:<replica>``) gets its
  kind's categories (``[flags]``) in the ledger minutes of its episode [start_ts, end_ts): the
  replica's seconds the serving view gave that cause (docs/serving.md, "Ledger"). A second goes to
  one flag: the replica's before the deployment's. ``batch_too_small`` and ``engine_hw_disagree``
  have no category (a small batch still serves its requests; a disagreement is not time), so 0."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from .ledger import categories

PROGRESS_SCOPE = "progress"
SERVING_SCOPE = "serving"


def is_progress_scope(scope: str) -> bool:
    return scope == PROGRESS_SCOPE or scope.startswith(PROGRESS_SCOPE + ":")


def progress_flag_shares(totals_s: Mapping[str, float],
                         flags: Iterable[tuple[str, str, float]]) -> dict[tuple[str, str], float]:
    """(kind, scope) -> GPU-hours (rounded to 4 places, as stored) for each progress flag of a job.
    ``totals_s``: the job's stored ledger, category -> GPU-seconds; ``flags``: every flag of the
    job as (kind, scope, stored wasted_gpu_hours) (the hardware ones' stored shares are read)."""
    flags = list(flags)
    held: dict[str, float] = defaultdict(float)
    for kind, scope, wasted in flags:
        if not is_progress_scope(scope):
            held[kind] += float(wasted or 0.0)
    order = {k: i for i, k in enumerate(categories().flag_categories)}
    mine = sorted({(k, s) for k, s, _ in flags if is_progress_scope(s)},
                  key=lambda ks: (ks[1] != PROGRESS_SCOPE, order.get(ks[0], len(order)), ks))
    taken: set[str] = set()
    out: dict[tuple[str, str], float] = {}
    for kind, scope in mine:
        share = 0.0
        if scope == PROGRESS_SCOPE:
            for c in categories().flag_categories.get(kind, ()):
                if c in taken:
                    continue
                taken.add(c)
                share += max(0.0, totals_s.get(c, 0.0) / 3600.0 - held.get(c, 0.0))
        out[(kind, scope)] = round(share, 4)
    return out


def is_serving_scope(scope: str) -> bool:
    return scope == SERVING_SCOPE or scope.startswith(SERVING_SCOPE + ":")


def serving_flag_shares(minutes_s: Iterable[tuple[int, str, float]],
                        flags: Iterable[tuple[str, str, float, float]]) -> dict[tuple[str, str], float]:
    """(kind, scope) -> GPU-hours (rounded to 4 places, as stored) for each serving flag of a job.
    ``minutes_s``: the job's stored ledger rows (minute, category, GPU-seconds); ``flags``: its
    serving flags as (kind, scope, start_ts, end_ts) (other scopes are skipped)."""
    cats = categories().flag_categories
    rows: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for minute, cat, secs in minutes_s:
        rows[cat].append((int(minute), float(secs)))
    # The narrower scope first (serving:<deployment>:<replica> has two colons), then by name.
    mine = sorted({(k, s, float(a), float(b)) for k, s, a, b in flags if is_serving_scope(s)},
                  key=lambda f: (-f[1].count(":"), f))
    taken: dict[str, set[int]] = defaultdict(set)
    out: dict[tuple[str, str], float] = {}
    for kind, scope, t0, t1 in mine:
        share = 0.0
        for c in cats.get(kind, ()):
            for minute, secs in rows.get(c, ()):
                if t0 <= minute * 60 < t1 and minute not in taken[c]:
                    taken[c].add(minute)
                    share += secs
        out[(kind, scope)] = round(out.get((kind, scope), 0.0) + share / 3600.0, 4)
    return out


__all__ = ["PROGRESS_SCOPE", "SERVING_SCOPE", "is_progress_scope", "is_serving_scope", "progress_flag_shares",
           "serving_flag_shares"]
