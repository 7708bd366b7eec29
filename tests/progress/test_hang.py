"""Must-show: a rank blocked in a collective is flagged ``hung``; a long checkpoint is not.

Real processes: ``torchrun`` on gloo, two ranks, one progress stream each; rank 1 blocks in a
barrier its peer never reaches (rank 0 then waits in its all_reduce), while another job sits
inside a long ``checkpoint_save``. Time is compressed honestly by scaling the thresholds (a
hang after 10 s without a step instead of 60 s); the default scale is shown on an explicit
clock: a hang is flagged within 5 minutes and a 10-minute checkpoint never is."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.analysis.progress.detect import ProgressThresholds, detect_hung
from gpufleet.analysis.progress.flags import run_progress_pass
from gpufleet.analysis.progress.model import Window
from gpufleet.progress_fold import Folder
from gpufleet.storage.db import make_engine

from .harness import PY, REPO, TRAIN, NodeAgent, wait_until

torch = pytest.importorskip("torch")
SCALED = ProgressThresholds.load(hang_min_s=10.0, span_hang_s=300.0, fresh_s=30.0)


def _progress(url: str, job: str) -> dict[str, Any] | None:
    r = httpx.get(f"{url}/api/v1/jobs/{job}/progress", timeout=30)
    return r.json() if r.status_code == 200 else None


def _stuck_for(url: str, job: str, ranks: int) -> float:
    p = _progress(url, job)
    if p is None or len(p["ranks"]) < ranks:
        return 0.0
    return min((r["since_step_s"][-1] or 0.0) if r["alive"][-1] else 0.0 for r in p["ranks"])


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's children lists), found before anything is killed."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL a process group and every descendant: torchrun's ranks may sit in their own
    session, and a rank blocked in a collective outlives its killed launcher for ever (one
    leaked pair was still running after a whole CI run)."""
    kids = _descendants(pid)
    for target in (pid, *kids):
        try:
            if target == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_rank_blocked_in_a_collective_is_hung_and_a_long_checkpoint_is_not(sqlite_url: str, live_server,  # type: ignore[no-untyped-def]
                                                                          tmp_path: Path) -> None:
    srv = live_server(sqlite_url)
    node = NodeAgent(srv.url, tmp_path, expire_s=5.0)
    torchrun = str(Path(PY).parent / "torchrun")
    env = node.env("gloo-hang", OMP_NUM_THREADS="1")
    hang = subprocess.Popen([torchrun, "--standalone", "--nproc_per_node", "2", str(TRAIN), "--ckpt-dir",
                             str(tmp_path / "ck1"), "--steps", "100000", "--ckpt-every", "100000", "--hang-at", "40",
                             "--batch", "64", "--hidden", "128"], env=env, cwd=REPO, start_new_session=True)
    ckpt = subprocess.Popen([PY, str(TRAIN), "--ckpt-dir", str(tmp_path / "ck2"), "--steps", "100000",
                             "--ckpt-every", "30", "--ckpt-extra-s", "600", "--batch", "64", "--hidden", "128"],
                            env=node.env("long-ckpt"), cwd=REPO, start_new_session=True)
    (tmp_path / "ck1").mkdir()
    (tmp_path / "ck2").mkdir()
    engine = make_engine(sqlite_url)
    try:
        wait_until(lambda: _stuck_for(srv.url, "gloo-hang", 2) > 14.0, 150, "both ranks stuck for 14 s, stored")
        wait_until(lambda: (_progress(srv.url, "long-ckpt") or {"ranks": [{"open_span": [None]}]})
                   ["ranks"][0]["open_span"][-1] == "checkpoint_save", 60, "the checkpoint to be under way")
        p = run_progress_pass(engine, time.time(), SCALED)
        assert p.errors == []
        flags = httpx.get(srv.url + "/api/v1/jobs/gloo-hang", timeout=30).json()["flags"]
        hung = [f for f in flags if f["kind"] == "hung" and f["scope"] == "progress"]
        assert len(hung) == 1 and hung[0]["open"], flags
        ev = hung[0]["evidence"]
        assert sorted(ev["stuck_ranks"]) == [0, 1] and ev["confidence"] == "high" and ev["since_step_s"] > 10
        long_ckpt = httpx.get(srv.url + "/api/v1/jobs/long-ckpt", timeout=30).json()
        assert not [f for f in long_ckpt["flags"] if f["kind"] == "hung"], long_ckpt["flags"]
        assert long_ckpt["goodput"]["badput_s"].get("hung", 0.0) == 0.0
    finally:
        for proc in (hang, ckpt):
            _kill_tree(proc.pid)
            proc.wait(30)
        node.close()
        engine.dispose()


def _timeline(kind: str) -> list[Window]:
    """Real-scale windows through the fold on an explicit clock: 1 s steps for 5 minutes, then
    either a collective that never returns or a 10-minute checkpoint; heartbeats every 2 s."""
    wall0, mono0 = 1_800_000_000.0, 1000.0
    f = Folder()

    def send(evs: list[list[Any]], t: float) -> None:
        f.feed({"pid": 7, "wall0": wall0, "mono0": mono0, "id": {"job": "j", "rank": 0, "host": "h"}, "now": t,
                "ev": evs}, t)

    for i in range(1, 301):
        send([["s", mono0 + i, i]], mono0 + i)
    if kind == "checkpoint":
        send([["b", mono0 + 300.5, "checkpoint_save"]], mono0 + 300.5)
    out: list[Window] = []
    t = mono0 + 301
    while t < mono0 + 300 + 600:  # ten minutes more
        send([], t)
        for w in f.close_due(wall0 + (t - mono0), t):
            out.append(_w(w))
        if kind == "hang" and detect_hung(out, wall0 + (t - mono0), ProgressThresholds.load()) is not None:
            return [Window(rank=0, pid=0, start=t - mono0 - 300, end=0.0)]  # seconds from the hang to the flag
        t += 2
    return out


def _w(d: dict[str, Any]) -> Window:
    keys = set(Window.__dataclass_fields__) - {"start", "end", "node"}
    return Window(start=d["start"], end=d["end"], **{k: d[k] for k in keys if k in d})


def test_at_real_scale_a_hang_is_flagged_within_90_s_and_a_10_minute_checkpoint_never() -> None:
    (marker,) = _timeline("hang")
    # judged as each window arrives: the 60 s rule (thresholds.toml [progress] hang_min_s) plus
    # the window's close (issue 36's goal: <= 90 s after the last step)
    assert 60 <= marker.start <= 90, f"flagged {marker.start} s after the hang"
    windows = _timeline("checkpoint")
    for k in range(1, len(windows) + 1):
        assert detect_hung(windows[:k], windows[k - 1].end + 5, ProgressThresholds.load()) is None
