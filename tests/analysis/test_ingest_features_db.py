"""Through the real write path and database (SQLite and PostgreSQL): the states the upsert
merged equal the pure fold + merge of the same batches, and the analysis built from them is
the same whether one warm cache followed the job pass by pass (a late batch included) or a
cold worker read it once: job_reports.report and flags bit for bit."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from sqlalchemy import Engine, select

from gpufleet.analysis.runner import run_analysis
from gpufleet.analysis.state import StateCache
from gpufleet.collector.columns import prepare
from gpufleet.protocol import AgentInfo, Allocation, Batch, GpuInfo, JobInfo
from gpufleet.storage.minute_features import READ_COLUMNS, STATE, fold, merge_folded, read_hist, read_states
from gpufleet.storage.models import Flag, JobReport
from gpufleet.storage.writes import write_batches

T0 = 1_790_000_000.0
G = 4


def _batch(seq: int, t_from: float, t_to: float) -> Batch:
    rng = np.random.default_rng(seq)
    steps = np.arange(t_from, t_to, 1.0)
    ts = np.repeat(steps, G)
    n = len(ts)
    # GPU 3 stalls on input (busy/idle alternation) after minute 8; the others are steady
    gi = np.tile(np.arange(G), len(steps))
    sm = np.clip(0.6 + rng.normal(0, 0.05, n), 0, 1)
    stall = (gi == 3) & (ts > T0 + 480)
    sm[stall] = np.where((ts[stall] % 4) < 2, 0.7, 0.0)
    cols: dict[str, list[float | int | str | None]] = {
        "ts": ts.tolist(), "gpu": [f"GPU-f-{i}" for i in gi.tolist()], "job": ["job-f"] * n,
        "sm_active": sm.tolist(), "sm_occupancy": np.clip(sm * 0.5, 0, 1).tolist(),
        "tensor_active": np.clip(sm * 0.4, 0, 1).tolist(), "dram_active": np.clip(sm * 0.3, 0, 1).tolist(),
        "gpu_util": np.where(sm > 0.05, 1.0, 0.0).tolist(), "power_w": (100 + 500 * sm).tolist(),
        "sm_clock_mhz": [1980.0] * n, "clock_event_reasons": [0] * n, "fb_used_bytes": [4e10] * n,
        "xid_last": [0] * n}
    return Batch(agent=AgentInfo(boot_id="boot-f", seq=seq, node="node-f"),
                 gpus=[GpuInfo(index=i, uuid=f"GPU-f-{i}", model="NVIDIA H100 80GB HBM3") for i in range(G)],
                 jobs=[JobInfo(job_id="job-f", start_ts=T0)],
                 allocations=[Allocation(gpu_uuid=f"GPU-f-{i}", job_id="job-f", since=T0) for i in range(G)],
                 samples=cols)


def _write(engine: Engine, seqs: list[int]) -> None:
    for seq in seqs:
        with engine.begin() as c:
            write_batches(c, [prepare(_batch(seq, T0 + 10 * seq, T0 + 10 * seq + 10))], now=T0 + 10 * seq + 10)


def _reports(engine: Engine) -> tuple[str, list[tuple[object, ...]]]:
    with engine.connect() as c:
        rep = c.execute(select(JobReport.report)).scalar_one()
        flags = c.execute(select(Flag.kind, Flag.scope, Flag.open, Flag.start_ts, Flag.end_ts, Flag.wasted_gpu_hours,
                                 Flag.evidence).order_by(Flag.kind, Flag.scope)).all()
    return json.dumps(rep, sort_keys=True), [tuple(json.dumps(v, sort_keys=True) for v in f) for f in flags]


def test_warm_passes_and_a_cold_read_give_identical_reports(engine: Engine) -> None:
    # 20 minutes in 10 s batches; window 75 (minute 12-13) arrives late, after window 90.
    order = [s for s in range(120) if s != 75]
    order.insert(order.index(90) + 1, 75)
    warm = StateCache()
    now = T0
    for k in range(0, len(order), 15):  # an analysis pass every 150 s of batches
        _write(engine, order[k:k + 15])
        now = T0 + 10 * max(order[:k + 15]) + 10
        s = run_analysis(engine, now=now, cache=warm)
        assert not s.errors
    warm_rep, warm_flags = _reports(engine)
    assert '"gpus"' in warm_rep or len(warm_rep) > 200  # a real report to compare
    with engine.connect() as c:
        job_pk = c.exec_driver_sql("SELECT id FROM jobs").scalar_one()
    cold = run_analysis(engine, now=now, cache=StateCache(), job_pks=[job_pk])  # a new worker's first read
    assert not cold.errors and cold.jobs_analyzed == 1
    assert cold.reports_written == 0 and cold.flags_updated == 0 and cold.flags_opened == 0
    assert _reports(engine) == (warm_rep, warm_flags)
    again = run_analysis(engine, now=now, cache=warm, job_pks=[job_pk])  # nothing new: the warm cache reads nothing
    assert again.rows_read == 0 and again.reports_written == 0


def test_the_upsert_merges_as_the_pure_merge(engine: Engine) -> None:
    seqs = [0, 1, 2, 5, 4, 3, 8, 7, 6, 9]  # minute-sized runs out of order
    _write(engine, seqs)
    with engine.connect() as c:
        job_pk = c.exec_driver_sql("SELECT id FROM jobs").scalar_one()
        got = read_states(c, job_pk, -1e18, 1e18)
        hist = read_hist(c, job_pk)
        gpu_pk = {u: pk for pk, u in c.exec_driver_sql("SELECT id, uuid FROM gpus").all()}
    model = None
    for seq in seqs:
        p = prepare(_batch(seq, T0 + 10 * seq, T0 + 10 * seq + 10))
        from gpufleet.storage.fields import FIELD_INDEX, FIELDS

        cols = {}
        for name, j in FIELD_INDEX.items():
            v = p.vals[j]
            cols[name] = v.astype(np.float32).astype(np.float64) if FIELDS[j].dtype == "f4" else v
        f = fold(p.ts, np.array([gpu_pk[u] for u in p.gpu]), np.full(p.n, job_pk), cols)
        model = f if model is None else merge_folded(model, f)
    assert model is not None
    want = np.column_stack([{"bucket": model.bucket, "gpu_pk": model.gpu_pk, **model.cols}[c] for c in READ_COLUMNS])
    order = np.lexsort((want[:, 1], want[:, 0]))
    np.testing.assert_array_equal(got, want[order])
    assert set(STATE) <= set(READ_COLUMNS)
    # histograms: element-wise sums per job-hour, and one fold counted per batch
    assert [(h.hour, h.folds) for h in hist] == [(int(model.hist_hour[0]), len(seqs))]
    np.testing.assert_array_equal(hist[0].h, model.hist[0])


def test_a_repeated_window_under_another_batch_key_folds_only_its_new_samples(engine: Engine) -> None:
    first = _batch(0, T0, T0 + 10)
    # an agent restarted (new boot id) and re-sent 5 s it had already shipped, plus 5 new ones
    again = _batch(1, T0 + 5, T0 + 15)
    again.agent = AgentInfo(boot_id="boot-g", seq=0, node="node-f")
    with engine.begin() as c:
        write_batches(c, [prepare(first)], now=T0 + 10)
    with engine.begin() as c:
        write_batches(c, [prepare(again)], now=T0 + 15)
    with engine.begin() as c:  # the same batch key again: a duplicate, acknowledged, not folded
        write_batches(c, [prepare(again)], now=T0 + 16)
    with engine.connect() as c:
        job_pk = c.exec_driver_sql("SELECT id FROM jobs").scalar_one()
        got = read_states(c, job_pk, -1e18, 1e18)
        hist = read_hist(c, job_pk)
        gpu_pk = {u: pk for pk, u in c.exec_driver_sql("SELECT id, uuid FROM gpus").all()}
    from gpufleet.storage.fields import FIELD_INDEX, FIELDS

    def folded(b: Batch, since: float) -> Any:
        p = prepare(b)
        keep = p.ts >= since
        cols = {name: (p.vals[j].astype(np.float32).astype(np.float64) if FIELDS[j].dtype == "f4" else p.vals[j])[keep]
                for name, j in FIELD_INDEX.items()}
        return fold(p.ts[keep], np.array([gpu_pk[u] for u in p.gpu])[keep], np.full(int(keep.sum()), job_pk), cols)

    model = merge_folded(folded(first, T0), folded(again, T0 + 10))
    want = np.column_stack([{"bucket": model.bucket, "gpu_pk": model.gpu_pk, **model.cols}[c] for c in READ_COLUMNS])
    np.testing.assert_array_equal(got, want[np.lexsort((want[:, 1], want[:, 0]))])
    assert int(got[:, READ_COLUMNS.index("n")].sum()) == 15 * G  # 15 s of 4 GPUs, none twice
    assert sum(h.folds for h in hist) == 2  # the duplicate batch folded nothing
