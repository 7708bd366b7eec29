"""The NCCL Inspector source: documented v4.0 records, tailing, attribution, restarts."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from gpufleet.agent.sources.base import GpuReading
from gpufleet.agent.sources.nccl_inspector import InspectorSource
from gpufleet.agent.sources.nccl_inspector_parse import ParseError, parse_json_line, parse_prom_text
from gpufleet.nccl_fold import Aggregator, percentile, size_bucket
from gpufleet.protocol import CollectiveAgg, GpuInfo

from .fabric_model import MIB, Fabric, TrainingJob, prom_text, to_json_line

# The two examples of ext-profiler/inspector/README.md (format v4.0), one line each.
README_NORMAL = (
    '{"header": {"id": "0x7f8c496ae9f661", "rank": 2, "n_ranks": 8, "nnodes": 1}, "metadata": '
    '{"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism": "profiler_plugin", '
    '"dump_timestamp_us": 1748030377748202, "hostname": "example-hostname", "pid": 1639453}, "coll_perf": '
    '{"coll": "AllReduce", "coll_sn": 1407, "coll_msg_size_bytes": 17179869184, "coll_exec_time_us": 61974, '
    '"coll_algobw_gbs": 277.210914, "coll_busbw_gbs": 485.119099}}')
README_VERBOSE = json.dumps({
    "header": {"id": "0xe62dedaa97644a", "rank": 4, "n_ranks": 8, "nnodes": 1},
    "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "9019a1912-dirty",
                 "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": 1752867229276385,
                 "hostname": "example-hostname", "pid": 438776},
    "coll_perf": {"coll": "ReduceScatter", "coll_sn": 1231, "coll_msg_size_bytes": 2147483648,
                  "coll_exec_time_us": 41057, "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 418.439467,
                  "coll_busbw_gbs": 366.134533,
                  "event_trace_sn": {"coll_start_sn": 1, "coll_stop_sn": 2, "kernel_events": [
                      {"channel_id": 0, "kernel_start_sn": 3, "kernel_stop_sn": 48, "kernel_record_sn": 47}]},
                  "event_trace_ts": {"coll_start_ts": 1752867229235059, "coll_stop_ts": 1752867229235064,
                                     "kernel_events": [{"channel_id": 0, "kernel_start_ts": 1752867229235181,
                                                        "kernel_stop_ts": 1752867229275811,
                                                        "kernel_record_ts": 1752867229275811}]}}})
T0 = 1_764_583_200.0  # 2025-12-01 10:00 UTC, on a 10 s boundary


def test_documented_records_parse() -> None:
    r = parse_json_line(README_NORMAL.encode())
    assert (r.comm, r.rank, r.n_ranks, r.n_nodes, r.coll, r.size, r.exec_us, r.busbw_gbs, r.pid, r.sn) == (
        "0x7f8c496ae9f661", 2, 8, 1, "AllReduce", 17179869184, 61974, 485.119099, 1639453, 1407)
    assert r.ts == pytest.approx(1748030377.748202)
    v = parse_json_line(README_VERBOSE.encode())
    assert (v.coll, v.timing_source, v.exec_us) == ("ReduceScatter", "kernel_gpu", 41057)


@pytest.mark.parametrize("line, why", [
    (b'{"header": {"id": "0x1", "rank": 0}', "malformed"),
    (b'{"header": {"id": "0x1", "rank": 0}, "metadata": {}, "coll_perf": {"coll": "AllReduce"}}', "not an Inspector"),
    (README_NORMAL.replace('"dump_timestamp_us": 1748030377748202', '"dump_timestamp_us": 0').encode(),
     "dump_timestamp_us"),
    (README_NORMAL.replace('"coll_exec_time_us": 61974', '"coll_exec_time_us": -3').encode(), "negative"),
    (b"garbage", "malformed"),
])
def test_bad_lines_say_why(line: bytes, why: str) -> None:
    with pytest.raises(ParseError, match=why):
        parse_json_line(line)


def test_size_bucket_and_percentile() -> None:
    assert size_bucket(17179869184) == 17179869184
    assert size_bucket(100_000_000) == 64 * MIB
    assert size_bucket(0) == 0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0 and percentile([5.0], 0.95) == 5.0


def _job(nodes: int = 2, seconds: float = 120.0, **kw: object) -> TrainingJob:
    return TrainingJob("4242", Fabric(nodes=[f"gpu-{k:02d}" for k in range(nodes)]), T0, seconds, **kw)  # type: ignore[arg-type]


def _source(root: Path, tmp: Path, host: str = "gpu-00", **kw: object) -> InspectorSource:
    return InspectorSource(root, tmp / "state" / "nccl_offsets.json", hostname=host, proc_root=tmp / "proc",
                           clock=lambda: 0.0, **kw)  # type: ignore[arg-type]


def _drain_all(src: InspectorSource, polls: int = 50) -> list[CollectiveAgg]:
    out: list[CollectiveAgg] = []
    for i in range(polls):
        src._scanned_at = -1e18 if i == 0 else src._scanned_at
        out.extend(src.poll(float(i), wall=4e9))
    return out


def _expected(job: TrainingJob, host: str) -> Counter[tuple[str, int, str, int]]:
    c: Counter[tuple[str, int, str, int]] = Counter()
    for rank, rec in job.records():
        if job.node_of(rank) == host:
            c[(rec["header"]["id"], rec["header"]["rank"], rec["coll_perf"]["coll"],
               size_bucket(rec["coll_perf"]["coll_msg_size_bytes"]))] += 1
    return c


def _got(aggs: list[CollectiveAgg]) -> Counter[tuple[str, int, str, int]]:
    c: Counter[tuple[str, int, str, int]] = Counter()
    for a in aggs:
        c[(a.comm, a.rank, a.coll, a.size_bucket)] += a.count
    return c


def test_reads_this_hosts_files_from_the_start_and_names_the_job(tmp_path: Path) -> None:
    job = _job()
    root = tmp_path / "dumps"
    job.write_json(root)
    aggs = _drain_all(_source(root, tmp_path))
    assert aggs and {a.job_id for a in aggs} == {"4242"}, "nccl-inspector-<jobid> names the job"
    assert _got(aggs) == _expected(job, "gpu-00"), "every record of this host once, none of the other host's"
    assert all(a.ts % 10 == 0 and a.window_s == 10 for a in aggs)
    # exact statistics for one key and window, against the records themselves
    a = next(x for x in aggs if x.coll == "AllReduce" and x.count >= 5)
    mine = sorted(rec["coll_perf"]["coll_exec_time_us"] for rank, rec in job.records()
                  if rec["header"]["id"] == a.comm and rec["header"]["rank"] == a.rank
                  and a.ts <= rec["metadata"]["dump_timestamp_us"] / 1e6 < a.ts + 10
                  and size_bucket(rec["coll_perf"]["coll_msg_size_bytes"]) == a.size_bucket)
    assert len(mine) == a.count
    assert (a.exec_us_p50, a.exec_us_p95, a.exec_us_max) == (percentile(mine, .5), percentile(mine, .95), max(mine))
    assert a.bytes == a.count * a.size_bucket and a.n_ranks == 16 and a.n_nodes == 2


def test_verbose_files_read_the_same(tmp_path: Path) -> None:
    job = _job(seconds=40)
    job.write_json(tmp_path / "a")
    job.write_json(tmp_path / "b", verbose=True)
    assert _got(_drain_all(_source(tmp_path / "a", tmp_path))) == _got(_drain_all(_source(tmp_path / "b", tmp_path)))


def test_partial_last_line_bad_lines_and_bounded_reads(tmp_path: Path) -> None:
    root = tmp_path / "nccl-inspector-77"
    root.mkdir()
    f = root / "gpu-00-pid9.log"
    line = README_NORMAL.replace("example-hostname", "gpu-00").replace("1748030377748202", str(int(T0 * 1e6)))
    f.write_text(line + "\n" + "not json\n" + line[:50])
    src = _source(tmp_path, tmp_path, max_bytes_per_poll=300)  # less than two lines per poll
    got = _drain_all(src, polls=5)
    assert sum(a.count for a in got) == 1 and src.bad_lines == 1
    with open(f, "a") as fh:
        fh.write(line[50:] + "\n")  # the writer finishes its line
    got = _drain_all(src, polls=5)
    assert sum(a.count for a in got) == 1, "the completed line is read once, not its two halves"
    assert src.records == 2 and src.bad_lines == 1


def test_truncation_and_rotation(tmp_path: Path) -> None:
    root = tmp_path / "nccl-inspector-5"
    root.mkdir()
    line = (README_NORMAL.replace("example-hostname", "gpu-00").replace("1748030377748202", str(int(T0 * 1e6)))
            + "\n").encode()
    f = root / "gpu-00-pid9.log"
    f.write_bytes(line * 3)
    src = _source(tmp_path, tmp_path)
    assert sum(a.count for a in _drain_all(src, 3)) == 3
    f.rename(root / "gpu-00-pid9.log.1")  # rotated by rename: the old file keeps its offset
    with open(root / "gpu-00-pid9.log.1", "ab") as fh:
        fh.write(line)  # written before the writer reopened
    (root / "gpu-00-pid9.log").write_bytes(line * 2)  # the new file starts at 0
    assert sum(a.count for a in _drain_all(src, 3)) == 3
    (root / "gpu-00-pid9.log").write_bytes(line)  # truncated (copytruncate) and written again
    assert sum(a.count for a in _drain_all(src, 3)) == 1 and src.truncations == 1


def test_restart_resumes_without_loss_or_repeat(tmp_path: Path) -> None:
    """Offsets persist only what was handed out: an agent killed with windows still open reads
    those records again after its restart, and nothing it already handed out."""
    job = _job(seconds=200)
    root = tmp_path / "dumps"
    job.write_json(root, until=T0 + 100)
    src = _source(root, tmp_path)
    handed = list(src.poll(0.0, wall=T0 + 60))  # windows up to T0+45 out, the rest held
    src.commit()
    assert handed and len(src.agg) > 0
    del src  # killed: held windows are lost with the process
    job.write_json(root, since=T0 + 100)  # the job carries on writing
    src2 = _source(root, tmp_path)
    handed += _drain_all(src2)
    assert _got(handed) == _expected(job, "gpu-00")


def test_job_and_gpu_from_the_process(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "9").mkdir(parents=True)
    (proc / "9" / "environ").write_bytes(b"PATH=/bin\0SLURM_JOB_ID=31337\0")
    (proc / "10").mkdir(parents=True)
    (proc / "10" / "environ").write_bytes(b"PATH=/bin\0")
    (proc / "10" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_555/step_0/user/task_0\n")
    d = tmp_path / "dumps" / "custom"
    d.mkdir(parents=True)
    for pid in (9, 10, 11):
        line = README_NORMAL.replace("1639453", str(pid)).replace("example-hostname", "gpu-00").replace(
            "1748030377748202", str(int(T0 * 1e6)))
        (d / f"gpu-00-pid{pid}.log").write_text(line + "\n")
    src = _source(tmp_path / "dumps", tmp_path)
    src.update_gpus([GpuInfo(index=0, uuid="GPU-a")], [GpuReading("GPU-a", pids=(9,))])
    by_pid = {a.pid: a for a in _drain_all(src, 3)}
    assert (by_pid[9].job_id, by_pid[9].gpu_uuid) == ("31337", "GPU-a")
    assert (by_pid[10].job_id, by_pid[10].gpu_uuid) == ("555", None)
    assert (by_pid[11].job_id, by_pid[11].gpu_uuid) == (None, None), "unknown stays unknown"


def test_prometheus_textfiles(tmp_path: Path) -> None:
    job = _job(nodes=1, seconds=20)
    recs = [rec for _, rec in job.records()]
    d = tmp_path / "prom"
    d.mkdir()
    f = d / "nccl_inspector_GPU0.prom"
    first = [r for r in recs if r["header"]["rank"] == 0][:2]
    f.write_text(prom_text(first[:1], "4242", {0: 0}))
    src = _source(d, tmp_path)
    src.update_gpus([GpuInfo(index=0, uuid="GPU-z")], [])
    got = _drain_all(src, 2)
    f.write_text(prom_text(first[:1], "4242", {0: 0}) + "\n")  # rewritten, same collective: counted once
    os.utime(f, ns=(1, 2))
    got += _drain_all(src, 2)
    f.write_text(prom_text(first[1:2], "4242", {0: 0}))
    os.utime(f, ns=(3, 4))
    got += _drain_all(src, 2)
    assert sum(a.count for a in got) == 2
    assert {(a.job_id, a.gpu_uuid, a.coll) for a in got} == {("4242", "GPU-z", first[0]["coll_perf"]["coll"])}
    recs2, bad = parse_prom_text('nccl_bus_bandwidth_gbs{version="v5.1",slurm_job_id="1670760",node="n",gpu="GPU3",'
                                 'comm_name="c1",n_nodes="4",nranks="32",collective="ReduceScatter",'
                                 'message_size="134-135MB",algo_proto="RING_SIMPLE"} 44.1181\n'
                                 'nccl_collective_exec_time_microseconds{version="v5.1",slurm_job_id="1670760",'
                                 'node="n",gpu="GPU3",comm_name="c1",n_nodes="4",nranks="32",'
                                 'collective="ReduceScatter",message_size="134-135MB",algo_proto="RING_SIMPLE"} '
                                 '104164\nbroken line\n', 5.0)
    assert bad == 1 and len(recs2) == 1
    r = recs2[0]
    assert (r.comm, r.coll, r.size, r.exec_us, r.busbw_gbs, r.gpu_index, r.job_id, r.n_ranks) == (
        "c1", "ReduceScatter", 134 * MIB, 104164.0, 44.1181, 3, "1670760", 32)


def test_aggregator_bounds_keys_and_values() -> None:
    agg = Aggregator(max_keys=3)
    rec = parse_json_line(README_NORMAL.encode())
    for rank in range(5):
        rec.rank = rank
        agg.add(rec, None, None)
    assert len(agg) == 3 and agg.dropped == 2
    big = Aggregator()
    rec.rank = 0
    for i in range(10_000):
        rec.exec_us = float(i)
        big.add(rec, None, None)
    (a,) = big.drain(2e9)
    assert a.count == 10_000 and a.exec_us_max == 9999.0
    assert 4500 <= a.exec_us_p50 <= 5500, "thinned values still give the median"
    assert to_json_line  # the fixture writer is importable for the benchmark
