"""Response schemas (the OpenAPI contract). Families follow the template: XPublic for one
item, XsPublic{data, count, next_cursor} for a page. Times are epoch seconds, ratios 0..1."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from gpufleet.flagkinds import FLAG_KINDS


class FlagBrief(BaseModel):
    kind: str
    severity: str
    open: bool
    wasted_gpu_hours: float | None = None


class FlagPublic(BaseModel):
    id: int
    kind: str = Field(description="one of the registry's kinds: " + ", ".join(FLAG_KINDS) + " (GET /api/v1/flag-kinds)")
    scope: str = Field(description='"" = whole job; else the node or GPU it concerns')
    severity: str
    open: bool
    start_ts: float
    end_ts: float
    wasted_gpu_hours: float | None = None
    evidence: dict[str, Any]
    suggestion: str
    opened_at: float | None = None
    resolved_at: float | None = None


class FlagWithJob(FlagPublic):
    cluster: str
    job_id: str
    user: str | None = None
    job_name: str | None = None


class FlagsPublic(BaseModel):
    data: list[FlagWithJob]
    count: int
    next_cursor: str | None = None


class JobMeta(BaseModel):
    cluster: str
    job_id: str
    name: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    namespace: str | None = None
    source: str | None = None
    state: str
    start_ts: float | None = None
    end_ts: float | None = None
    last_sample_ts: float | None = None
    num_nodes: int | None = None


class JobListItem(JobMeta):
    n_gpus: int
    allocated_gpu_hours: float | None = None
    wasted_gpu_hours: float | None = None
    goodput_score: float | None = None
    sm_active_mean: float | None = None
    tensor_active_mean: float | None = None
    flags: list[FlagBrief]


class JobsPublic(BaseModel):
    data: list[JobListItem]
    count: int = Field(description="jobs matching the filters (all pages)")
    next_cursor: str | None = Field(None, description="pass as ?cursor= for the next page; null on the last page")


class JobGpu(BaseModel):
    uuid: str
    index: int
    node: str
    model: str | None = None
    memory_total_bytes: float | None = None
    start_ts: float | None = None
    end_ts: float | None = None
    current: dict[str, Any] | None = Field(None, description="newest 1-minute rollup (running jobs only)")


class JobSummary(BaseModel):
    source: str = Field(description='"report" (goodput engine) or "live" (computed from rollups, no report yet)')
    allocated_gpu_hours: float | None = None
    wasted_gpu_hours: float | None = None
    goodput_score: float | None = None
    active_gpu_hours: float | None = None
    mfu_estimate: float | None = None
    analyzed_until: float | None = None
    sm_active_mean: float | None = None
    sm_occupancy_mean: float | None = None
    tensor_active_mean: float | None = None
    dram_active_mean: float | None = None
    power_w_mean: float | None = None
    sm_clock_mhz_mean: float | None = None


class PerGpu(BaseModel):
    gpu_uuid: str
    node: str | None = None
    index: int | None = None
    sm_active_mean: float | None = None
    tensor_active_mean: float | None = None
    dram_active_mean: float | None = None
    power_w_mean: float | None = None
    sm_clock_mhz_mean: float | None = None
    fb_used_bytes_max: float | None = None


class JobPublic(JobMeta):
    labels: dict[str, Any]
    n_gpus: int
    nodes: list[str]
    gpus: list[JobGpu]
    summary: JobSummary
    report: dict[str, Any] | None = Field(None, description="the goodput engine's report JSON, null until analysed")
    per_gpu: list[PerGpu]
    flags: list[FlagPublic]
    links: dict[str, str]
    goodput: dict[str, Any] | None = Field(None, description="ETTR and badput by cause from the job's own "
                                             "progress (source: progress), or source: hardware (docs/progress.md)")


class FieldInfo(BaseModel):
    name: str
    unit: str
    description: str


class SeriesGpu(BaseModel):
    uuid: str
    node: str
    index: int


class PerGpuSeries(BaseModel):
    """Per-GPU series on one time axis: what a job's and a node's history share."""

    start: float
    end: float
    step: int = Field(description="seconds per point (auto: about 360 points)")
    points: int
    fields: list[FieldInfo]
    t: list[float] = Field(description="point times (epoch seconds, bucket starts)")
    gpus: list[SeriesGpu]
    series: dict[str, list[list[float | None]]] = Field(description="field -> one array per GPU (order of gpus)")


class TimeseriesPublic(PerGpuSeries):
    aggregate: dict[str, list[float | None]] = Field(description="field -> the job-aggregate line")


class GpuCurrentJob(BaseModel):
    job_id: str
    user: str | None = None
    name: str | None = None
    cluster: str


class GpuPublic(BaseModel):
    uuid: str
    index: int
    node: str
    model: str | None = None
    mig_profile: str | None = None
    memory_total_bytes: float | None = None
    last_seen: float | None = None
    current: dict[str, Any] | None = None
    job: GpuCurrentJob | None = None
    throttle: dict[str, Any] | None = None
    flags: list[dict[str, Any]] = Field(default_factory=list,
                                        description="open flags naming this GPU, most severe first")


class NodePublic(BaseModel):
    cluster: str
    name: str
    agent_version: str | None = None
    last_seen: float | None = None
    stale: bool
    labels: dict[str, Any]
    gpus: list[GpuPublic]
    flags: list[dict[str, Any]] = Field(default_factory=list,
                                        description="open flags on this node or its GPUs, most severe first")


class NodesPublic(BaseModel):
    data: list[NodePublic]
    count: int
    next_cursor: str | None = None


class EventPublic(BaseModel):
    ts: float
    kind: str
    code: int | None = None
    message: str
    gpu_uuid: str | None = None
    gpu_index: int | None = None


class NodeJob(BaseModel):
    job_id: str
    cluster: str
    user: str | None = None
    name: str | None = None
    state: str
    start_ts: float | None = None
    end_ts: float | None = Field(None, description="None while the job still holds a GPU here")
    gpus: int = Field(description="GPUs of this node the job held")


class NodeDetail(BaseModel):
    cluster: str
    name: str
    agent_version: str | None = None
    last_seen: float | None = None
    labels: dict[str, Any]
    gpus: list[GpuPublic]
    events: list[EventPublic]
    jobs: list[NodeJob] = Field(default_factory=list,
                                description="jobs that held its GPUs in the last 7 days, newest first")
    window_s: float
    flags: list[dict[str, Any]] = Field(default_factory=list,
                                        description="open flags on this node or its GPUs, most severe first")
    drain: dict[str, Any] | None = Field(None, description="drain advice when an open flag says to drain the node")


class NodeTimeseriesPublic(PerGpuSeries):
    """A node's GPUs over time (no job-aggregate line)."""


