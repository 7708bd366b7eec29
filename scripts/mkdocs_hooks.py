"""MkDocs hook: links from a page to a repository file outside docs/ (../helm/..., ../alerts/...)
point at that file in the repository, so the site has no dead links and the pages still read
right on GitHub and in a checkout, where the relative link works as written."""

from __future__ import annotations

import posixpath
import re
from typing import Any

REPO_BLOB = "https://github.com/gpufleet/gpufleet/blob/main/"
_LINK = re.compile(r"\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    here = posixpath.dirname("docs/" + page.file.src_uri)

    def repl(m: re.Match[str]) -> str:
        target = posixpath.normpath(posixpath.join(here, m.group(1)))
        if target.startswith("docs/"):
            return m.group(0)  # a page of the site: MkDocs resolves and checks it
        return f"]({REPO_BLOB}{target}{m.group(2) or ''})"

    return _LINK.sub(repl, markdown)
