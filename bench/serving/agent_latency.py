"""What the gpufleet agent costs a latency-sensitive process on the same node.

    .venv/bin/python bench/serving/agent_latency.py                 # 15 s phases, 2 rounds
    .venv/bin/python bench/serving/agent_latency.py --phase-s 30 --rounds 3 --cpu 1

A tight request loop (each "request" hashes 16 KiB: ~20-40 us of CPU, like a small inference
pre/post-processing step) runs in this process, timed request by request, in phases: the agent
off, the agent sampling at 1 Hz, the agent at 10 Hz (``gpufleet agent --simulate 1
--gpus-per-node 8``: the simulator stands in for NVML, so this measures the agent's own Python
work, not the driver's), rounds interleaved so drift on a shared machine hits every phase alike.
``--cpu N`` pins the loop and the agent to one core (the worst case: they share it); ``--cpu -1``
leaves both to the scheduler. Prints p50/p99/p99.9 per phase and the change against the agent off.
The agent's collector is a closed port (it spools), so only sampling and batching are measured.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAYLOAD = os.urandom(16 << 10)


def loop(seconds: float) -> list[float]:
    """Request latencies (microseconds) of a tight loop for ``seconds``."""
    out = []
    end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter_ns()
        hashlib.sha256(PAYLOAD).digest()
        t1 = time.perf_counter_ns()
        out.append((t1 - t0) / 1000.0)
        if t1 / 1e9 > end:
            return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (and its waited-for children) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def start_agent(interval: float, cpu: int, spool: Path) -> subprocess.Popen[bytes]:
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    dead = port.getsockname()[1]
    port.close()
    exe = Path(sys.executable).with_name("gpufleet")
    cmd = [str(exe), "agent", "--simulate", "1", "--gpus-per-node", "8", "--interval", str(interval),
           "--collector", f"http://127.0.0.1:{dead}", "--spool-dir", str(spool), "--no-infiniband",
           "--no-nic-health"]
    if cpu >= 0:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3.0)  # past its start-up (imports, first samples)
    if proc.poll() is not None:
        raise SystemExit(f"the agent exited at once ({proc.returncode}): {' '.join(cmd)}")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase-s", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cpu", type=int, default=1, help="core for both (-1: no pinning)")
    args = ap.parse_args()
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    results: dict[str, list[float]] = {"agent off": [], "agent 1 Hz": [], "agent 10 Hz": []}
    agent_cpu: dict[str, float] = {k: 0.0 for k in results}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, interval in (("agent off", None), ("agent 1 Hz", 1.0), ("agent 10 Hz", 0.1)):
                proc = start_agent(interval, args.cpu, Path(tmp) / f"spool-{r}-{name[-5:].strip()}") \
                    if interval else None
                try:
                    c0 = cpu_seconds(proc.pid) if proc is not None else 0.0
                    results[name] += loop(args.phase_s)
                    if proc is not None:
                        agent_cpu[name] += cpu_seconds(proc.pid) - c0
                finally:
                    if proc is not None:
                        proc.terminate()
                        proc.wait(timeout=30)
    base = results["agent off"]
    where = f"pinned to cpu {args.cpu}" if args.cpu >= 0 else "not pinned"
    print(f"{args.rounds} rounds x {args.phase_s:.0f} s per phase, {where}, {os.cpu_count()} CPUs on the machine\n")
    print("| phase | agent CPU (% of a core) | requests/s | p50 us | p99 us | p99.9 us | p50 vs off | p99 vs off "
          "| requests/s vs off |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, xs in results.items():
        p50, p99, p999 = pct(xs, 0.5), pct(xs, 0.99), pct(xs, 0.999)
        d50 = (p50 / pct(base, 0.5) - 1) * 100
        d99 = (p99 / pct(base, 0.99) - 1) * 100
        rate = len(xs) / (args.phase_s * args.rounds)
        drate = (len(xs) / len(base) - 1) * 100
        cpu = agent_cpu[name] / (args.phase_s * args.rounds) * 100
        print(f"| {name} | {cpu:.2f} | {rate:,.0f} | {p50:.1f} | {p99:.1f} | {p999:.1f} | {d50:+.1f}% | {d99:+.1f}% "
              f"| {drate:+.1f}% |")
    print(f"\nmean of the loop with the agent off: {statistics.fmean(base):.1f} us")


if __name__ == "__main__":
    main()
