"""Agent overhead on one 8-GPU node: CPU time per 1 Hz cycle and resident memory, with the
fake NVML (8 x H100, GPM on, Slurm attribution over a fake /proc) and with the simulator.

Each scenario runs in its own fresh process so RSS is the agent's alone: the interpreter,
its imports, the source, the spool and the sender, as a real `gpufleet agent` would have.
A cycle is everything the agent does per second: read the source, attribute, journal;
every 10th cycle also builds the batch, compresses it, fsyncs it into the spool and POSTs
it over real HTTP to a stub collector (another process). Cycles run back to back with a
fake clock, so CPU time is measured, not waited for.

    .venv/bin/python bench/agent/agent_overhead.py            # 3000 cycles per scenario
    .venv/bin/python bench/agent/agent_overhead.py --quick    # 300

Reference: dcgm-exporter's published footprint (see docs/benchmarks.md): 135-155 MiB RSS
and 3-9 mCPU at a 30 s interval (2022); 405-512 MiB working set and OOM kills at 512 MiB on
8-GPU nodes (2026); 15-20% of a core (2020). Goal here: < 1% of one core, < 60 MiB RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DCGM_EXPORTER_RSS_MIB = (135.0, 512.0)
DCGM_EXPORTER_CPU_PCT = (0.3, 20.0)  # 3 mCPU (30 s interval) .. 15-20% of a core (1 s interval, 2020)


def _rss_mib() -> tuple[float, float]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def run_fleet(cycles: int, collector: str, nodes: int = 16) -> dict[str, float]:
    """``gpufleet up``'s shape: ``nodes`` simulated agents in one process, 8 GPUs each."""
    from gpufleet.agent.runner import Agent, AgentConfig
    from gpufleet.agent.simulator import SimulatedFleet

    tmp = Path(tempfile.mkdtemp(prefix="gf-bench-fleet-"))
    fleet = SimulatedFleet(nodes=nodes, gpus_per_node=8, start_ts=time.time() - 7200)
    t = [time.time() - cycles - 10]
    agents = [Agent(AgentConfig(collector_url=collector, node=n, spool_dir=tmp / n), fleet.source(n),
                    clock=lambda: t[0]) for n in fleet.node_names()]
    for a in agents:
        a.start()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    sent = 0
    for i in range(cycles):
        t[0] += 1.0
        for a in agents:
            a.cycle(t[0])
            if i % 10 == 9:
                a.flush()
                sent += a.sender.drain(10)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    rss, hwm = _rss_mib()
    return {"cycles": cycles, "cpu_ms_per_cycle": cpu / cycles * 1000, "rss_mib": rss, "peak_rss_mib": hwm,
            "batches_sent": sent / nodes}


