"""Write simulated job history as NDJSON (the `gpufleet import` format), with its ground truth.

    .venv/bin/python bench/goodput/make_history.py history.ndjson --seeds 1 [--quick]
    gpufleet import history.ndjson && gpufleet analyze --all

Prints one line per job: job id, profile, GPUs, minutes and the flags a correct engine raises."""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simjobs import plan_jobs

from gpufleet.agent.simulator import write_ndjson_history


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="output file (.ndjson or .ndjson.gz)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="35-45 minute jobs")
    ap.add_argument("--cluster", default=None)
    a = ap.parse_args(argv)
    jobs = plan_jobs(range(a.seeds), min_minutes=35 if a.quick else 40, max_minutes=45 if a.quick else 100)
    opener = gzip.open if a.out.endswith(".gz") else open
    with opener(a.out, "wt") as fh:
        n = write_ndjson_history(fh, jobs, cluster=a.cluster)
    for j in jobs:
        dur = ((j.end_ts or j.start_ts) - j.start_ts) / 60
        print(f"{j.job_id:28s} {j.profile.name:22s} {len(j.gpus):3d} GPUs {dur:5.0f} min  "
              f"expect {sorted(j.profile.flags) or '-'}")
    print(f"{n:,} lines -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
