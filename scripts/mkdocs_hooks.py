"""MkDocs hooks.

- Links from a page to a repository file outside docs/ (../helm/..., ../alerts/...) point at
  that file in the repository, so the site has no dead links and the pages still read right on
  GitHub and in a checkout, where the relative link works as written.
- The flag-kind table is generated from the registry where a page has its marker
  (scripts/flagkinds_table.py): it cannot fall behind gpufleet/flagkinds.toml."""

from __future__ import annotations

import importlib.util
import posixpath
import re
from pathlib import Path
from typing import Any

REPO_BLOB = "https://github.com/gpufleet/gpufleet/blob/main/"
_LINK = re.compile(r"\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")


def _flagkinds_table() -> Any:
    spec = importlib.util.spec_from_file_location("flagkinds_table", Path(__file__).with_name("flagkinds_table.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if "<!-- flag-kinds:" in markdown:
        ft = _flagkinds_table()
        markdown = markdown.replace(ft.MARKER, ft.table())
    here = posixpath.dirname("docs/" + page.file.src_uri)

    def repl(m: re.Match[str]) -> str:
        target = posixpath.normpath(posixpath.join(here, m.group(1)))
        if target.startswith("docs/"):
            return m.group(0)  # a page of the site: MkDocs resolves and checks it
        return f"]({REPO_BLOB}{target}{m.group(2) or ''})"

    return _LINK.sub(repl, markdown)
