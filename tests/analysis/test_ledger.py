"""The GPU-time ledger's invariants over random jobs (hypothesis): every allocated GPU-second
lands in exactly one category, no flag claims more than its scope's allocated time, two flags
never claim one second, and the score stays in [0, 1]."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.analysis.ledger import (
    PRODUCTIVE,
    UNOBSERVED,
    Claim,
    Grid,
    ServingCell,
    add_totals,
    categories,
    fold,
    parse_categories,
    precedence,
    progress_minutes,
    serving_minutes_grid,
    summary,
)
from gpufleet.analysis.progress.model import Window

KINDS = ("idle_gpu", "throttled", "straggler", "low_sm_activity", "hw_fault", "comm_bound")
SEVS = ("info", "warning", "critical")


@st.composite
def jobs(draw: st.DrawFn) -> tuple[Grid, np.ndarray, list[Claim], np.ndarray, dict[str, np.ndarray] | None]:
    g = draw(st.integers(1, 6))
    start = draw(st.floats(1.7e9, 1.7e9 + 3600))
    dur = draw(st.floats(0.0, 4 * 3600))
    grid = Grid.of(start, start + dur, g)
    m = grid.m
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    observed = rng.uniform(-5, 70, (g, m)) * (rng.random((g, m)) > draw(st.floats(0, 1)))
    idle = rng.random((g, m)) < 0.3
    claims = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(KINDS))
        frac = rng.uniform(-0.2, 1.3, (g, m)) * (rng.random((g, m)) < 0.6) if draw(st.booleans()) else None
        if frac is not None and draw(st.booleans()):
            frac[rng.random((g, m)) < 0.1] = np.nan
        stopped = None
        if kind == "hw_fault" and m:
            stopped = np.zeros((g, m), dtype=bool)
            stopped[rng.integers(0, g), rng.integers(0, m):] = True
        scope = draw(st.sampled_from(("gpu", "node", "job")))
        claims.append(Claim(kind, scope, draw(st.sampled_from(SEVS)), frac, stopped, scope))
    progress = None
    if draw(st.booleans()):
        causes = [PRODUCTIVE, *categories().progress]
        progress = {c: rng.uniform(0, 40, (g, m)) * (rng.random((g, m)) < 0.4) for c in causes}
    if draw(st.booleans()):  # a serving replica too (or instead): its minutes decide the GPU-minutes they cover
        served = {c: rng.uniform(0, 45, (g, m)) * (rng.random((g, m)) < 0.5)
                  for c in (PRODUCTIVE, *categories().serving)}
        progress = {**(progress or {}), **{f"serving:{k}": v for k, v in served.items()}}
    return grid, observed, claims, idle, progress


def _split(progress: dict[str, np.ndarray] | None) -> tuple[dict[str, np.ndarray] | None, dict[str, np.ndarray] | None]:
    """The strategy's application view as (progress, serving)."""
    if not progress:
        return progress, None
    serving = {k.removeprefix("serving:"): v for k, v in progress.items() if k.startswith("serving:")}
    rest = {k: v for k, v in progress.items() if not k.startswith("serving:")}
    return rest or None, serving or None


def _check(grid: Grid, claims: list[Claim], led_totals: dict[str, float], flag_s: list[float],
           allocated: float) -> None:
    total = sum(led_totals.values())
    assert abs(total - allocated) <= 1e-3 * max(allocated, 1.0), (total, allocated)
    assert all(v >= -1e-6 for v in led_totals.values())
    per_gpu_alloc = float(grid.alloc_s.sum())
    for c, s in zip(claims, flag_s, strict=True):
        # A flag's scope: the GPUs it claims on (or was stopped on).
        rows = np.zeros(grid.n_gpus, dtype=bool)
        if c.frac is not None:
            rows |= (np.nan_to_num(c.frac) > 0).any(axis=1)
        if c.stopped is not None:
            rows |= c.stopped.any(axis=1)
        assert -1e-6 <= s <= per_gpu_alloc * rows.sum() + 1e-6
    # The hardware kinds' categories are exactly their flags' shares (two flags, one second: never).
    prog = set(categories().progress)
    for kind in {c.kind for c in claims} - prog:
        mine = sum(s for c, s in zip(claims, flag_s, strict=True) if c.kind == kind)
        assert abs(led_totals.get(kind, 0.0) - mine) <= 1e-6 * max(1.0, mine)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_every_allocated_second_lands_once(job: tuple) -> None:
    grid, observed, claims, idle, view = job
    progress, serving = _split(view)
    led = fold(grid, observed, claims, idle=idle, progress=progress, serving=serving)
    totals = led.totals()
    _check(grid, claims, totals, led.flag_s, led.allocated_s)
    if serving and not any(c.stopped is not None and c.severity == "critical" for c in claims):
        # No claim takes a serving cause: every second of it the serving view gave stays (up to the
        # scaling of a GPU-minute given more than its allocated seconds).
        for k in categories().serving:
            assert totals.get(k, 0.0) <= float(serving[k].sum()) + 1e-6
    s = summary(totals, failures=1, wall_s=600.0, price=2.0)
    for k in ("goodput", "ettr", "coverage"):
        assert s[k] is None or 0.0 <= s[k] <= 1.0
    assert s["ettr"] is None or s["goodput"] is None or s["ettr"] <= s["goodput"] + 1e-4
    # Per minute and per GPU add up to the same totals (what is stored sums to the report).
    for k, v in led.per_minute().items():
        assert abs(float(v.sum()) - totals[k]) <= 1e-6 * max(1.0, totals[k])


