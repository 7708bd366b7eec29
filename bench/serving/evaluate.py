"""Precision and recall of the serving flag kinds on the evaluation library (bench/serving/scenarios.py).

    .venv/bin/python bench/serving/evaluate.py              # 3 seeds x every scenario
    .venv/bin/python bench/serving/evaluate.py --seeds 1
    .venv/bin/python bench/serving/evaluate.py --library heldout   # bench/serving/scenarios_heldout.py

A scenario "raises" a kind when any finding of that kind exists for its deployment. The expected
kinds come from the scenario (written from the engines' tuning guides) and, for slo_missed, from
the simulator's per-request ground truth; the cause slo_missed names is scored separately against
the cause the scenario was built to have. Prints markdown tables (docs/serving.md keeps the figures).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import LIBRARY, run

from gpufleet.analysis.serving.detectors import SERVING_DETECTORS, detect_serving


def evaluate(seeds: int) -> tuple[Counter[tuple[str, str]], list[tuple[str, int, set[str], set[str], str, str]]]:
    counts: Counter[tuple[str, str]] = Counter()
    rows = []
    for seed in range(seeds):
        for s in LIBRARY:
            r = run(s, seed)
            found = detect_serving(r.view)
            got = {f.kind for f in found}
            want = r.expected()
            for kind in (d.kind for d in SERVING_DETECTORS):
                counts[(kind, {(True, True): "tp", (True, False): "fn", (False, True): "fp",
                               (False, False): "tn"}[(kind in want, kind in got)])] += 1
            cause = next((str(f.evidence.get("cause")) for f in found if f.kind == "slo_missed"), "")
            want_cause = s.cause or "" if "slo_missed" in want else ""
            if want_cause and cause:
                counts[("cause", "right" if cause == want_cause else "wrong")] += 1
            rows.append((s.name, seed, want, got, want_cause, cause))
    return counts, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--library", choices=("default", "heldout"), default="default",
                    help="heldout: the library written blind to the detectors (scenarios_heldout.py)")
    args = ap.parse_args()
    if args.library == "heldout":
        import scenarios_heldout

        scenarios_heldout.report(scenarios_heldout.evaluate(args.seeds), args.seeds)
        return
    counts, rows = evaluate(args.seeds)
    print(f"{len(LIBRARY)} scenarios x {args.seeds} seeds\n")
    print("| kind | positives | TP | FP | FN | precision | recall |")
    print("|---|---|---|---|---|---|---|")
    for kind in (d.kind for d in SERVING_DETECTORS):
        tp, fp, fn = counts[(kind, "tp")], counts[(kind, "fp")], counts[(kind, "fn")]
        prec = f"{tp / (tp + fp):.2f}" if tp + fp else "n/a"
        rec = f"{tp / (tp + fn):.2f}" if tp + fn else "n/a"
        print(f"| {kind} | {tp + fn} | {tp} | {fp} | {fn} | {prec} | {rec} |")
    right, wrong = counts[("cause", "right")], counts[("cause", "wrong")]
    if right + wrong:
        print(f"\nslo_missed cause named right on {right} of {right + wrong} correctly raised flags\n")
    print("| scenario | seed | expected | raised | cause expected | cause named |")
    print("|---|---|---|---|---|---|")
    for name, seed, want, got, want_cause, cause in rows:
        print(f"| {name} | {seed} | {', '.join(sorted(want)) or '-'} | {', '.join(sorted(got)) or '-'} | "
              f"{want_cause or '-'} | {cause or '-'} |")


if __name__ == "__main__":
    main()
