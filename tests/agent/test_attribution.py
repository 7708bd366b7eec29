"""Attribution on a fake node: Slurm (mapping dir, gpustat, cgroup v1/v2, environ, the
prolog/epilog scripts), plain processes, and the precedence between attributors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpufleet.agent.attribution import merge
from gpufleet.agent.attribution.processes import ProcessAttributor
from gpufleet.agent.attribution.procfs import pod_uid_from_cgroup, slurm_job_from_cgroup
from gpufleet.agent.attribution.slurm import SlurmAttributor
from gpufleet.agent.sources.base import GpuReading, SourceAttribution
from gpufleet.protocol import GpuInfo, JobInfo

REPO = Path(__file__).resolve().parents[2]
CG_V1 = "12:pids:/slurm/uid_2101171/job_280678/step_0/task_0\n10:devices:/slurm/uid_2101171/job_280678/step_0/task_0\n"
CG_V2 = "0::/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0\n"
CG_NONE = "0::/user.slice/user-1000.slice/session-3.scope\n"


def fake_proc(root: Path, pid: int, cgroup: str, env: dict[str, str] | None = None, uid: int = 0,
              comm: str = "python", start_ticks: int = 500) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()) + b"\0")
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(f"{comm}\0train.py\0--lr\0001".encode())
    stat_rest = " ".join(["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 10)
    (d / "stat").write_text(f"{pid} ({comm}) {stat_rest}\n")
    (root / "stat").write_text("cpu 0 0 0\nbtime 1700000000\n")


DEVICES = [GpuInfo(index=i, uuid=f"GPU-{i}") for i in range(4)]


def test_cgroup_parsers_on_real_layouts() -> None:
    assert slurm_job_from_cgroup(CG_V1) == "280678"
    assert slurm_job_from_cgroup(CG_V2) == "1392969"
    assert slurm_job_from_cgroup("0::/system.slice/node7_slurmstepd.scope/job_55/step_batch/user/task_0") == "55"
    assert slurm_job_from_cgroup(CG_NONE) is None
    assert pod_uid_from_cgroup(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice"
        "/cri-containerd-abc.scope") == "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
    assert pod_uid_from_cgroup("11:memory:/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/abc") == \
        "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"


def test_slurm_processes_mapping_dir_and_gpustat(tmp_path: Path) -> None:
    proc, jobs, gpustat = tmp_path / "proc", tmp_path / "jobs", tmp_path / "gpustat"
    jobs.mkdir()
    gpustat.mkdir()
    env = {"SLURM_JOB_ID": "280678", "SLURM_JOB_USER": "alice", "SLURM_JOB_NAME": "bert", "SLURM_JOB_ACCOUNT": "nlp",
           "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "16",
           "SLURM_JOB_QOS": "interactive"}
    fake_proc(proc, 101, CG_V1, env)
    fake_proc(proc, 202, CG_V2, {"SLURM_JOB_ID": "1392969", "SLURM_JOB_USER": "bob"})
    fake_proc(proc, 303, CG_NONE)
    (jobs / "2").write_text("777\n")  # allocated, idle: only the prolog's file knows
    (jobs / "0").write_text("280678\n")
    (jobs / "README").write_text("not a GPU")
    (gpustat / "GPU-3").write_text("888 0\n")  # Princeton format, by uuid
    readings = [GpuReading("GPU-0", pids=(101,)), GpuReading("GPU-1", pids=(202, 303)), GpuReading("GPU-2"),
                GpuReading("GPU-3")]
    a = SlurmAttributor(mapping_dir=jobs, gpustat_dir=gpustat, proc_root=proc).attribute(DEVICES, readings, 0.0)
    assert a.gpu_job == {"GPU-0": "280678", "GPU-1": "1392969", "GPU-2": "777", "GPU-3": "888"}
    j = a.jobs["280678"]
    assert (j.user, j.name, j.account, j.partition, j.num_nodes, j.ntasks) == ("alice", "bert", "nlp", "gpu", 2, 16)
    assert j.labels["qos"] == "interactive"
    # ... which the analysis reads for the workload class (the partition "gpu" says nothing)
    from gpufleet.analysis.workload import classify

    assert classify(source="slurm", name="bert", partition="gpu", labels=j.labels).name == "interactive"
    assert a.jobs["1392969"].user == "bob"
    assert a.jobs["777"] == JobInfo(job_id="777", source="slurm")
    assert a.jobs["888"].user == "root"


def test_mapping_dir_beats_a_stray_process(tmp_path: Path) -> None:
    proc, jobs = tmp_path / "proc", tmp_path / "jobs"
    jobs.mkdir()
    fake_proc(proc, 101, CG_V2.replace("1392969", "5"))
    (jobs / "0").write_text("6\n")
    a = SlurmAttributor(jobs, tmp_path / "none", proc).attribute(DEVICES, [GpuReading("GPU-0", pids=(101,))], 0)
    assert a.gpu_job == {"GPU-0": "6"}


def test_vanished_process_is_not_an_error(tmp_path: Path) -> None:
    a = SlurmAttributor(tmp_path / "j", tmp_path / "g", tmp_path / "proc").attribute(
        DEVICES, [GpuReading("GPU-0", pids=(999,))], 0)
    assert a.gpu_job == {}


def _run(script: str, env: dict[str, str]) -> None:
    subprocess.run(["bash", str(REPO / "scripts" / "slurm" / script)], env={"PATH": os.environ["PATH"], **env},
                   check=True, timeout=30)


def test_prolog_and_epilog_maintain_the_mapping_dir(tmp_path: Path) -> None:
    jobs, gpustat = tmp_path / "jobs", tmp_path / "gpustat"
    base = {"GPUFLEET_JOB_MAPPING_DIR": str(jobs), "GPUFLEET_GPUSTAT_DIR": str(gpustat)}
    _run("prolog.sh", {**base, "SLURM_JOB_ID": "100", "SLURM_JOB_GPUS": "0,2", "SLURM_JOB_UID": "1001"})
    _run("prolog.sh", {**base, "SLURM_JOB_ID": "101", "CUDA_VISIBLE_DEVICES": "1"})
    assert sorted(p.name for p in jobs.iterdir()) == ["0", "1", "2"]
    assert (jobs / "0").read_text() == "100\n" and (gpustat / "2").read_text() == "100 1001\n"
    a = SlurmAttributor(jobs, gpustat, tmp_path / "proc").attribute(DEVICES, [], 0.0)
    assert a.gpu_job == {"GPU-0": "100", "GPU-1": "101", "GPU-2": "100"}
    _run("prolog.sh", {**base, "SLURM_JOB_ID": "102", "SLURM_JOB_GPUS": "2"})  # GPU 2 reallocated before 100 ends
    _run("epilog.sh", {**base, "SLURM_JOB_ID": "100"})
    assert sorted(p.name for p in jobs.iterdir()) == ["1", "2"] and (jobs / "2").read_text() == "102\n"
    assert not (gpustat / "0").exists()
    # a prolog without GPUs or a job id, or with a mapping dir it cannot create, never fails
    _run("prolog.sh", {**base, "SLURM_JOB_ID": "103"})
    _run("prolog.sh", {"GPUFLEET_JOB_MAPPING_DIR": "/proc/nope", "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0"})


def test_process_attributor_on_a_bare_box(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, 4321, CG_NONE, uid=0, comm="llama-server", start_ticks=100 * 3600)
    fake_proc(proc, 17, CG_NONE, uid=0, comm="helper", start_ticks=100 * 7200)  # a reused low pid, started later
    pa = ProcessAttributor(proc, node="box1")
    a = pa.attribute(DEVICES, [GpuReading("GPU-0", pids=(17, 4321)), GpuReading("GPU-1")], 0.0)
    job_id = a.gpu_job["GPU-0"]
    assert job_id.startswith("box1:4321:") and "GPU-1" not in a.gpu_job
    j = a.jobs[job_id]
    assert j.source == "process" and j.name == "llama-server" and j.user == "root"
    assert j.start_ts == 1700000000 + 3600.0
    assert j.labels["pid"] == "4321" and "train.py" in j.labels["cmdline"]


def test_process_attributor_on_this_machine() -> None:
    a = ProcessAttributor(Path("/proc"), node="here").attribute([], [GpuReading("GPU-0", pids=(os.getpid(),))], 0)
    job = a.jobs[a.gpu_job["GPU-0"]]
    assert job.labels["pid"] == str(os.getpid()) and job.start_ts is not None and job.start_ts > 1e9


def test_merge_keeps_earlier_placements_and_fills_facts() -> None:
    a = SourceAttribution(jobs={"1": JobInfo(job_id="1", user=None, name="x")}, gpu_job={"GPU-0": "1"})
    b = SourceAttribution(jobs={"1": JobInfo(job_id="1", user="u", name="y"), "2": JobInfo(job_id="2")},
                          gpu_job={"GPU-0": "2", "GPU-1": "2"})
    merge(a, b)
    assert a.gpu_job == {"GPU-0": "1", "GPU-1": "2"}
    assert a.jobs["1"].user == "u" and a.jobs["1"].name == "x"
