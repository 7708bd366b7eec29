"""The flags page in a real Chromium: severity and a one-line evidence summary (labels and units
from the flag-kind registry, not raw keys), filters by severity, sorting."""

from __future__ import annotations

import pytest
from apiseed import Seeded
from webpage import Page

pytestmark = pytest.mark.browser


def _col(pg, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    heads = pg.locator("table.flagtable thead th").all_inner_texts()
    i = [h.strip().lower() for h in heads].index(name.lower())
    return [t.strip() for t in pg.locator(f"table.flagtable tbody tr td:nth-child({i + 1})").all_inner_texts()]


def test_flags_show_severity_and_evidence_in_words(web: tuple[Page, Seeded], sqlite_url: str) -> None:
    from sqlalchemy import update

    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Flag

    p, _ = web
    e = make_engine(sqlite_url)
    with e.begin() as c:  # registry keys, as the idle detector writes them
        c.execute(update(Flag).where(Flag.kind == "idle_gpu").values(
            evidence={"sm_active_max": 0.02, "idle_gpus": 2, "flagged_minutes": 118}))
        c.execute(update(Flag).where(Flag.kind == "throttled").values(  # a long list folds
            evidence={"gpu_uuids": ["GPU-a", "GPU-b", "GPU-c", "GPU-d"], "detail": {"nested": 1}}))
    e.dispose()
    pg = p.open("/flags?open=")
    api = pg.context.request.get(p.base + "/api/v1/flags?limit=200").json()["data"]
    assert len(api) >= 2
    assert [s.lower() for s in _col(pg, "Severity")] == [f["severity"] for f in api]
    evidence = _col(pg, "Evidence")
    assert len(evidence) == len(api)
    idle = next(line for line, f in zip(evidence, api, strict=True) if f["kind"] == "idle_gpu")
    assert "max SM activity 2%" in idle  # the registry's label, the ratio as a percentage
    assert all("_" not in line for line in evidence), evidence  # unlabelled keys read as words too
    throttled = next(line for line, f in zip(evidence, api, strict=True) if f["kind"] == "throttled")
    assert throttled == "gpu uuids GPU-a, GPU-b +2"  # folded; the nested object is left to the job page
    p.shot("flags")
    assert p.errors == []


def test_flags_filter_by_severity_and_sort(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    pg = p.open("/flags?open=&severity=critical")
    sev = _col(pg, "Severity")
    assert sev and {s.lower() for s in sev} == {"critical"}
    pg = p.open("/flags?open=&sort=severity")
    order = [s.lower() for s in _col(pg, "Severity")]
    rank = {"critical": 0, "warning": 1, "info": 2}
    assert order == sorted(order, key=rank.__getitem__) and len(set(order)) > 1
    pg.select_option("select[name=sort]", "newest")
    pg.wait_for_function("() => location.search.includes('sort=newest')")
    assert p.errors == []