def test_the_worked_example_of_the_docs() -> None:
    """docs/goodput.md's worked example, by hand: 2 GPUs x 10 minutes; GPU 1 has no telemetry
    in minutes 8-9; idle_gpu claims all of GPU 1 in minutes 2-3; throttled claims 25% of both
    GPUs in minutes 0-3 (a warning each, job scope: idle_gpu goes first, in detector order)."""
    grid = Grid.of(600.0, 1200.0, 2)
    observed = np.full((2, 10), 60.0)
    observed[1, 8:] = 0.0
    thr = np.zeros((2, 10))
    thr[:, 0:4] = 0.25
    idle_claim = np.zeros((2, 10))
    idle_claim[1, 2:4] = 1.0
    claims = [Claim("idle_gpu", "", "warning", idle_claim), Claim("throttled", "", "warning", thr)]
    led = fold(grid, observed, claims)
    t = led.totals()
    assert led.allocated_s == 1200.0
    assert t[UNOBSERVED] == 120.0
    assert t["idle_gpu"] == 60 * 2  # 120 s
    assert t["throttled"] == 0.25 * 60 * 6  # 90 s: not GPU 1's minutes 2-3, idle_gpu's already
    assert t[PRODUCTIVE] == 1200 - 120 - 120 - 90  # 870 s
    assert led.flag_s == [120.0, 90.0]
    s = summary(t)
    assert s["coverage"] == round(1080 / 1200, 4) and s["goodput"] == round(870 / 1080, 4)
    assert s["ettr"] == round(870 / 1200, 4)


def test_progress_decides_and_the_hardware_explains() -> None:
    grid = Grid.of(0.0, 120.0, 1)
    observed = np.full((1, 2), 60.0)
    claim = np.full((1, 2), 0.5)
    progress = {PRODUCTIVE: np.array([[40.0, 0.0]]), "hung": np.array([[20.0, 60.0]])}
    led = fold(grid, observed, [Claim("throttled", "", "warning", claim)], progress=progress)
    t = led.totals()
    # productive stays productive (the claim cannot take it); half the hang is the throttle's
    assert t[PRODUCTIVE] == 40.0 and t["throttled"] == 40.0 and t["hung"] == 40.0
    # a span the program named stays its own
    led = fold(grid, observed, [Claim("throttled", "", "warning", claim)],
               progress={"checkpoint_save": np.array([[60.0, 60.0]])})
    assert led.totals() == {"checkpoint_save": 120.0}


def test_a_fault_that_stops_work_counts_the_stopped_time() -> None:
    grid = Grid.of(0.0, 600.0, 2)
    observed = np.full((2, 10), 60.0)
    observed[0, 5:] = 0.0  # GPU 0 fell off the bus at minute 5
    stopped = np.zeros((2, 10), dtype=bool)
    stopped[0, 5:] = True
    led = fold(grid, observed, [Claim("hw_fault", "node-a", "critical", None, stopped, "node")])
    t = led.totals()
    assert t["hw_fault"] == 300.0 and t[PRODUCTIVE] == 900.0 and UNOBSERVED not in t
    assert led.flag_s == [300.0]
    # a warning-level fault (not critical) stops nothing: unknown stays unknown
    led = fold(grid, observed, [Claim("hw_fault", "node-a", "warning", None, stopped, "node")])
    assert led.totals()[UNOBSERVED] == 300.0


