"""What a real H200 told the agent, replayed through a real collector into SQLite and
PostgreSQL, checked against what the GPU was made to do and what nvidia-smi read beside it.

The capture (tests/agent/real_h200/, README there) came from the agent on real hardware; the
references (phases.jsonl from torch's own timing, smi.csv from the NVIDIA driver) were not made
by gpufleet's code, so these checks could fail on a real regression in the NVML path's meaning
(a ratio scaled wrong, memory counted with the driver's reservation, NVLink read as idle) or in
what the collector keeps of it.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from gpufleet.storage.raw_read import raw_records

from .conftest import PY, REPO

HERE = Path(__file__).parent / "real_h200"
H200_PEAK_DRAM_BYTES_S = 4.8e12  # NVIDIA's H200 datasheet: 4.8 TB/s HBM3e
MIB = 2**20


def _replay(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, str(REPO / "bench/agent/replay_spool.py"), str(HERE / "spool.tgz"), "--collector", url,
                           "--deadline", "60"], capture_output=True, text=True, timeout=120, cwd=REPO)


def _smi() -> dict[int, dict[str, str]]:
    """nvidia-smi's rows by whole UTC second."""
    out = {}
    with open(HERE / "smi.csv") as f:
        for row in csv.DictReader(f, skipinitialspace=True):
            t = datetime.strptime(row["timestamp"], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()
            out[int(t)] = row
    return out


def _phases() -> dict[str, dict[str, Any]]:
    lines = (HERE / "phases.jsonl").read_text().splitlines()
    return {p["phase"]: p for p in map(json.loads, lines)}


def _phase_rows(rows: list[dict[str, Any]], name: str, settle_s: float = 2.0) -> list[dict[str, Any]]:
    """Rows well inside a phase: a GPM ratio covers the second before its sample."""
    p = _phases()[name]
    got = [r for r in rows if p["start"] + settle_s <= r["ts"] <= p["end"] - 1.0]
    assert len(got) >= 8, (name, len(got))
    return got


def _power_limit_w() -> float:
    xml = (HERE / "nvidia-smi-q.xml").read_text()
    m = re.search(r"<current_power_limit>([\d.]+) W</current_power_limit>", xml)
    assert m, "the driver's XML names the enforced limit"
    return float(m.group(1))


def test_real_h200_minute_is_stored_as_the_gpu_and_nvidia_smi_saw_it(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url)
    first = _replay(srv.url)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "8 batches (85 rows): 8 delivered, 0 refused, 0 left" in first.stdout
    again = _replay(srv.url)  # the same batches twice: each stored once
    assert again.returncode == 0, again.stdout + again.stderr

    eng = sa.create_engine(database_url)
    try:
        with eng.connect() as c:
            rows = sorted(raw_records(c), key=lambda r: r["ts"])
    finally:
        eng.dispose()
    assert len(rows) == 85 and len({r["ts"] for r in rows}) == 85, "nothing lost, nothing doubled"

    # The GPU has no NVLink (every link NOT_SUPPORTED): unknown, never 0 B/s.
    assert all(r["nvlink_tx_bytes_s"] is None and r["nvlink_rx_bytes_s"] is None for r in rows)

    # Power, SM clock and memory against nvidia-smi, second by second.
    smi = _smi()
    pairs = [(r, smi[int(r["ts"])]) for r in rows if int(r["ts"]) in smi]
    assert len(pairs) >= 75
    power_err = [abs(r["power_w"] - float(s["power.draw [W]"])) / float(s["power.draw [W]"]) for r, s in pairs]
    assert statistics.median(power_err) < 0.01
    assert sum(e < 0.05 for e in power_err) >= 0.85 * len(pairs), "only phase edges may differ"
    fb_same = sum(abs(r["fb_used_bytes"] / MIB - float(s["memory.used [MiB]"])) < 1.5 for r, s in pairs)
    assert fb_same >= 0.9 * len(pairs), "memory counted as nvidia-smi counts it (no driver reservation)"
    load_start = _phases()["idle"]["start"]  # torch's context opened a few seconds before
    before = [r for r, s in pairs if float(s["memory.used [MiB]"]) == 0 and r["ts"] < load_start - 5]
    assert len(before) >= 3 and all(r["fb_used_bytes"] == 0 for r in before), "an idle H200 holds 0 bytes"

    # What the GPU was made to do (torch's own timing), read back from the profiling ratios.
    mm = _phase_rows(rows, "matmul_bf16")
    assert statistics.median(r["tensor_active"] for r in mm) > 0.85
    assert statistics.median(r["sm_active"] for r in mm) > 0.9
    assert statistics.median(r["dram_active"] for r in mm) < 0.3
    # The products ran into the power limit: the driver's own cap and reason bit agree.
    limit = _power_limit_w()
    assert statistics.median(r["power_w"] for r in mm) > 0.95 * limit
    assert all(int(r["clock_event_reasons"]) & 0x4 for r in mm), "SW power cap (0x4) set throughout"

    cp = _phase_rows(rows, "copy_d2d")
    measured = _phases()["copy_d2d"]["dram_bytes_s"] / H200_PEAK_DRAM_BYTES_S  # 4.25 TB/s of 4.8: 0.885
    assert abs(statistics.median(r["dram_active"] for r in cp) - measured) < 0.05
    assert statistics.median(r["tensor_active"] for r in cp) < 0.02

    for name in ("idle", "idle_tail"):
        assert all(r["sm_active"] == 0 and r["tensor_active"] == 0 for r in _phase_rows(rows, name, 1.0))

    # The job the process attributor made of the torch process, as the API serves it.
    (job_pk,) = {r["job_pk"] for r in rows if r["job_pk"] is not None}
    listed = httpx.get(f"{srv.url}/api/v1/jobs", params={"limit": 10}, timeout=30).json()
    (job,) = listed["data"]
    assert job["source"] == "process" and job["user"] == "root" and job["n_gpus"] == 1
    detail = httpx.get(f"{srv.url}/api/v1/jobs/{job['job_id']}", timeout=30)
    assert detail.status_code == 200, detail.text
    body = detail.json()
    assert "gpu_load_phases.py" in body["labels"]["cmdline"]
    assert body["gpus"][0]["model"] == "NVIDIA H200"
    # The job's live means (from the minute rollups) are the means of its stored seconds.
    mine = [r for r in rows if r["job_pk"] == job_pk]
    for name in ("tensor_active", "dram_active", "power_w"):
        raw_mean = statistics.fmean(r[name] for r in mine if r[name] is not None)
        assert abs(body["summary"][f"{name}_mean"] - raw_mean) <= 0.005 * max(1.0, raw_mean), name
