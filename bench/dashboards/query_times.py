"""How fast each Grafana dashboard query answers on a simulated day of a 128-GPU fleet, as
Grafana's read-only role on PostgreSQL (the target is 200 ms a query, median of 3 runs).

    GPUFLEET_TEST_PG_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/dashboards/query_times.py [--runs 3] [--target-ms 200]

It runs tests/dashboards/test_dashboards_queries.py (the same fleet, variables and macros, the
same checks of the columns) with GPUFLEET_QUERY_RUNS set, and reads the times each test records
(pytest's record_property "ms", in the JUnit XML). The suite itself asserts no time."""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--target-ms", type=float, default=200.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "times.xml"
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                            "tests/dashboards/test_dashboards_queries.py", "-k", "expected_columns"],
                           cwd=REPO, env={**os.environ, "GPUFLEET_QUERY_RUNS": str(a.runs)})
        if not xml.exists():
            return r.returncode or 1
        rows = []
        for case in ET.parse(xml).getroot().iter("testcase"):
            prop = case.find("properties/property[@name='ms']")
            if prop is not None:
                ms = ast.literal_eval(prop.get("value", "[]"))
                rows.append((statistics.median(ms), case.get("name", "?"), ms))
    rows.sort(reverse=True)
    print(f"{'median ms':>10}  runs (ms)  query")
    for med, name, ms in rows:
        print(f"{med:10.1f}  {ms}  {name.removeprefix('test_query_returns_expected_columns')}")
    over = [n for m, n, _ in rows if m >= a.target_ms]
    meds = [m for m, _, _ in rows]
    if meds:
        print(f"{len(rows)} queries: median {statistics.median(meds):.1f} ms, slowest {max(meds):.1f} ms; "
              f"{len(over)} at or over the {a.target_ms:.0f} ms target")
    return r.returncode or (1 if over else 0)


if __name__ == "__main__":
    sys.exit(main())