def run_scenario(kind: str, cycles: int, collector: str) -> dict[str, float]:
    """Runs inside the child process."""
    from gpufleet.agent.runner import Agent, AgentConfig

    if kind == "16-agents":
        return run_fleet(cycles, collector)

    tmp = Path(tempfile.mkdtemp(prefix="gf-bench-agent-"))
    attributors: list = []
    if kind == "fake-nvml":
        from gpufleet.agent.attribution.slurm import SlurmAttributor
        from gpufleet.agent.sources.nvml import NvmlSource
        # The fake NVML is test scaffolding (tests/support), not part of the product.
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.support.fake_nvml import FakeNvml, h100

        proc = tmp / "proc"
        gpus = [h100(i) for i in range(8)]
        for i, g in enumerate(gpus):  # one training process per GPU, in a Slurm job
            pid = 1000 + i
            g.pids = [pid]
            d = proc / str(pid)
            d.mkdir(parents=True)
            (d / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
            (d / "environ").write_bytes(b"SLURM_JOB_ID=4242\0SLURM_JOB_USER=alice\0SLURM_JOB_NAME=train\0")
        jobs = tmp / "jobs"
        jobs.mkdir()
        for i in range(8):
            (jobs / str(i)).write_text("4242\n")
        source = NvmlSource(FakeNvml(gpus), xid_events=True)
        attributors = [SlurmAttributor(jobs, tmp / "gpustat", proc)]
    else:
        from gpufleet.agent.simulator import SimulatedFleet

        fleet = SimulatedFleet(nodes=1, gpus_per_node=8, start_ts=time.time() - 7200)
        source = fleet.source(fleet.node_names()[0])

    clock_t = [time.time() - cycles - 10]

    def clock() -> float:
        clock_t[0] += 1.0
        return clock_t[0]

    cfg = AgentConfig(collector_url=collector, node="bench-node", spool_dir=tmp / "spool", flush_s=10.0)
    agent = Agent(cfg, source, attributors, clock=clock, enrichers=[])
    agent.start()
    # warm up (imports, first GPM sample, page cache) outside the measurement
    for _ in range(20):
        agent.cycle(clock())
        time.sleep(0.0) if kind == "simulator" else time.sleep(0.1 / 20)
    agent.flush()
    agent.sender.drain(10)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.perf_counter()
    sent = 0
    for i in range(cycles):
        agent.cycle(clock())
        if i % 10 == 9:
            agent.flush()
            sent += agent.sender.drain(10)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter() - w0
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    rss, hwm = _rss_mib()
    source.close()
    return {"cycles": cycles, "cpu_ms_per_cycle": cpu / cycles * 1000, "wall_ms_per_cycle": wall / cycles * 1000,
            "rss_mib": rss, "peak_rss_mib": hwm, "batches_sent": sent,
            "rows": agent.metrics.registry.get_sample_value("gpufleet_agent_samples_total") or 0.0}


class _Stub(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"stored": 80, "duplicate": false}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


def stub_collector() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    print(httpd.server_port, flush=True)
    httpd.serve_forever()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 cycles per scenario instead of 3000")
    ap.add_argument("--cycles", type=int)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "URL"), help=argparse.SUPPRESS)
    ap.add_argument("--stub", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cycles = args.cycles or (300 if args.quick else 3000)
    if args.stub:
        stub_collector()
        return 0
    if args.child:
        print(json.dumps(run_scenario(args.child[0], cycles, args.child[1])))
        return 0

    stub = subprocess.Popen([sys.executable, __file__, "--stub"], stdout=subprocess.PIPE, text=True)
    try:
        assert stub.stdout is not None
        url = f"http://127.0.0.1:{stub.stdout.readline().strip()}"
        results = {}
        for kind in ("fake-nvml", "simulator", "16-agents"):
            out = subprocess.run([sys.executable, __file__, "--cycles", str(cycles), "--child", kind, url],
                                 capture_output=True, text=True, cwd=REPO, check=True,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
            results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        stub.terminate()
        threading.Thread(target=stub.wait, daemon=True).start()

    lo_rss, hi_rss = DCGM_EXPORTER_RSS_MIB
    print(f"agent overhead, 8 GPUs, 1 Hz, {cycles} cycles per scenario (python {sys.version.split()[0]})")
    print(f"{'scenario':<12} {'CPU ms/cycle':>13} {'% of a core':>12} {'RSS MiB':>8} {'peak MiB':>9} "
          f"{'RSS vs dcgm-exporter 135..512 MiB':>34}")
    for kind, r in results.items():
        pct = r["cpu_ms_per_cycle"] / 1000 * 100
        print(f"{kind:<12} {r['cpu_ms_per_cycle']:>13.3f} {pct:>11.3f}% {r['rss_mib']:>8.1f} {r['peak_rss_mib']:>9.1f} "
              f"{r['peak_rss_mib'] / lo_rss:>15.2f}x .. {r['peak_rss_mib'] / hi_rss:.2f}x")
        assert r["batches_sent"] >= cycles // 10, r  # everything was delivered over HTTP
    print("goal: < 1% of one core and < 60 MiB RSS; dcgm-exporter published: 135-512 MiB, 0.3-20% of a core")
    print("16-agents = gpufleet up's shape: 16 simulated 8-GPU nodes in one process (the figures are for all 16)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