class GpuJob(BaseModel):
    job_id: str
    user: str | None = None
    name: str | None = None
    cluster: str
    start_ts: float | None = None
    end_ts: float | None = None


class GpuDetail(GpuPublic):
    cluster: str
    parent_uuid: str | None = None
    events: list[EventPublic]
    jobs: list[GpuJob]


class FleetSummary(BaseModel):
    window_s: float
    start: float
    end: float
    nodes: int
    gpus: int
    gpus_reporting: int = Field(description="GPUs with a rollup in the last 5 minutes")
    gpus_allocated: int
    current: dict[str, float | None]
    window: dict[str, float | None]
    wasted_gpu_hours: dict[str, float | None] = Field(description="cause (flag kind) -> GPU-hours in the window")
    wasted_gpu_hours_total: float | None = None
    wasted_by_workload: dict[str, dict[str, Any]] | None = Field(
        None, description="the ledger's waste split by workload: 'serving' (jobs with serving replica-minutes in "
                          "the window) and 'training' (every other job), each with jobs, allocated_gpu_hours, "
                          "productive_gpu_hours, wasted_gpu_hours_total and wasted_gpu_hours (by cause)")
    allocated_gpu_hours: float | None = Field(None, description="GPU-hours allocated to jobs in the window: the "
                                              "denominator of wasted_gpu_hours_total")
    open_flags: dict[str, int]
    top_jobs: list[dict[str, Any]]
    top_users: list[dict[str, Any]]
    goodput: dict[str, Any] | None = Field(None, description="fleet ETTR and badput by cause over the jobs "
                                             "that report progress (docs/progress.md)")


class Message(BaseModel):
    detail: str
