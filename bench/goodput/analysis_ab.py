"""Analysis CPU from minute features, this tree against an older tree's ``analysis`` package,
in one process, job by job interleaved: the A/B that holds on a shared, loaded box (both
trees see the same load at the same moments; the ratio is the reading).

    # an older tree's analysis package (docs/benchmarks.md, "Session 3: analysis CPU")
    mkdir -p /tmp/before && git archive <rev> analysis | tar -x -C /tmp/before
    .venv/bin/python bench/goodput/analysis_ab.py --against /tmp/before/analysis           # 10,000 GPUs
    .venv/bin/python bench/goodput/analysis_ab.py --against /tmp/before/analysis --quick   # 1,000 GPUs

The older package is imported under another name (its modules import each other relatively
and the rest of gpufleet absolutely, so only the analysis differs). Each job's features path
(states -> from_states -> analyze, as features_bench.py times it) runs ``--repeat`` times per
tree, alternating (which tree goes first alternates too), and the fastest of each counts;
``--repeat 1`` is the cold single pass (each job analyzed once per tree). Every job's report and
flags must be identical (the run fails otherwise)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from features_bench import fold_pool, job_meta
from throughput import fleet

from gpufleet.analysis import config, features, report


def load_package(path: Path, name: str) -> ModuleType:
    """The analysis package at ``path`` as top-level package ``name``."""
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py", submodule_search_locations=[str(path)])
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a package")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", type=Path, required=True, help="an older tree's analysis/ directory")
    ap.add_argument("--quick", action="store_true", help="1,000 GPUs")
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--variants", type=int, default=24, help="distinct sample arrays per job size (reused)")
    ap.add_argument("--repeat", type=int, default=3, help="passes per job and tree (the fastest counts)")
    a = ap.parse_args(argv)
    load_package(a.against.resolve(), "analysis_before")
    import analysis_before.config as old_config  # type: ignore[import-not-found]  # loaded just above
    import analysis_before.features as old_features  # type: ignore[import-not-found]
    import analysis_before.report as old_report  # type: ignore[import-not-found]

    total = 1000 if a.quick else a.gpus
    t0 = 1_790_000_000.0
    sizes, pool = fleet(total, a.seconds, a.variants, np.random.default_rng(0), t0)
    states = fold_pool(pool)
    trees: dict[str, tuple[Any, Any, Any, Any]] = {
        "before": (old_features.from_states, old_report.analyze, old_report.JobMeta, old_config.load_thresholds()),
        "now": (features.from_states, report.analyze, report.JobMeta, config.load_thresholds())}
    cpu = {k: 0.0 for k in trees}
    by_size: dict[int, dict[str, list[float]]] = {}
    different = 0
    for j, s in enumerate(sizes):
        rows, h = states[(s, j % len(pool[s]))]
        best = {k: float("inf") for k in trees}
        out: dict[str, str] = {}
        for r in range(max(1, a.repeat)):
            # Which tree goes first alternates (by job and pass): the second one finds the
            # job's rows in cache, which matters in a cold single pass (--repeat 1).
            first = (j + r) % 2
            for name, (from_states, analyze, meta_cls, th) in list(trees.items())[first:] + list(trees.items())[:first]:
                meta = job_meta(meta_cls, j, s, t0)
                c = time.process_time()
                got = analyze(meta, from_states(rows, list(range(s))), h, th=th, first_ts=t0,
                              last_ts=t0 + a.seconds - 1)
                best[name] = min(best[name], time.process_time() - c)
                out[name] = json.dumps([got.report, [(x.kind, x.scope) for x in got.findings]], sort_keys=True)
        different += out["before"] != out["now"]
        for name in trees:
            cpu[name] += best[name]
            by_size.setdefault(s, {k: [] for k in trees})[name].append(best[name])
    load = os.getloadavg()[0]
    print(f"fleet: {total:,} GPUs in {len(sizes):,} jobs, {a.seconds:,} s; fastest of {a.repeat} per job and tree; "
          f"load average {load:.2f}")
    print(f"analysis CPU from minute features: before {cpu['before']:.2f} s, now {cpu['now']:.2f} s "
          f"({cpu['before'] / cpu['now']:.2f}x; goal <= 1.5 s for 10,000 GPUs = "
          f"{1e3 * 1.5 / len(sizes) * total / 10_000:.2f} ms per job here)")
    for s in sorted(by_size):
        b, n = (1e3 * float(np.mean(by_size[s][k])) for k in ("before", "now"))
        print(f"  {s:3d}-GPU jobs: {len(by_size[s]['now']):4d}, {b:6.2f} -> {n:6.2f} ms per job ({b / n:.2f}x)")
    print(f"reports and flags identical: {len(sizes) - different} of {len(sizes)} jobs")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
