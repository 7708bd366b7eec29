"""The user docs build and say true things: `mkdocs build --strict` passes (every page in the nav,
no dead link or anchor), every relative link of docs/*.md and README.md resolves in the tree,
every `gpufleet ...` command in a bash block parses with the CLI's own parser, every script a
bash block runs exists, every python block compiles, and the flag-kind table generated into
docs/concepts.md names every kind of the registry."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
import unicodedata
from pathlib import Path

import pytest

from gpufleet.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [*DOCS, REPO / "README.md"]
FENCE = re.compile(r"^([ \t]*)(```|~~~)[ \t]*([\w+-]*)[^\n]*\n(.*?)^\1\2[ \t]*$", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ANCHOR_ID = re.compile(r"""<a\s+[^>]*\b(?:id|name)=["']([^"']+)["']""")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(3).lower(), m.group(4)) for m in FENCE.finditer(text)]


def _prose(text: str) -> str:
    """The text without code blocks and inline code (links there are examples, not links)."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (what MkDocs and these pages' anchors use)."""
    h = re.sub(r"<[^>]+>", "", heading)
    h = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", h)
    h = unicodedata.normalize("NFKD", h).encode("ascii", "ignore").decode()
    h = re.sub(r"[^\w\s-]", "", h).strip().lower()
    return re.sub(r"[-\s]+", "-", h)


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(h) for h in HEADING.findall(text)} | set(ANCHOR_ID.findall(text))


# --- the build --------------------------------------------------------------------------------

def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        msg = "mkdocs is not installed (it is in the dev extra: pip install -e '.[dev]')"
        if os.environ.get("CI") or os.environ.get("GPUFLEET_REQUIRE_SERVICES"):
            pytest.fail(msg)
        pytest.skip(msg)
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    # the flag-kind table, generated from the registry at build time: every kind, none forgotten
    concepts = (tmp_path / "site" / "concepts" / "index.html").read_text()
    assert "flag-kinds:" not in concepts
    kinds = tomllib.loads((REPO / "gpufleet" / "flagkinds.toml").read_text())["kind"]
    assert kinds and all(f"<code>{k['name']}</code>" in concepts for k in kinds)
    # self-contained: no script or stylesheet from a CDN (air-gapped clusters read it too)
    page = (tmp_path / "site" / "index.html").read_text()
    assert not re.findall(r'<(?:script|link)[^>]+(?:src|href)="https?://', page)


def test_every_nav_page_exists() -> None:
    # (a page under docs/ outside the nav is still built and its links checked)
    nav = set(re.findall(r":\s*([\w./-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.M))
    missing = sorted(p for p in nav if not (REPO / "docs" / p).is_file())
    assert nav and not missing, missing


# --- links ------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page: Path) -> None:
    bad = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no anchor #{anchor} in {_rel(dest)}")
    assert not bad, f"{_rel(page)}: " + "; ".join(bad)


# --- code blocks ------------------------------------------------------------------------------

def _command_lines(body: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and prompts dropped."""
    body = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in body.splitlines():
        line = re.sub(r"^\s*\$\s+", "", line)
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out += [part.strip() for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line) if part.strip()]
    return out


def _gpufleet_argv(cmd: str) -> list[str] | None:
    """The arguments after `gpufleet` (env assignments and a venv path before it allowed)."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        return None
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    if not words or Path(words[0]).name != "gpufleet":
        return None
    argv = []
    for w in words[1:]:
        if w in (">", ">>", "2>", "&") or w.startswith((">", "2>")):
            break
        argv.append(w)
    return argv


class _Refused(Exception):
    pass


def _strict(parser: argparse.ArgumentParser) -> None:
    """argparse exits on a bad command line: make it raise, here and in every subparser."""
    def error(message: str) -> None:
        raise _Refused(message)

    parser.error = error  # type: ignore[method-assign,assignment]
    parser.exit_on_error = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _strict(sub)


def _blocks_of(lang: set[str]) -> list[tuple[Path, str]]:
    return [(p, body) for p in PAGES for lg, body in _blocks(p.read_text()) if lg in lang]


BASH = _blocks_of({"bash", "sh", "shell", "console"})


def test_gpufleet_commands_in_bash_blocks_parse() -> None:
    parser = build_parser()
    _strict(parser)
    seen, bad = 0, []
    for page, body in BASH:
        for cmd in _command_lines(body):
            argv = _gpufleet_argv(cmd)
            if argv is None:
                continue
            seen += 1
            try:
                parser.parse_args(argv)
            except (_Refused, argparse.ArgumentError) as e:
                bad.append(f"{_rel(page)}: `{cmd}`: {e}")
    assert seen >= 10  # the docs do show commands
    assert not bad, "\n".join(bad)


def test_scripts_named_in_bash_blocks_exist() -> None:
    bad = []
    for page, body in BASH:
        for cmd in _command_lines(body):
            for w in re.findall(r"(?:^|\s)((?:bench|scripts|helm|tests)/[\w./-]+\.(?:py|sh|lua))\b", cmd):
                if not (REPO / w).is_file():
                    bad.append(f"{_rel(page)}: {w}")
    assert not bad, bad


def test_python_blocks_compile() -> None:
    blocks = _blocks_of({"python", "py"})
    for page, body in blocks:
        try:
            compile(body, f"{_rel(page)} (python block)", "exec")
        except SyntaxError as e:
            pytest.fail(f"{_rel(page)}: a python block does not compile: {e}")


# --- generated tables -------------------------------------------------------------------------

def test_flag_kind_table_names_every_kind_and_links_only_what_exists() -> None:
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "flagkinds_table.py")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    kinds = tomllib.loads((REPO / "gpufleet" / "flagkinds.toml").read_text())["kind"]
    rows = [r for r in res.stdout.splitlines() if r.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == [k["name"] for k in kinds]
    page = REPO / "docs" / "concepts.md"
    for target in LINK.findall(res.stdout):
        path, _, anchor = target.partition("#")
        assert (page.parent / path).is_file() and (not anchor or anchor in _anchors(page.parent / path)), target
