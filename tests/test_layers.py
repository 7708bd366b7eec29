"""Data flows one way: agent -> collector -> storage -> analysis -> alerts / API / dashboards.

This walks every module's imports (module level and inside functions) and fails on an arrow
that points backwards, and on the agent importing a server-side package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {
    "gpufleet": "gpufleet",
    "agent": "gpufleet.agent",
    "collector": "gpufleet.collector",
    "storage": "gpufleet.storage",
    "analysis": "gpufleet.analysis",
    "alerts": "gpufleet.alerts",
    "api": "gpufleet.api",
    "migrations": "gpufleet.migrations",
}
# Contracts that every part reads; they import nothing of the project.
CORE = {"gpufleet", "gpufleet.catalog", "gpufleet.protocol", "gpufleet.dcgm", "gpufleet.flagkinds",
        "gpufleet.progress", "gpufleet.progress_fold", "gpufleet.durations"}
TOP = ("gpufleet.cli", "gpufleet.commands", "gpufleet.server", "gpufleet.celery_app", "gpufleet.gctune")
# Server settings: read by every server-side part, never by the agent or storage.
SETTINGS = "gpufleet.settings"

# layer -> layers it may import (core is always allowed)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "agent": set(),
    "storage": set(),
    "settings": {"storage"},
    "collector": {"storage", "settings"},
    "analysis": {"storage", "settings"},
    "alerts": {"storage", "analysis", "settings"},
    "api": {"storage", "analysis", "alerts", "settings"},
}
SERVER_ONLY = ("fastapi", "starlette", "sqlalchemy", "alembic", "celery", "numpy", "pydantic", "asyncpg", "psycopg",
               "uvicorn", "redis")


def layer_of(module: str) -> str:
    if module in CORE:
        return "core"
    if module.startswith(TOP):
        return "top"
    if module == SETTINGS or module.startswith(SETTINGS + "."):
        return "settings"
    parts = module.split(".")
    if parts[:2] == ["gpufleet", "migrations"]:
        return "storage"  # the schema's history belongs to storage
    if len(parts) >= 2 and parts[0] == "gpufleet" and parts[1] in ALLOWED:
        return parts[1]
    if len(parts) == 2 and parts[0] == "gpufleet" and (REPO / "gpufleet" / f"{parts[1]}.py").exists():
        # Any other module file directly in gpufleet/ is a core contract (catalog, protocol, flag
        # kinds, progress, ...): it must import nothing of the project, which the walk checks.
        return "core"
    raise AssertionError(f"{module}: not placed in a layer; add it to tests/test_layers.py")


def all_modules() -> list[tuple[str, Path]]:
    out = []
    for folder, pkg in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([pkg, *parts]), path))
    return out


def imported(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{a.name}" for a in node.names)
    return names


def project_layer(name: str) -> str | None:
    if not name.startswith("gpufleet"):
        return None
    # "from gpufleet.storage import models" records both gpufleet.storage and .models;
    # the deepest importable prefix decides, so map by the second component.
    try:
        return layer_of(name)
    except AssertionError:
        parts = name.split(".")
        try:
            return layer_of(".".join(parts[:2]))
        except AssertionError:
            return "core"  # an attribute of the gpufleet package itself, e.g. __version__


MODULES = all_modules()


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_forward(module: str, path: Path) -> None:
    mine = layer_of(module)
    if mine == "top":
        return
    bad = []
    for name in imported(path, module):
        other = project_layer(name)
        if other is None or other in ("core", mine):
            continue
        if other == "top" or other not in ALLOWED[mine]:
            bad.append(f"{name} ({other})")
    assert not bad, f"{module} ({mine}) imports against the data flow: {sorted(set(bad))}"


@pytest.mark.parametrize(
    ("module", "path"),
    [(m, p) for m, p in MODULES if layer_of(m) in ("agent", "core")],
    ids=[m for m, _ in MODULES if layer_of(m) in ("agent", "core")],
)
def test_agent_and_core_need_no_server_packages(module: str, path: Path) -> None:
    heavy = sorted(n for n in imported(path, module) if n.split(".")[0] in SERVER_ONLY)
    assert not heavy, f"{module} imports server-side packages {heavy}: the agent must install with gpufleet[agent]"


def test_checker_catches_a_backward_import(tmp_path: Path) -> None:
    """The checker itself must fail on a bad arrow (guards against a vacuous walk)."""
    bad = tmp_path / "bad.py"
    bad.write_text("from gpufleet.collector import routes\nimport sqlalchemy\n")
    names = imported(bad, "gpufleet.agent.bad")
    assert "gpufleet.collector" in names and "sqlalchemy" in names
    assert project_layer("gpufleet.collector.routes") == "collector"
    assert "collector" not in ALLOWED["agent"]
    assert len(MODULES) > 20
