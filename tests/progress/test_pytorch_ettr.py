"""Must-show: a real PyTorch CPU training script using the client, under a running gpufleet
(live app + agent + relay, real HTTP), checkpointing every N steps, SIGKILLed once mid-run and
restarted from its last checkpoint: ETTR and every badput cause within 3% (of the allocated
time) of the ground truth the script measures about itself."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.progress_fold import EXPIRE_S

from .harness import PY, TRAIN, NodeAgent, job, read_truth, stored_steps, wait_until

pytest.importorskip("torch")
TOL = 0.03


def _settled(node: NodeAgent, url: str, job_id: str) -> bool:
    """Nothing more is on its way: the stored count holds across two of the agent's flushes
    (its batch seq moves on at each) and the spool is empty. Counted in flushes, not seconds: a
    fixed sleep "longer than the flush interval" was not, on a loaded box."""
    a, seq = stored_steps(url, job_id), node.agent.seq
    wait_until(lambda: node.agent.seq >= seq + 2, 300, "two agent flushes")
    return len(node.agent.spool) == 0 and stored_steps(url, job_id) == a


def ground_truth(runs: list[list[dict[str, Any]]], kill_t: float) -> dict[str, float]:
    r1, r2 = runs
    t_alloc0 = r1[0]["t"]
    t_alloc1 = next(x["t"] for x in r2 if x["ev"] == "exit")
    allocated = t_alloc1 - t_alloc0
    spans: dict[str, float] = {}
    for x in r1 + r2:
        if x["ev"] == "span":
            spans[x["kind"]] = spans.get(x["kind"], 0.0) + x["t1"] - x["t0"]
    saved = [x["step"] for x in r1 if x["ev"] == "span" and x["kind"] == "checkpoint_save"]
    ckpt = max(saved) if saved else 0
    steps1 = [x for x in r1 if x["ev"] == "step"]
    steps2 = [x for x in r2 if x["ev"] == "step"]
    productive = sum(s["t1"] - s["t0"] for s in steps1 if s["step"] <= ckpt) + sum(s["t1"] - s["t0"] for s in steps2)
    last_record = max(x.get("t1", x.get("t", 0.0)) for x in r1)
    lost = sum(s["t1"] - s["t0"] for s in steps1 if s["step"] > ckpt) + max(0.0, kill_t - last_record)
    idle = r2[0]["t"] - kill_t
    truth = {"productive": productive, "restart_lost": lost, "idle": idle, **spans}
    truth["allocated"] = allocated
    truth["lost_steps"] = max(s["step"] for s in steps1) - ckpt
    # Steps run 1 made since it last shipped: at most these can die in the client's buffer with
    # the SIGKILL. It ships every 0.2 s, later when a loaded machine starves its thread, so the
    # bound is the steps of its last 10 s (a loose bound; the exact count is checked below).
    end1 = max(s["t1"] for s in steps1)
    truth["unshipped_max_steps"] = sum(1 for s in steps1 if s["t1"] > end1 - 10.0)
    return truth


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the waits' bounds below only catch a hang
def test_killed_and_resumed_training_matches_its_own_ground_truth(sqlite_url: str, live_server,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path) -> None:
    srv = live_server(sqlite_url)
    # The relay's own default expiry (10 s: five heartbeats): the harness's 2 s is one heartbeat,
    # and a loaded box that starves the client's thread for 2 s (importing torch) cut the init
    # span's stream in two, losing its start.
    node = NodeAgent(srv.url, tmp_path, expire_s=EXPIRE_S)
    job_id = "torch-ettr"
    args = [PY, str(TRAIN), "--ckpt-dir", str(tmp_path / "ck"), "--steps", "320", "--ckpt-every", "60",
            "--eval-every", "100", "--ckpt-extra-s", "0.4", "--data-wait-s", "0.006"]
    truth1, truth2 = tmp_path / "truth1.jsonl", tmp_path / "truth2.jsonl"
    (tmp_path / "ck").mkdir()
    try:
        p1 = subprocess.Popen([*args, "--truth", str(truth1)], env=node.env(job_id))
        # Kill it between two checkpoints (after step 150; the last checkpoint is at 120).
        wait_until(lambda: any(x.get("step") == 150 and x["ev"] == "step" for x in read_truth(truth1)), 600,
                   "run 1 to reach step 150")
        p1.send_signal(signal.SIGKILL)
        kill_t = time.time()
        p1.wait(10)
        time.sleep(2.0)  # the scheduler's requeue: allocated, nothing running
        p2 = subprocess.run([*args, "--truth", str(truth2)], env=node.env(job_id), timeout=900)
        assert p2.returncode == 0
        runs = [read_truth(truth1), read_truth(truth2)]
        calls = sum(1 for r in runs for x in r if x["ev"] == "step")
        # The steps run 1 had not shipped died with it (its buffer); run 2 exited cleanly.
        lost_max = ground_truth(runs, kill_t)["unshipped_max_steps"]
        wait_until(lambda: calls - lost_max <= stored_steps(srv.url, job_id) <= calls, 300, f"~{calls} steps stored")
        wait_until(lambda: _settled(node, srv.url, job_id), 600, "nothing more on its way")
        g = job(srv.url, job_id)["goodput"]
        assert g["restarts"] == 1, g
        g = job(srv.url, job_id)["goodput"]
    finally:
        node.close()
    t = ground_truth(runs, kill_t)
    a = t["allocated"]
    assert g["source"] == "progress" and g["restarts"] == 1
    assert g["allocated_s"] == pytest.approx(a, abs=TOL * a)
    assert g["ettr"] == pytest.approx(t["productive"] / a, abs=TOL), (g, t)
    bad = g["badput_s"]
    for cause in ("init", "checkpoint_save", "checkpoint_load", "data_wait", "eval", "restart_lost", "idle"):
        assert bad.get(cause, 0.0) / a == pytest.approx(t.get(cause, 0.0) / a, abs=TOL), (cause, bad, t)
    assert bad["restart_lost"] > 0 and bad["checkpoint_load"] > 0 and bad["idle"] > 1.0
    # Redone steps: from the checkpoint (120) to the last step run 1 reported before the kill
    # (its last calls died in its buffer, so a few fewer than it made: no more than one second's).
    assert t["lost_steps"] - t["unshipped_max_steps"] <= g["lost_steps"] <= t["lost_steps"], (g, t)
    assert g["lost_steps"] > 0, (g, t)
    assert g["tokens_per_s"] and g["tokens_per_s"] > 0
    assert g["mfu"] is None  # no GPU model to compare with: unknown, not zero
