"""A real training job on a real H200, as the agent relayed it (tests/progress/real_h200_training/),
replayed through a live collector on SQLite and PostgreSQL: gpufleet's goodput must match what
the job measured about itself (truth.jsonl: its own wall clock per span and step, and the FLOPs
PyTorch's FlopCounterMode counted in one real step). Neither reference is computed by
gpufleet's code, so a wrong fold, a lost window or a mis-scaled MFU fails here.
"""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from gpufleet.catalog import CATALOG
from gpufleet.storage.raw_read import raw_records

from .harness import PY, read_truth

HERE = Path(__file__).parent / "real_h200_training"
REPO = Path(__file__).resolve().parents[2]


def _replay(url: str) -> None:
    r = subprocess.run([PY, str(REPO / "bench/agent/replay_spool.py"), str(HERE / "spool.tgz"), "--collector", url,
                        "--deadline", "60"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "10 batches (108 rows): 10 delivered, 0 refused, 0 left" in r.stdout


def _truth() -> dict[str, Any]:
    rows = read_truth(HERE / "truth.jsonl")
    steps = [r for r in rows if r["ev"] == "step"]
    spans: dict[str, float] = {}
    for r in rows:
        if r["ev"] == "span":
            spans[r["kind"]] = spans.get(r["kind"], 0.0) + r["t1"] - r["t0"]
    (model,) = [r for r in rows if r["ev"] == "model"]
    productive = sum(r["t1"] - r["t0"] for r in steps)
    return {"steps": steps, "spans": spans, "model": model, "productive": productive,
            "start": rows[0]["t"], "exit": rows[-1]["t"], "durations": sorted(r["t1"] - r["t0"] for r in steps)}


def test_real_h200_training_goodput_matches_the_jobs_own_clock(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url)
    _replay(srv.url)
    _replay(srv.url)  # twice: every window and row stored once
    truth = _truth()

    listed = httpx.get(f"{srv.url}/api/v1/jobs", timeout=30).json()["data"]
    (job,) = listed
    assert job["source"] == "process", "the progress stream joined the job the GPU's process made"
    got = httpx.get(f"{srv.url}/api/v1/jobs/{job['job_id']}/progress", timeout=30)
    assert got.status_code == 200, got.text
    g = got.json()["goodput"]

    # Steps: all 904 (step 1 ran inside the compile span), none doubled by the second replay.
    assert g["steps"] == len(truth["steps"]) + 1 and g["restarts"] == 0 and g["lost_steps"] == 0
    # Time: allocated is the process-attributed job's span (NVML saw the pid from CUDA init
    # until the process ended), within 2 s of the process's own life.
    lifetime = truth["exit"] - truth["start"]
    assert abs(g["allocated_s"] - lifetime) < 2.0
    assert abs(g["productive_s"] - truth["productive"]) < 0.01 * truth["productive"]
    for cause in ("init", "compile", "checkpoint_save", "data_wait"):
        assert abs(g["badput_s"][cause] - truth["spans"][cause]) < 0.01 * g["allocated_s"], cause
    assert g["badput_s"]["hung"] == 0 and g["badput_s"]["restart_lost"] == 0
    assert abs(g["ettr"] - truth["productive"] / lifetime) < 0.02

    # Step time from the merged histograms: within 5% (docs/progress.md).
    p50 = truth["durations"][len(truth["durations"]) // 2]
    assert abs(g["step_time_p50_s"] - p50) < 0.05 * p50

    # MFU: the job's counted FLOPs over productive time against the catalog's H200 peak.
    model = CATALOG.gpu_model("NVIDIA H200")
    assert model is not None
    peak = model.peak_tensor_tflops  # 989: NVIDIA's dense bf16 figure
    flops = truth["model"]["flops_per_step"] * len(truth["steps"])
    mfu = flops / truth["productive"] / (peak * 1e12)
    assert abs(g["mfu"] - mfu) < 0.01, (g["mfu"], mfu)
    assert abs(g["achieved_tflops"] - flops / truth["productive"] / 1e12) < 0.01 * g["achieved_tflops"]

    # The two 10-11 s checkpoints to local disk were 22% of the run: flagged, with the evidence.
    (f,) = [f for f in g["findings"] if f["kind"] == "checkpoint_overhead"]
    assert f["evidence"]["checkpoints"] == 2
    assert abs(f["evidence"]["checkpoint_s"] - truth["spans"]["checkpoint_save"]) < 0.5

    # The hardware saw the same job: Tensor Cores busy in training seconds, idle while saving.
    eng = sa.create_engine(database_url)
    try:
        with eng.connect() as c:
            rows = raw_records(c)
    finally:
        eng.dispose()
    ck = [(r["t0"], r["t1"]) for r in read_truth(HERE / "truth.jsonl") if r.get("kind") == "checkpoint_save"]
    first, last = truth["steps"][0]["t0"], truth["steps"][-1]["t1"]
    training = [r for r in rows
                if first + 2 <= r["ts"] <= last - 1 and not any(a - 1 <= r["ts"] <= b + 2 for a, b in ck)]
    saving = [r for r in rows if any(a + 2 <= r["ts"] <= b for a, b in ck)]
    assert len(training) >= 30 and len(saving) >= 10
    assert statistics.median(r["tensor_active"] for r in training) > 0.3
    assert statistics.median(r["tensor_active"] for r in saving) == 0.0
    assert statistics.median(r["gpu_util"] for r in saving) < 0.1
