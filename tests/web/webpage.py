"""A Playwright page wrapper for the dashboard tests: records console errors, page errors and
dialogs, waits for a page's data, saves screenshots under artifacts/screenshots/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


class Page:
    """A Playwright page that records console errors, page errors and dialogs."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.requests: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

        def on_dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        page.set_default_timeout(15000)

    def open(self, path: str) -> Any:
        self.page.goto(self.base + path)
        self.page.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true", timeout=15000)
        return self.page

    def shot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        out = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(out), full_page=True)
        return out


def rounded(v: float, d: int = 0, shift: int = 0) -> str:
    """api/static/fmt.js's one rounding rule: v x 10^shift, half away from zero to d decimals,
    on the decimal digits of v's shortest form (exact: 0.1505 is 15.1%, 0.2795 is 28.0%)."""
    from decimal import ROUND_HALF_UP, Decimal

    out = str(Decimal(repr(float(v))).scaleb(shift).quantize(Decimal(1).scaleb(-d), rounding=ROUND_HALF_UP))
    return out[1:] if out.startswith("-") and not any(c in "123456789" for c in out) else out


def pct(v: float | None, d: int = 0) -> str:
    return "–" if v is None else f"{rounded(v, d, 2)}%"


def gh(v: float | None) -> str:
    return "–" if v is None else rounded(v, 0 if abs(v) >= 100 else 1)


def fleet_waste(page: Any, base: str, window: str = "24h") -> tuple[float, float, dict[str, float]]:
    """(wasted, allocated GPU-h, waste by cause) as the fleet page shows them: the GPU-time
    ledger's over the window once it holds time (GET /api/v1/fleet/ledger), else the summary's."""
    led = page.context.request.get(f"{base}/api/v1/fleet/ledger?group_by=cause&start=-{window}")
    if led.ok and led.json()["total"]["allocated_gpu_hours"] > 0:
        t = led.json()
        return (t["total"]["wasted_gpu_hours"], t["total"]["allocated_gpu_hours"],
                {g["key"]: g["gpu_hours"] for g in t["groups"] if g["kind"] == "badput" and g["gpu_hours"]})
    s = page.context.request.get(f"{base}/api/v1/fleet/summary?window={window}").json()
    return s["wasted_gpu_hours_total"], s["allocated_gpu_hours"], {k: v for k, v in s["wasted_gpu_hours"].items() if v}
