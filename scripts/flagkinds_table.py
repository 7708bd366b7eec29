#!/usr/bin/env python
"""The flag-kind table of docs/concepts.md, generated from the registry (gpufleet/flagkinds.toml).

The docs site is built with it: scripts/mkdocs_hooks.py puts the table where the page has the
marker comment, at every build, so it cannot fall behind the registry or the pages it links.

    .venv/bin/python scripts/flagkinds_table.py     # print the table (Markdown)

A kind's `docs` anchor is linked when its page and anchor exist, its page alone when only the
page does, and named without a link otherwise (a registry entry pointing at a page not written)."""

from __future__ import annotations

import re
from pathlib import Path

from gpufleet.flagkinds import flag_kinds

REPO = Path(__file__).resolve().parent.parent
MARKER = "<!-- flag-kinds: the table is generated here when the site is built (scripts/flagkinds_table.py) -->"


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    ids = set(re.findall(r'id="([^"]+)"', text))
    for h in re.findall(r"^#+\s+(.+)$", text, flags=re.M):  # MkDocs' toc slugs
        ids.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h.strip().lower())))
    return ids


def _where(docs: str, docs_dir: Path) -> str:
    path, _, anchor = docs.partition("#")
    page = REPO / path
    name = page.relative_to(docs_dir).as_posix() if page.is_relative_to(docs_dir) else path
    if not page.is_file():
        return f"{path} (not written yet)"
    if anchor and anchor in _anchors(page):
        return f"[{name}]({name}#{anchor})"
    return f"[{name}]({name})"


def table(docs_dir: Path = REPO / "docs") -> str:
    fk = flag_kinds()
    rows = ["| kind | title | judged from | scope | default severity | what it means | described in |",
            "|---|---|---|---|---|---|---|"]
    for name in fk.names:
        k = fk.get(name)
        summary = k.summary.replace("|", "\\|")
        rows.append(f"| `{name}` | {k.title} | {k.source} | {k.scope} | {k.severity} | {summary} "
                    f"| {_where(k.docs, docs_dir)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
