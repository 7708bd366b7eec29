"""Analysis CPU from minute features, this tree against an older tree's ``analysis`` package,
in one process, whole passes alternating: the A/B that holds on a shared, loaded box (both
trees see the same load in the same minutes; the ratio is the reading).

    # an older tree's analysis package (docs/benchmarks.md, "Session 3: analysis CPU")
    mkdir -p /tmp/before && git archive <rev> analysis | tar -x -C /tmp/before
    .venv/bin/python bench/goodput/analysis_ab.py --against /tmp/before/analysis           # 10,000 GPUs
    .venv/bin/python bench/goodput/analysis_ab.py --against /tmp/before/analysis --quick   # 1,000 GPUs

The older package is imported under another name (its modules import each other relatively
and the rest of gpufleet absolutely, so only the analysis differs). A pass is the fleet's
features path as that tree's runner takes it (states -> from_states per job, or all jobs'
states -> batch.build_many when the tree has analysis/batch.py; then each job's analyze), as
features_bench.py times it; each tree runs ``--repeat`` passes, alternating (which goes first
alternates too), and the fastest counts; ``--repeat 1`` is the cold single pass. (Before
analysis.batch this alternated job by job; a tree that builds a pass's jobs together can only
be timed by the pass.) Every job's report and flags must be identical (the run fails otherwise)."""

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


def _batch_of(package: str) -> Any:
    """The tree's ``batch.build_many`` (a pass's features and windows built together), or None
    for a tree that builds each job's alone."""
    try:
        return importlib.import_module(f"{package}.batch").build_many
    except ImportError:
        return None


def _pass(features_mod: Any, report_mod: Any, th: Any, build_many: Any, sizes: list[int], pool: Any, states: Any,
          t0: float, seconds: int) -> list[Any]:
    """One whole pass of a tree over the fleet, as its runner takes it: every job's features
    (built together when the tree can), then each job analyzed."""
    jobs = [states[(s, j % len(pool[s]))] for j, s in enumerate(sizes)]
    last = t0 + seconds - 1
    if build_many is None:
        return [report_mod.analyze(job_meta(report_mod.JobMeta, j, s, t0),
                                   features_mod.from_states(rows, list(range(s))), h, th=th, first_ts=t0, last_ts=last)
                for j, (s, (rows, h)) in enumerate(zip(sizes, jobs, strict=True))]
    built = build_many([(rows, list(range(s))) for s, (rows, _) in zip(sizes, jobs, strict=True)],
                       th.general.window_s, th.general.min_window_coverage)
    return [report_mod.analyze(job_meta(report_mod.JobMeta, j, s, t0), b.feats, h, th=th, first_ts=t0, last_ts=last,
                               windows=b.windows)
            for j, (s, b, (_, h)) in enumerate(zip(sizes, built, jobs, strict=True))]


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
    trees = {"before": (old_features, old_report, old_config.load_thresholds(), _batch_of("analysis_before")),
             "now": (features, report, config.load_thresholds(), _batch_of("gpufleet.analysis"))}
    cpu: dict[str, list[float]] = {k: [] for k in trees}
    out: dict[str, list[str]] = {}
    for r in range(max(1, a.repeat)):
        # Which tree goes first alternates by pass: the second finds the rows in cache, which
        # matters in a cold single pass (--repeat 1).
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for name in order:
            c = time.process_time()
            got = _pass(*trees[name], sizes, pool, states, t0, a.seconds)
            cpu[name].append(time.process_time() - c)
            out[name] = [json.dumps([x.report, [(f.kind, f.scope) for f in x.findings]], sort_keys=True) for x in got]
    different = sum(b != n for b, n in zip(out["before"], out["now"], strict=True))
    load = os.getloadavg()[0]
    best = {k: min(v) for k, v in cpu.items()}
    print(f"fleet: {total:,} GPUs in {len(sizes):,} jobs, {a.seconds:,} s; fastest of {a.repeat} passes per tree "
          f"(alternating); load average {load:.2f}")
    for name in trees:
        how = "built together (analysis.batch)" if trees[name][3] else "one job at a time"
        print(f"  {name}: features {how}; passes {', '.join(f'{t:.2f}' for t in cpu[name])} s")
    print(f"analysis CPU from minute features: before {best['before']:.2f} s, now {best['now']:.2f} s "
          f"({best['before'] / best['now']:.2f}x; goal <= 1.5 s for 10,000 GPUs = "
          f"{1e3 * 1.5 / len(sizes) * total / 10_000:.2f} ms per job here)")
    print(f"reports and flags identical: {len(sizes) - different} of {len(sizes)} jobs")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
