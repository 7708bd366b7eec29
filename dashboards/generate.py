"""Write (or check) the committed dashboard JSON from the code in gpufleet_dashboards/.

    python dashboards/generate.py          # rewrite dashboards/json/ and the Helm chart's copy
    python dashboards/generate.py --check  # exit 1 when a committed file is stale

The Helm chart keeps its own copy (helm/gpufleet/dashboards/) because Helm can only read
files inside the chart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTPUTS = (HERE / "json", HERE.parent / "helm" / "gpufleet" / "dashboards")


def render(dashboard: dict) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def expected() -> dict[str, str]:
    sys.path.insert(0, str(HERE))
    from gpufleet_dashboards import build_all

    return {name: render(d) for name, d in build_all().items()}


def stale(outputs: tuple[Path, ...] = OUTPUTS) -> list[str]:
    want = expected()
    problems = []
    for out in outputs:
        have = {p.name for p in out.glob("*.json")} if out.is_dir() else set()
        for name, text in want.items():
            p = out / name
            if not p.exists() or p.read_text() != text:
                problems.append(f"{p} is missing or stale")
        problems += [f"{out / name} is not generated (remove it)" for name in sorted(have - set(want))]
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only report stale files")
    args = ap.parse_args(argv)
    if args.check:
        problems = stale()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("run: python dashboards/generate.py", file=sys.stderr)
        return 1 if problems else 0
    for out in OUTPUTS:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in expected().items():
            (out / name).write_text(text)
        print(f"wrote {len(expected())} dashboards to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
