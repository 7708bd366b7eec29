"""NCCL Inspector source overhead: agent CPU per 10,000 Inspector records and resident memory
while it reads a 2 GB file, each measured in a fresh process.

* CPU: the fabric model (tests/nccl/fabric_model.py) writes a 4-node x 8-GPU job's JSON lines;
  one node's InspectorSource reads them all (parse, attribute, fold into 10 s aggregates, hand
  out). Measured side by side in the same run: the naive reference, ``json.loads`` of every
  line and nothing else. Reported per 10,000 records and as a ratio to the reference.
* Memory: one 2 GB JSON-lines file (generated in /tmp, deleted afterwards) read from its start
  by a fresh process, 8 MiB per poll as the agent does (one poll per 1 s cycle); peak RSS against the same process's
  RSS before it reads (the interpreter and imports). Also the records per second.

    .venv/bin/python bench/nccl/inspector_overhead.py            # 2 GB file
    .venv/bin/python bench/nccl/inspector_overhead.py --gb 0.2   # quicker
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

LINE = ('{"header":{"id":"0x7f8c496ae9f661","rank":%d,"n_ranks":32,"nnodes":4},"metadata":'
        '{"inspector_output_format_version":"v4.0","git_rev":"","rec_mechanism":"profiler_plugin",'
        '"dump_timestamp_us":%d,"hostname":"gpu-00","pid":4242},"coll_perf":{"coll":"AllReduce","coll_sn":%d,'
        '"coll_msg_size_bytes":268435456,"coll_exec_time_us":%d,"coll_timing_source":"kernel_gpu",'
        '"coll_algobw_gbs":%.6f,"coll_busbw_gbs":%.6f}}\n')


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child_cpu(root: str) -> None:
    from gpufleet.agent.sources.nccl_inspector import InspectorSource

    src = InspectorSource(Path(root), Path(root) / "state.json", hostname="gpu-00")
    files = sorted(Path(root).rglob("gpu-00-*.log"))
    t0 = time.process_time()
    aggs = 0
    for i in range(10_000):
        got = src.poll(float(i) * 10, wall=4e9)
        aggs += len(got)
        if src.records and not got and all(f.offset == f.path.stat().st_size for f in src.files.values()):
            break
    ours = time.process_time() - t0
    t0 = time.process_time()
    ref_n = 0
    for f in files:
        with open(f, "rb") as fh:
            for line in fh:
                json.loads(line)
                ref_n += 1
    ref = time.process_time() - t0
    print(json.dumps({"records": src.records, "aggregates": aggs, "cpu_s": ours, "ref_records": ref_n,
                      "ref_cpu_s": ref}))


def child_mem(path: str) -> None:
    from gpufleet.agent.sources.nccl_inspector import InspectorSource

    p = Path(path)
    src = InspectorSource(p.parent, Path(tempfile.mkdtemp()) / "state.json", hostname="gpu-00")
    before = _rss_mib()
    size = p.stat().st_size
    t0, c0 = time.monotonic(), time.process_time()
    i = 0
    while True:
        src.poll(float(i) * 10, wall=4e9)
        i += 1
        f = next(iter(src.files.values()))
        if f.offset >= size:
            break
    src.poll(float(i) * 10, wall=4e9)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"bytes": size, "records": src.records, "polls": i, "rss_before_mib": before,
                      "rss_peak_mib": peak, "wall_s": wall, "cpu_s": cpu}))


def write_big(path: Path, gb: float) -> int:
    target = int(gb * 1e9)
    n = 0
    ts = 1_764_583_200_000_000
    with open(path, "w") as f:
        buf = []
        written = 0
        while written < target:
            n += 1
            exec_us = 1800 + (n * 7919) % 300
            line = LINE % (n % 32, ts + n * 100_000, n, exec_us, 268435456 / exec_us / 1e3,
                           268435456 / exec_us / 1e3 * 1.9375)
            buf.append(line)
            written += len(line)
            if len(buf) >= 10000:
                f.write("".join(buf))
                buf.clear()
        f.write("".join(buf))
    return n


def _run(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.0, help="size of the big file (default 2 GB)")
    ap.add_argument("--child-cpu")
    ap.add_argument("--child-mem")
    a = ap.parse_args()
    if a.child_cpu:
        return child_cpu(a.child_cpu)
    if a.child_mem:
        return child_mem(a.child_mem)

    from tests.nccl.fabric_model import Fabric, TrainingJob

    scratch = Path(tempfile.mkdtemp(prefix="gpufleet-nccl-bench-", dir="/dev/shm" if Path("/dev/shm").is_dir()
                                    else None))
    try:
        job = TrainingJob("7001", Fabric(nodes=[f"gpu-{k:02d}" for k in range(4)]), 1_764_583_200.0, 3600.0)
        job.write_json(scratch)
        cpu = _run("--child-cpu", str(scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    per10k = cpu["cpu_s"] / cpu["records"] * 1e4
    ref10k = cpu["ref_cpu_s"] / cpu["ref_records"] * 1e4
    print(f"CPU: {cpu['records']} records of one node (8 ranks, 1 h) -> {cpu['aggregates']} aggregates: "
          f"{per10k * 1e3:.1f} ms per 10,000 records; json.loads alone {ref10k * 1e3:.1f} ms "
          f"(ratio {per10k / ref10k:.2f})")

    big_dir = Path(tempfile.mkdtemp(prefix="gpufleet-nccl-2gb-", dir="/tmp"))
    try:
        big = big_dir / "nccl-inspector-7001" / "gpu-00-pid4242.log"
        big.parent.mkdir()
        t0 = time.monotonic()
        n = write_big(big, a.gb)
        print(f"wrote {big.stat().st_size / 1e9:.2f} GB ({n} records) in {time.monotonic() - t0:.0f} s")
        mem = _run("--child-mem", str(big))
    finally:
        shutil.rmtree(big_dir, ignore_errors=True)
    print(f"memory: {mem['bytes'] / 1e9:.2f} GB file, {mem['records']} records in {mem['polls']} polls: "
          f"RSS {mem['rss_before_mib']:.1f} MiB before, peak {mem['rss_peak_mib']:.1f} MiB "
          f"(+{mem['rss_peak_mib'] - mem['rss_before_mib']:.1f}); {mem['records'] / mem['cpu_s']:,.0f} records per "
          f"CPU second, {mem['wall_s']:.0f} s wall")
    print(json.dumps({"cpu": cpu, "mem": mem, "per10k_ms": per10k * 1e3, "ref10k_ms": ref10k * 1e3}))


if __name__ == "__main__":
    main()
