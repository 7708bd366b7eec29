"""Scoring, pure: what the engine raised per job against the job's labels.

Per kind K: recall = demanded jobs that got K / jobs demanding K, where a job demands K when K
is required, or when K heads an ``any_of`` group (the group is met by any member);
precision = jobs raising K where K was required, in a met group or allowed / jobs raising K.
A "healthy" job (nothing required) is flagged when it raised anything not allowed.
Accounting checks: per-flag and total waste <= allocated GPU-hours, the score within 0..1.
Confidence checks: jobs whose labels say "judged from fallbacks" must not get confidence high."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .model import KINDS, Expect

EPS = 1e-6


@dataclass
class Outcome:
    scenario: str
    seed: int
    interval: int
    job_id: str
    expect: Expect
    why: str
    flags: list[dict[str, Any]] = field(default_factory=list)
    report: dict[str, Any] | None = None

    @property
    def raised(self) -> frozenset[str]:
        return frozenset(str(f["kind"]) for f in self.flags)


@dataclass
class KindScore:
    demanded: int = 0
    hit: int = 0
    raised: int = 0
    correct: int = 0

    @property
    def recall(self) -> float | None:
        return self.hit / self.demanded if self.demanded else None

    @property
    def precision(self) -> float | None:
        return self.correct / self.raised if self.raised else None


@dataclass
class Problem:
    scenario: str
    seed: int
    interval: int
    job_id: str
    what: str  # "missed K", "false K", "accounting", "confidence", "deadline"
    detail: str
    why: str


@dataclass
class Score:
    kinds: dict[str, KindScore]
    healthy_jobs: int
    healthy_flagged: int
    jobs: int
    problems: list[Problem]
    accounting_checked: int
    accounting_bad: int
    confidence_checked: int
    confidence_bad: int
    confidence_unreported: int
    healthy_with_allowed: int = 0  # healthy jobs that raised only allowed kinds (shown, not counted)
    fleet_allocated_gpu_hours: float = 0.0
    fleet_wasted_gpu_hours: float = 0.0
    coverage_notes_checked: int = 0  # fallback-judged jobs whose report must say what it judged from
    coverage_notes_missing: int = 0


def confidence_of(flag: dict[str, Any]) -> str | None:
    c = flag.get("confidence")
    if c is None and isinstance(flag.get("evidence"), dict):
        c = flag["evidence"].get("confidence")
    return None if c is None else str(c)


def _evidence_brief(flag: dict[str, Any]) -> str:
    raw = flag.get("evidence")
    ev: dict[str, Any] = raw if isinstance(raw, dict) else {}
    keys = [k for k in ev if k not in ("episodes",)][:6]
    parts = []
    for k in keys:
        v = ev[k]
        if isinstance(v, float):
            v = round(v, 3)
        if isinstance(v, (dict, list)):
            continue
        parts.append(f"{k}={v}")
    return f"[{flag.get('severity')}] " + ", ".join(parts)


def accounting_problems(o: Outcome) -> list[str]:
    rep = o.report
    if rep is None:
        return []
    out = []
    raw = rep.get("report")
    body: dict[str, Any] = raw if isinstance(raw, dict) else {}
    alloc = rep.get("allocated_gpu_hours")
    if alloc is None:
        alloc = body.get("allocated_gpu_hours")
    waste = rep.get("wasted_gpu_hours")
    if waste is None:
        waste = body.get("wasted_gpu_hours_total")
    if alloc is not None and waste is not None and float(waste) > float(alloc) + EPS:
        out.append(f"waste {float(waste):.3f} > allocated {float(alloc):.3f} GPU-h")
    if alloc is not None:
        for f in o.flags:
            w = f.get("wasted_gpu_hours")
            if w is not None and float(w) > float(alloc) + EPS:
                out.append(f"{f['kind']} claims {float(w):.3f} > allocated {float(alloc):.3f} GPU-h")
    s = rep.get("goodput_score")
    if s is None:
        s = body.get("goodput_score")
    if s is not None and not (0.0 - EPS <= float(s) <= 1.0 + EPS):
        out.append(f"goodput_score {float(s)} outside 0..1")
    return out


def score(outcomes: list[Outcome]) -> Score:
    kinds: dict[str, KindScore] = {k: KindScore() for k in KINDS}
    problems: list[Problem] = []
    healthy = flagged = 0
    acc_checked = acc_bad = conf_checked = conf_bad = conf_unrep = with_allowed = notes_checked = notes_bad = 0
    fleet_alloc = fleet_waste = 0.0
    for o in outcomes:
        e, raised = o.expect, o.raised

        def problem(what: str, detail: str, o: Outcome = o) -> None:
            problems.append(Problem(o.scenario, o.seed, o.interval, o.job_id, what, detail, o.why))

        for k in e.required:
            ks = kinds.setdefault(k, KindScore())
            ks.demanded += 1
            if k in raised:
                ks.hit += 1
            else:
                problem(f"missed {k}", "required, not raised", o)
        for g in e.any_of:
            head = g[0]
            ks = kinds.setdefault(head, KindScore())
            ks.demanded += 1
            if raised & set(g):
                ks.hit += 1
            else:
                problem(f"missed {head}", f"none of {sorted(g)} raised", o)
        ok = e.ok_kinds()
        for k in raised:
            ks = kinds.setdefault(k, KindScore())
            ks.raised += 1
            if k in ok:
                ks.correct += 1
            else:
                f = next(f for f in o.flags if f["kind"] == k)
                problem(f"false {k}", _evidence_brief(f), o)
        if e.healthy:
            healthy += 1
            if raised - ok:
                flagged += 1
            elif raised:
                with_allowed += 1
        if o.report is not None:
            fleet_alloc += float(o.report.get("allocated_gpu_hours") or 0.0)
            fleet_waste += float(o.report.get("wasted_gpu_hours") or 0.0)
            acc_checked += 1
            bad = accounting_problems(o)
            if bad:
                acc_bad += 1
                problem("accounting", "; ".join(bad), o)
        if e.low_confidence and o.report is not None:
            # issue 13: the report says what it judged from ("... judged from gpu_util ...")
            raw = o.report.get("report")
            body: dict[str, Any] = raw if isinstance(raw, dict) else {}
            notes = [str(n) for n in body.get("notes") or []]
            notes_checked += 1
            if not any("gpu_util" in n for n in notes):
                notes_bad += 1
                problem("coverage note", f"no report note says it judged from gpu_util (notes: {notes[:3]})", o)
        if e.low_confidence:
            for f in o.flags:
                if f["kind"] not in ok:
                    continue
                conf_checked += 1
                c = confidence_of(f)
                if c is None:
                    conf_unrep += 1
                    problem("confidence", f"{f['kind']}: no confidence reported (must be below high)", o)
                elif c.lower() == "high":
                    conf_bad += 1
                    problem("confidence", f"{f['kind']}: confidence high, judged without profiling metrics", o)
    return Score(kinds, healthy, flagged, len(outcomes), problems, acc_checked, acc_bad, conf_checked, conf_bad,
                 conf_unrep, with_allowed, fleet_alloc, fleet_waste, notes_checked, notes_bad)


def by_interval(outcomes: list[Outcome]) -> dict[int, Score]:
    groups: dict[int, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        groups[o.interval].append(o)
    return {iv: score(v) for iv, v in sorted(groups.items())}


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(outcomes: list[Outcome], deadline_problems: list[Problem] | None = None, *, deadline_checked: int = 0,
             max_problems: int = 200) -> str:
    total = score(outcomes)
    per = by_interval(outcomes)
    lines = ["| kind | demanded | caught | recall | raised | right | precision |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for k, ks in total.kinds.items():
        if not (ks.demanded or ks.raised):
            continue
        lines.append(f"| `{k}` | {ks.demanded} | {ks.hit} | {fmt(ks.recall)} | {ks.raised} | {ks.correct} | "
                     f"{fmt(ks.precision)} |")
    lines += ["", "Per sampling interval (precision / recall per kind; healthy jobs flagged):", ""]
    ivs = list(per)
    lines.append("| kind | " + " | ".join(f"{iv} s" for iv in ivs) + " |")
    lines.append("|---|" + "---:|" * len(ivs))
    for k in total.kinds:
        if not (total.kinds[k].demanded or total.kinds[k].raised):
            continue
        cells = []
        for iv in ivs:
            kiv = per[iv].kinds.get(k)
            cells.append("-" if kiv is None or not (kiv.demanded or kiv.raised) else f"{fmt(kiv.precision)} / "
                                                                                     f"{fmt(kiv.recall)}")
        lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
    lines.append("| healthy flagged | " + " | ".join(f"{per[iv].healthy_flagged}/{per[iv].healthy_jobs}" for iv in ivs)
                 + " |")
    fleet_ok = "<=" if total.fleet_wasted_gpu_hours <= total.fleet_allocated_gpu_hours + EPS else "ABOVE"
    lines += ["", f"Jobs: {total.jobs} ({total.healthy_jobs} healthy, {total.healthy_flagged} of them flagged; "
              f"{total.healthy_with_allowed} more raised only kinds their labels allow). "
              f"Fleet waste {total.fleet_wasted_gpu_hours:.1f} {fleet_ok} fleet allocation "
              f"{total.fleet_allocated_gpu_hours:.1f} GPU-h. "
              f"Accounting (waste <= allocation, score in 0..1): {total.accounting_bad} of {total.accounting_checked} "
              f"reports break it. Confidence on fallback-judged flags: {total.confidence_checked} checked, "
              f"{total.confidence_bad} high, {total.confidence_unreported} without a confidence; "
              f"coverage notes missing on {total.coverage_notes_missing} of {total.coverage_notes_checked}."]
    if deadline_checked:
        met = deadline_checked - len(deadline_problems or [])
        lines.append(f"Deadlines (e.g. hung within 15 min of the hang): {met} of {deadline_checked} met.")
    probs = total.problems + list(deadline_problems or [])
    if probs:
        lines += ["", "| scenario | seed | interval | job | problem | detail |", "|---|---:|---:|---|---|---|"]
        for p in probs[:max_problems]:
            lines.append(f"| {p.scenario} | {p.seed} | {p.interval} s | `{p.job_id}` | {p.what} | "
                         f"{p.detail.replace('|', '/')} |")
        if len(probs) > max_problems:
            lines.append(f"| ... | | | | {len(probs) - max_problems} more | |")
        lines += ["", "Why those scenarios carry their labels:", ""]
        for name, why in sorted({(p.scenario, p.why) for p in probs}):
            lines.append(f"- `{name}`: {why}")
    return "\n".join(lines)
