"""The issue's must-show: a fleet whose history carries only ``gpu_util`` and ``fb_used_bytes``
(a public trace of inference pods, ~60 s samples), imported as NDJSON through ``gpufleet
import``'s importer and analyzed by the runner, on SQLite and PostgreSQL: busy GPUs are not
flagged; idle ones are, with confidence below high and the coverage note."""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import select

from gpufleet.analysis.runner import run_analysis
from gpufleet.storage.models import Flag, Job, JobReport

from .conftest import T0

# pod -> duty cycle over time (request-driven: it varies)
PODS = {"infer-busy": lambda k: 0.85 + 0.1 * math.sin(k / 9), "infer-light": lambda k: 0.25 + 0.1 * math.sin(k / 5),
        "infer-bursty": lambda k: 1.0 if k % 3 == 0 else 0.05, "infer-idle": lambda k: 0.0}


def test_util_and_memory_only_history(engine: Any, tmp_path: Any) -> None:
    from gpufleet.collector import ndjson

    path = tmp_path / "pods.ndjson"
    with path.open("w") as out:
        for i, (pod, duty) in enumerate(PODS.items()):
            for k in range(150):  # 2.5 h at ~60 s
                row = {"ts": T0 + 60.0 * k + 0.37 * i, "node": f"trace-{i}", "gpu": 0, "job": f"prod/{pod}",
                       "cluster": "trace", "gpu_util": round(max(0.0, min(1.0, duty(k))), 3),
                       "fb_used_bytes": 21e9 if pod != "infer-idle" else 2e9}
                out.write(json.dumps(row) + "\n")
    res = ndjson.import_file(engine, str(path), now=T0 + 4 * 3600)
    assert res.stored == 4 * 150
    assert run_analysis(engine, now=T0 + 4 * 3600).errors == []
    with engine.connect() as c:
        flags = [(j, k, dict(ev)) for j, k, ev in c.execute(
            select(Job.job_id, Flag.kind, Flag.evidence).join(Flag, Flag.job_pk == Job.id))]
        q = select(Job.job_id, JobReport.report).join(JobReport, JobReport.job_pk == Job.id)
        reports = dict(c.execute(q).all())
    assert [(j, k) for j, k, _ in flags] == [("prod/infer-idle", "idle_gpu")]
    ev = flags[0][2]
    assert ev["confidence"] in ("medium", "low") and ev["judged_from"][0] == "gpu_util"
    assert ev["sm_active_max"] is None  # not measured: null, never a reading of 0
    for job_id, rep in reports.items():
        assert "profiling metrics missing on 1/1 GPUs: judged from gpu_util" in " ".join(rep["notes"]), job_id
    busy = reports["prod/infer-busy"]
    assert busy["goodput_score"] > 0.8 and busy["wasted_gpu_hours_total"] == 0.0
    idle = reports["prod/infer-idle"]
    assert idle["wasted_gpu_hours_total"] <= idle["allocated_gpu_hours"]