def test_precedence_is_severity_then_scope_then_order() -> None:
    cs = [Claim("a", "", "warning", None), Claim("b", "n", "warning", None, scope_kind="node"),
          Claim("c", "", "critical", None), Claim("d", "u", "info", None, scope_kind="gpu")]
    assert precedence(cs) == [2, 1, 0, 3]


def test_fleet_equals_the_sum_of_jobs_users_and_accounts() -> None:
    rng = np.random.default_rng(7)
    rows = []
    for j in range(12):
        grid = Grid.of(1e9 + j * 100, 1e9 + j * 100 + rng.uniform(60, 7200), int(rng.integers(1, 5)))
        obs = rng.uniform(0, 60, (grid.n_gpus, grid.m))
        claim = Claim("idle_gpu", "", "warning", rng.uniform(0, 1, (grid.n_gpus, grid.m)))
        rows.append((f"u{j % 3}", f"a{j % 2}", fold(grid, obs, [claim]).totals()))
    fleet = add_totals(t for _, _, t in rows)
    for key in (0, 1):
        groups: dict[str, list[dict[str, float]]] = {}
        for r in rows:
            groups.setdefault(r[key], []).append(r[2])
        summed = add_totals(add_totals(v) for v in groups.values())
        assert all(abs(summed[k] - fleet[k]) <= 1e-6 * max(1.0, fleet[k]) for k in fleet)


def _window(rank: int, pid: int, t0: float, prod: float, spans: dict[str, float] | None = None, *,
            first: int | None = None, steps: int = 0, start: float | None = None, stall: float = 0.0) -> Window:
    return Window(rank=rank, pid=pid, start=t0, end=t0 + 10, steps=steps, first_step=first,
                  last_step=None if first is None else first + steps - 1,
                  max_step=None if first is None else first + steps - 1, productive_s=prod, stall_s=stall,
                  spans=spans or {}, process_start=start)


