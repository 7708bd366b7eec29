#!/usr/bin/env python
"""Write the flag-kind table of docs/concepts.md from the registry (gpufleet/flagkinds.toml).

    .venv/bin/python scripts/flagkinds_table.py           # rewrite the table in place
    .venv/bin/python scripts/flagkinds_table.py --check   # exit 1 when it is out of date (tests/test_docs.py)

The table sits between the two marker comments; everything else in the page is prose. A kind's
`docs` anchor is linked when its page and anchor exist, its page alone when only the page does,
and named without a link otherwise (a registry entry pointing at a page not written yet)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from gpufleet.flagkinds import flag_kinds

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "concepts.md"
BEGIN, END = "<!-- flag-kinds:begin (scripts/flagkinds_table.py) -->", "<!-- flag-kinds:end -->"


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    ids = set(re.findall(r'id="([^"]+)"', text))
    for h in re.findall(r"^#+\s+(.+)$", text, flags=re.M):  # MkDocs' toc slugs
        ids.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h.strip().lower())))
    return ids


def _where(docs: str) -> str:
    path, _, anchor = docs.partition("#")
    page = REPO / path
    name = Path(path).name
    if not page.is_file():
        return f"{path} (not written yet)"
    if anchor and anchor in _anchors(page):
        return f"[{name}]({name}#{anchor})"
    return f"[{name}]({name})"


def table() -> str:
    fk = flag_kinds()
    rows = ["| kind | title | judged from | scope | default severity | what it means | described in |",
            "|---|---|---|---|---|---|---|"]
    for name in fk.names:
        k = fk.get(name)
        summary = k.summary.replace("|", "\\|")
        rows.append(f"| `{name}` | {k.title} | {k.source} | {k.scope} | {k.severity} | {summary} | {_where(k.docs)} |")
    return "\n".join(rows)


def render(text: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{PAGE}: the markers {BEGIN!r} and {END!r} are missing")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when the page's table differs from the registry")
    a = ap.parse_args()
    old = PAGE.read_text()
    new = render(old)
    if a.check:
        if new != old:
            print(f"{PAGE.relative_to(REPO)} is out of date: run .venv/bin/python scripts/flagkinds_table.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
