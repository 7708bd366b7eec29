"""Time to detect and false alarms: the progress library (``progress_library.py``) and the PAI
traces replayed at their own pace through the relay's fold, judged as the collector would at
each analysis pass; hardware-only hangs and stragglers judged minute by minute.

    .venv/bin/python bench/realworld/ttd.py                 # 3 seeds per case, passes every 60 s and every 10 s
    .venv/bin/python bench/realworld/ttd.py --seeds 5 --out /tmp/ttd.md

Progress: every rank is a process sending one datagram a second (its steps, a heartbeat, an
exit record at a clean exit) into ``gpufleet.progress_fold.Folder``; windows close as the relay
closes them; ``analysis.progress.detect.detect_all`` runs at each pass (``--cadence``: the
beat's 60 s analysis interval, and 10 s = judged as each window arrives) over the windows so
far. A (kind, scope) counts as raised when an ongoing finding of it first appears; time to
detect = that pass's time - the fault's onset. False alarm: a raised (kind, scope) the case's
labels do not name; per day = false alarms / (job-days of the cases judged).

Hardware alone: telemetry generated here (a collective hang of all GPUs; stragglers as the
scenario library draws them: one GPU's clock 20% low under HW slowdown, one GPU of 16 25% low
under thermal slowdown, one node of three under the power brake, each busier than its waiting
peers), analyzed by ``analysis.report.analyze`` on the samples up to each minute after the
onset, as a pass at that minute would; onsets at several offsets inside the minute and the
5-minute window (``HW_OFFSETS``)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/ for `realworld`

import numpy as np

from realworld.progress_library import BUILDERS, PAI_LABELS, ProgressCase, pai_case

WALL0, MONO0 = 1_800_000_000.0, 10_000.0


@dataclass
class CaseResult:
    case: ProgressCase
    cadence: int
    first: dict[str, float] = field(default_factory=dict)  # "kind@scope" -> first pass (job s) it was raised
    seconds: float = 0.0
    wall0: float = WALL0
    findings: dict[str, Any] = field(default_factory=dict)  # scope -> the newest ongoing finding of it
    starts: dict[str, set[float]] = field(default_factory=lambda: defaultdict(set))  # scope -> start_ts seen

    def matches(self, label: str, raised: str) -> bool:
        kind, _, scope = label.partition("@")
        rk, _, rs = raised.partition("@")
        return rk == kind and (not scope or rs == scope)

    def hits(self) -> dict[str, float | None]:
        """label -> time to detect (None: raised, onset not timed); missing labels left out."""
        out: dict[str, float | None] = {}
        for label, onset in self.case.expect.items():
            ts = [t for k, t in self.first.items() if self.matches(label, k)]
            if ts:
                out[label] = None if onset is None else min(ts) - onset
        return out

    def false(self) -> list[str]:
        return sorted(k for k in self.first if not any(self.matches(lb, k) for lb in self.case.expect)
                      and k.partition("@")[0] not in self.case.allowed)


def _windows(raw: list[dict[str, Any]]) -> list[Any]:
    from gpufleet.analysis.progress.model import Window

    keys = set(Window.__dataclass_fields__) - {"start", "end", "node"}
    return [Window(start=w["start"], end=w["end"], **{k: w[k] for k in keys if k in w}) for w in raw]


def replay(c: ProgressCase, cadence: int, rng: np.random.Generator, judge_from_s: float = 0.0) -> CaseResult:
    """``c`` through the fold, a pass every ``cadence`` s from ``judge_from_s`` on (earlier
    passes only look for false alarms: tests that time a fault skip them)."""
    from gpufleet.analysis.progress.detect import detect_all
    from gpufleet.analysis.progress.goodput import job_goodput
    from gpufleet.progress_fold import Folder

    t_start = time.perf_counter()
    for r in c.ranks:
        if not r.steps:
            r.plan(rng)
    res = CaseResult(c, cadence)
    fold = Folder()
    ws: list[Any] = []
    idx = {id(r): 0 for r in c.ranks}
    step_no = {id(r): r.first_step - 1 for r in c.ranks}
    for sec in range(int(c.duration_s) + 2):
        now_m = MONO0 + sec
        for r in c.ranks:
            if sec < r.t0 or sec > r.end + 1:
                continue
            evs: list[list[Any]] = []
            i = idx[id(r)]
            while i < len(r.steps) and r.steps[i] < sec:
                step_no[id(r)] += 1
                evs.append(["s", MONO0 + r.steps[i], step_no[id(r)], 1024])
                i += 1
            idx[id(r)] = i
            if r.exit == "clean" and sec - 1 < r.end <= sec:
                evs.append(["x", MONO0 + r.end])
            elif r.exit == "vanish" and sec > r.end:
                continue
            fold.feed({"pid": r.pid, "wall0": WALL0 + r.t0, "mono0": MONO0 + r.t0, "now": min(now_m, MONO0 + r.end),
                       "id": {"job": c.name, "rank": r.rank, "host": r.host, "gpu": r.gpu}, "ev": evs}, now_m)
        if sec % 5 == 0:
            ws += _windows(fold.close_due(WALL0 + sec, now_m))
        if sec % cadence == 0 and ws and sec >= judge_from_s:
            g = job_goodput(ws)
            if g is None:
                continue
            for f in detect_all(ws, g, WALL0 + sec):
                key = f"{f.kind}@{f.scope}"
                if not f.ongoing:
                    continue
                res.first.setdefault(key, float(sec))
                res.findings[f.scope] = f
                res.starts[f.scope].add(f.start_ts)
    res.seconds = time.perf_counter() - t_start
    return res


# --- hardware alone --------------------------------------------------------------------------

GIB = 2.0**30


# Hardware-alone cases: (kind, what the telemetry shows, GPUs, nodes). Stragglers as the scenario
# library draws them (straggler_one_in_64, straggler_thermal_gpu, straggler_power_brake_node).
HW_CASES: dict[str, tuple[str, int, int]] = {
    "hung": ("`hung` (every GPU spinning)", 8, 1),
    "straggler": ("`straggler` (one GPU of 8, HW slowdown 0x8, clock -20%)", 8, 1),
    "straggler_thermal": ("`straggler` (one GPU of 16, thermal 0x20, clock -25%)", 16, 2),
    "straggler_node": ("`straggler` (one node of 3, power brake 0x80, clock -43%)", 24, 3),
}
HW_OFFSETS = (0.0, 0.25, 0.5, 0.75, 1.5, 2.5, 4.0)  # onset, minutes after minute 30: inside the minute and the window


def _telemetry(kind: str, n: int, minutes: int, onset_min: float, interval_s: float = 10.0, n_nodes: int = 1
               ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    from gpufleet.analysis.features import RAW_FIELDS

    t = interval_s * np.arange(1, int(minutes * 60 / interval_s) + 1)
    ts, gpu, cols = [], [], {k: [] for k in RAW_FIELDS}
    for g in range(n):
        after = t >= onset_min * 60
        wob = 0.03 * np.sin(t / 7.0 + g)
        v: dict[str, Any] = {"sm_active": 0.88 + wob, "sm_occupancy": 0.45, "tensor_active": 0.45 + wob,
                             "dram_active": 0.5, "gpu_util": 1.0, "fp32_active": 0.05, "fp64_active": 0.0,
                             "power_w": 640.0, "sm_clock_mhz": 1980.0, "clock_event_reasons": 0.0,
                             "fb_used_bytes": 70 * GIB, "fb_total_bytes": 80 * GIB, "nvlink_tx_bytes_s": 6e10,
                             "nvlink_rx_bytes_s": 6e10, "xid_last": 0.0}
        if kind == "hung":
            for k, x in (("sm_active", 0.15), ("tensor_active", 0.0), ("dram_active", 0.002), ("sm_occupancy", 0.02),
                         ("nvlink_tx_bytes_s", 0.0), ("nvlink_rx_bytes_s", 0.0), ("power_w", 160.0)):
                v[k] = np.where(after, x, np.broadcast_to(v[k], t.shape))
        elif kind.startswith("straggler"):
            # the slow GPU (or every GPU of the slow node): clock low under its reason, busier
            # than its peers, who wait for it in every all-reduce
            factor, reasons = {"straggler": (0.8, 0x8), "straggler_thermal": (0.75, 0x20),
                               "straggler_node": (0.57, 0x80 | 0x8)}[kind]
            slow = g < n // n_nodes if kind == "straggler_node" else g == 0
            if slow:
                v["sm_clock_mhz"] = np.where(after, 1980.0 * factor, 1980.0)
                v["clock_event_reasons"] = np.where(after, float(reasons), 0.0)
                v["sm_active"] = np.where(after, 0.93 + wob, v["sm_active"])
            else:
                v["sm_active"] = np.where(after, 0.88 * factor + 0.04 + wob, v["sm_active"])
        ts.append(t)
        gpu.append(np.full(len(t), g))
        for k in RAW_FIELDS:
            x = v.get(k)
            cols[k].append(np.full(len(t), np.nan) if x is None else np.broadcast_to(np.asarray(x, float), t.shape))
    return (np.concatenate(ts) + WALL0, np.concatenate(gpu), {k: np.concatenate(x) for k, x in cols.items()})


def _first_pass(kind: str, ts: np.ndarray, gpu: np.ndarray, cols: dict[str, np.ndarray], nodes: list[str],
                model: str, onset_ts: float, horizon_min: int) -> float | None:
    """Seconds from ``onset_ts`` to the first pass (one a minute, on the samples so far)
    raising ``kind`` as ongoing; None when not within ``horizon_min``."""
    from gpufleet.analysis.config import load_thresholds
    from gpufleet.analysis.detectors import features_for
    from gpufleet.analysis.features import histograms
    from gpufleet.analysis.report import JobMeta, analyze

    th = load_thresholds()
    n = len(nodes)
    for m in range(1, horizon_min + 1):
        keep = ts <= onset_ts + m * 60
        t2, g2, c2 = ts[keep], gpu[keep], {k: x[keep] for k, x in cols.items()}
        feats = features_for(th, t2, g2, c2, n)
        meta = JobMeta(job_id="ttd", start_ts=float(ts.min()), end_ts=None, running=True,
                       gpu_uuids=[f"GPU-{g}" for g in range(n)], gpu_nodes=nodes, gpu_indexes=list(range(n)),
                       model=model)
        res = analyze(meta, feats, histograms(c2), th=th, first_ts=float(t2.min()), last_ts=float(t2.max()))
        if any(f.kind == kind and f.ongoing for f in res.findings):
            return m * 60.0
    return None


def hardware_ttd(case: str, onset_min: float, horizon_min: int = 30) -> float | None:
    """Seconds from the onset to the first pass raising the case's kind (``HW_CASES``) as
    ongoing; None when not within ``horizon_min``."""
    _, n, n_nodes = HW_CASES[case]
    ts, gpu, cols = _telemetry(case, n, int(onset_min + horizon_min), onset_min, n_nodes=n_nodes)
    return _first_pass(case.partition("_")[0], ts, gpu, cols, [f"n{g * n_nodes // n + 1}" for g in range(n)],
                       "NVIDIA H100 80GB HBM3", WALL0 + onset_min * 60, horizon_min)


# The scenario library's own stragglers (bench/realworld/scenarios_faults.py), rendered by its
# generators and sampler; the onset is where the faulty GPU's forced clock factor starts.
LIBRARY_STRAGGLERS = ("straggler_thermal_gpu", "straggler_power_brake_node", "straggler_one_in_64")


def library_ttd(name: str, seed: int, interval_s: int, horizon_min: int = 30) -> float | None:
    from gpufleet.analysis.features import RAW_FIELDS
    from realworld.feed import render_job
    from realworld.library import REGISTRY
    from realworld.model import instantiate

    (spec,) = instantiate(REGISTRY[name], seed)
    onset = min(int(np.flatnonzero(g.clock_factor < 1.0)[0]) for g in spec.truths if (g.clock_factor < 1.0).any())
    rj = render_job(spec, base_ts=WALL0, interval_s=interval_s, rng=np.random.default_rng([seed, interval_s]))
    ts = np.concatenate([r.ts for r in rj.gpus])
    gpu = np.concatenate([np.full(len(r.ts), i) for i, r in enumerate(rj.gpus)])
    cols = {k: np.concatenate([r.cols.get(k, np.full(len(r.ts), np.nan)) for r in rj.gpus]) for k in RAW_FIELDS}
    return _first_pass("straggler", ts, gpu, cols, [s.node for s in spec.slots], spec.slots[0].device.model,
                       rj.t0 + onset, horizon_min)


# --- report ----------------------------------------------------------------------------------

def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def score(results: list[CaseResult]) -> dict[str, dict[str, Any]]:
    """Per kind: jobs demanding it, caught, jobs raising it, right; detection times."""
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"demanded": 0, "hit": 0, "raised": 0, "right": 0,
                                                          "ttd": []})
    for r in results:
        hits = r.hits()
        for label in r.case.expect:
            k = label.partition("@")[0]
            out[k]["demanded"] += 1
            if label in hits:
                out[k]["hit"] += 1
                if hits[label] is not None:
                    out[k]["ttd"].append(hits[label])
        false = set(r.false())
        for key in r.first:
            k = key.partition("@")[0]
            out[k]["raised"] += 1
            out[k]["right"] += key not in false
    return out


def markdown(results: dict[int, list[CaseResult]], hw: dict[str, list[float | None]], cmd: str) -> str:
    lines = [f"Time to detect and false alarms (`{cmd}`).", ""]
    for cadence, rs in sorted(results.items(), reverse=True):
        healthy_days = sum(r.case.duration_s for r in rs if r.case.healthy) / 86400.0
        all_days = sum(r.case.duration_s for r in rs) / 86400.0
        false = sum(len(r.false()) for r in rs)
        false_healthy = sum(len(r.false()) for r in rs if r.case.healthy)
        lines += [f"Progress, judged every {cadence} s ({len(rs)} job runs, {all_days * 24:.1f} job-hours; "
                  f"healthy: {sum(r.case.healthy for r in rs)} runs, {healthy_days * 24:.1f} h):", "",
                  "| kind | demanded | caught | recall | raised | right | precision | TTD median (s) | TTD worst (s) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for k, s in sorted(score(rs).items()):
            rec = f"{s['hit'] / s['demanded']:.2f}" if s["demanded"] else "-"
            prec = f"{s['right'] / s['raised']:.2f}" if s["raised"] else "-"
            t = s["ttd"]
            lines.append(f"| `{k}` | {s['demanded']} | {s['hit']} | {rec} | {s['raised']} | {s['right']} | {prec} | "
                         f"{_fmt(statistics.median(t) if t else None)} | {_fmt(max(t) if t else None)} |")
        lines += ["", f"False alarms: {false} in all runs ({false / all_days:.2f} per job-day); on healthy jobs "
                  f"{false_healthy} ({(false_healthy / healthy_days) if healthy_days else 0:.2f} per job-day).", ""]
        bad = [(r.case.name, r.case.seed, r.false(), sorted(set(r.case.expect) - set(r.hits()))) for r in rs
               if r.false() or set(r.case.expect) - set(r.hits())]
        for name, seed, f, miss in bad:
            lines.append(f"- `{name}` seed {seed}: false {f}, missed {miss}")
        if bad:
            lines.append("")
    lines += ["Hardware alone (one pass a minute on the samples so far; the cases drawn here at several onset "
              "offsets, the library's stragglers once per seed):", "",
              "| kind | runs | caught | TTD median (s) | TTD worst (s) |", "|---|---:|---:|---:|---:|"]
    for k, ts in hw.items():
        got = [t for t in ts if t is not None]
        label = HW_CASES[k][0] if k in HW_CASES else k
        lines.append(f"| {label} | {len(ts)} | {len(got)} | {_fmt(statistics.median(got) if got else None)} | "
                     f"{_fmt(max(got) if got else None)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cadence", type=int, action="append", help="seconds between passes (default 60 and 10)")
    ap.add_argument("--case", action="append",
                    help="only these cases (names; pai for the PAI traces, pai:job_3_norm.csv for one)")
    ap.add_argument("--pace", type=float, action="append",
                    help="the PAI traces' ms per normalised unit (default 1 and 10: two readings)")
    ap.add_argument("--no-hardware", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    cmd = "bench/realworld/ttd.py" + ("" if argv is None else " " + " ".join(argv))
    if argv is None:
        cmd = "bench/realworld/ttd.py " + " ".join(sys.argv[1:])
    results: dict[int, list[CaseResult]] = {}
    for cadence in a.cadence or [60, 10]:
        rs = []
        for name, build in BUILDERS.items():
            if a.case and name not in a.case:
                continue
            for seed in range(1, a.seeds + 1):
                rng = np.random.default_rng([seed, sum(map(ord, name))])
                rs.append(replay(build(rng, seed), cadence, rng))
        for f in PAI_LABELS:
            if a.case and "pai" not in a.case and f"pai:{f}" not in a.case:
                continue
            for pace in a.pace or [1.0, 10.0]:  # the release's times are normalised: two readings of its pace
                    c = pai_case(f, pace)
                    if c is not None:
                        rs.append(replay(c, cadence, np.random.default_rng(0)))
        results[cadence] = rs
    hw: dict[str, list[float | None]] = {}
    if not a.no_hardware:
        for case in HW_CASES:
            hw[case] = [hardware_ttd(case, 30.0 + off) for off in HW_OFFSETS]
        for name in LIBRARY_STRAGGLERS:  # the library's own, one run per seed and sampling interval
            for interval in (10, 60):
                hw[f"`straggler`: `{name}`, sampled every {interval} s"] = [
                    library_ttd(name, seed, interval) for seed in range(1, a.seeds + 1)]
    md = markdown(results, hw, cmd.strip())
    print(md)
    if a.out:
        a.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