def test_progress_minutes_account_restarts_and_gaps() -> None:
    # rank 0: 60 s of steps 0..59 (no checkpoint), dies; 30 s later a new process starts over
    # from step 0: the 60 steps of the first process are lost, in the minute they were done
    ws = [_window(0, 1, t, 10.0, first=int(t), steps=10, start=0.0 if t == 0 else None) for t in range(0, 60, 10)]
    ws += [_window(0, 2, t, 10.0, first=int(t - 90), steps=10, start=90.0 if t == 90 else None)
           for t in range(90, 120, 10)]
    grid = Grid.of(0.0, 120.0, 1)
    p = progress_minutes(ws, grid, ["gpu-0"])
    tot = {k: float(v.sum()) for k, v in p.items()}
    assert abs(sum(tot.values()) - 120.0) < 1e-6
    assert abs(tot["idle"] - 30.0) < 1e-6  # no process between the crash and the restart
    assert abs(tot["restart_lost"] - 60.0) < 1e-6
    assert abs(tot[PRODUCTIVE] - 30.0) < 1e-6
    assert abs(float(p["restart_lost"][0, 0]) - 60.0) < 1e-6  # minute 0: the work the crash threw away


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31))
def test_progress_minutes_never_exceed_the_allocation(ranks: int, gpus: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ws = []
    for r in range(ranks):
        t = float(rng.uniform(0, 300))
        for _ in range(int(rng.integers(1, 40))):
            prod = float(rng.uniform(0, 12))
            ws.append(_window(r, 1, t, prod, {"data_wait": float(rng.uniform(0, 3)), "custom": 1.0},
                              stall=float(rng.uniform(0, 2))))
            t += 10 + float(rng.uniform(0, 20))
    grid = Grid.of(60.0, 60.0 + float(rng.uniform(60, 900)), gpus)
    p = progress_minutes(ws, grid, [f"g{i}" for i in range(gpus)])
    led = fold(grid, np.zeros((gpus, grid.m)), progress=p)
    assert abs(sum(led.totals().values()) - led.allocated_s) <= 1e-3 * max(1.0, led.allocated_s)


def test_categories_file_is_consistent() -> None:
    c = categories()
    assert {"init", "data_wait", "checkpoint_save", "checkpoint_load", "restart_lost", "hung", "eval",
            "idle"} <= set(c.progress)
    assert c.names[0] == PRODUCTIVE and c.names[-1] == UNOBSERVED and len(set(c.names)) == len(c.names)
    assert "hw_fault" in c.hardware and "hw_fault" in c.stops_work
    listed = {x["name"]: x for x in c.as_json()}
    assert set(listed) == set(c.names) and all(listed[k]["source"] == "serving" for k in c.serving)


def test_a_serving_replica_decides_like_progress() -> None:
    """analysis/serving/ledger.py's replica-minute categories, given as the application's view:
    productive as served, the serving kinds stay theirs, the hardware cannot take them."""
    grid = Grid.of(0.0, 60.0, 1)
    served = {PRODUCTIVE: np.array([[45.0]]), "slo_missed": np.array([[15.0]])}
    led = fold(grid, np.full((1, 1), 60.0), [Claim("throttled", "", "warning", np.full((1, 1), 0.5))],
               serving=served)
    assert led.totals() == {PRODUCTIVE: 45.0, "slo_missed": 15.0} and led.flag_s == [0.0]
    with pytest.raises(ValueError, match="nope"):  # an unknown category in [flags]
        parse_categories("productive = \"productive\"\nunobserved = \"unobserved\"\n[flags]\nx = [\"nope\"]\n")


def test_a_stopping_fault_takes_the_serving_causes_on_the_gpus_it_stopped() -> None:
    """2 GPUs x 2 minutes of a replica: GPU 0 faults (critical hw_fault) from minute 1. There
    the requests served within the SLO stay productive; the idle and missed seconds are the
    fault's. GPU 1 and minute 0 stay the serving view's; telemetry-only seconds (GPU 1, minute 1
    has no serving minute) go by the claims."""
    grid = Grid.of(0.0, 120.0, 2)
    observed = np.full((2, 2), 60.0)
    stopped = np.zeros((2, 2), dtype=bool)
    stopped[0, 1] = True
    served = {PRODUCTIVE: np.array([[30.0, 20.0], [50.0, 0.0]]),
              "slo_missed": np.array([[30.0, 10.0], [10.0, 0.0]]),
              "idle_replica": np.array([[0.0, 30.0], [0.0, 0.0]])}
    claims = [Claim("hw_fault", "GPU-0", "critical", None, stopped, "gpu"),
              Claim("throttled", "", "warning", np.full((2, 2), 0.5))]
    led = fold(grid, observed, claims, idle=np.zeros((2, 2), dtype=bool), serving=served)
    t = led.totals()
    assert t["hw_fault"] == 40.0 and led.flag_s[0] == 40.0  # GPU 0 minute 1: 10 missed + 30 idle
    assert t["slo_missed"] == 40.0 and "idle_replica" not in t
    assert t["throttled"] == 30.0 and led.flag_s[1] == 30.0  # half of GPU 1's telemetry-only minute
    assert t[PRODUCTIVE] == 30.0 + 20.0 + 50.0 + 30.0
    assert abs(sum(t.values()) - led.allocated_s) < 1e-9


def test_serving_minutes_land_on_the_gpus_they_name() -> None:
    grid = Grid.of(600.0, 780.0, 3)
    uuids = ["g0", "g1", "g2"]
    cells = [ServingCell(600, ("g1", "g2"), {PRODUCTIVE: 90.0, "slo_missed": 30.0, UNOBSERVED: 5.0}),
             ServingCell(660, (), {"idle_replica": 180.0}),  # names no GPU: spread over the job's
             ServingCell(660, ("gX",), {PRODUCTIVE: 30.0}),  # a GPU the job does not hold: spread too
             ServingCell(9_000, ("g0",), {PRODUCTIVE: 60.0})]  # outside the allocation
    out = serving_minutes_grid(cells, grid, uuids)
    assert set(out) == {PRODUCTIVE, "slo_missed", "idle_replica"}
    assert out[PRODUCTIVE][:, 0].tolist() == [0.0, 45.0, 45.0] and out["slo_missed"][:, 0].tolist() == [0, 15, 15]
    assert out["idle_replica"][:, 1].tolist() == [60.0] * 3 and out[PRODUCTIVE][:, 1].tolist() == [10.0] * 3
    led = fold(grid, np.zeros((3, 3)), serving=out)
    assert abs(sum(led.totals().values()) - led.allocated_s) < 1e-9  # 30 s over the minute: scaled down


def test_the_serving_causes_are_in_the_categories_file() -> None:
    c = categories()
    assert c.serving == ("slo_missed", "idle_replica", "overprovisioned_deployment")
    assert {k: c.flag_categories[k] for k in c.serving} == {k: (k,) for k in c.serving}
    assert c.flag_categories["batch_too_small"] == () and c.flag_categories["engine_hw_disagree"] == ()
    with pytest.raises(ValueError, match="throttled"):  # a hardware kind among the serving causes
        parse_categories("productive = \"productive\"\nunobserved = \"unobserved\"\n"
                         "[serving]\ncauses = [\"throttled\"]\n")
