"""Agent configuration: one dataclass, filled from defaults < TOML file < GPUFLEET_* env < flags.

Every field has an environment twin ``GPUFLEET_<FIELD>`` (two historical spellings are
kept as aliases: ``GPUFLEET_COLLECTOR_URL`` and ``GPUFLEET_AGENT_TOKEN``), so a node can be
configured entirely from a systemd unit or a Kubernetes DaemonSet without a file.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gpufleet.pod_jobs import DEFAULT_PATTERNS as DEFAULT_POD_JOB_PATTERNS
from gpufleet.pod_jobs import PodJobs

GIB = 1024**3
SOURCES = ("nvml", "dcgm-exporter", "simulator")
ATTRIBUTORS = ("slurm", "kubernetes", "process")
SERVING_PODS = ("off", "kubelet", "apiserver")


def _default_spool() -> Path:
    # /var/lib is right for a root daemon; an unprivileged user gets a per-user cache dir.
    if os.geteuid() == 0:
        return Path("/var/lib/gpufleet/spool")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpufleet" / "spool"


@dataclass
class AgentConfig:
    collector_url: str = "http://127.0.0.1:8000"
    token: str | None = field(default=None, repr=False)  # never in logs or tracebacks
    node: str = field(default_factory=socket.gethostname)
    cluster: str = "default"
    interval_s: float = 1.0
    flush_s: float = 10.0
    spool_dir: Path = field(default_factory=_default_spool)
    spool_max_bytes: int = GIB
    spool_memory_max_bytes: int = 64 * 1024**2  # batches held in memory while the disk refuses writes
    # sources
    source: str = "auto"  # nvml | dcgm-exporter | simulator | auto (nvml when a GPU answers)
    simulate: int = 0  # simulated nodes (with source=simulator): named after `node` when it is set, else sim-node-NNN
    gpus_per_node: int = 8
    dcgm_exporter_url: str = "http://localhost:9400/metrics"
    infiniband: bool = True  # add IB/RoCE rates from sysfs when HCAs exist
    nic_health: bool = True  # IB/RoCE port errors, congestion, rate and state every 10 s (docs/nccl.md)
    nccl_inspector_dir: Path | None = None  # NCCL Inspector output, searched recursively (docs/nccl.md)
    gpm: bool = True  # Hopper+ GPM profiling metrics through NVML
    xid_events: bool = True
    # attribution (comma list in env/flags): slurm, kubernetes, process; "auto" = all that apply
    attributors: tuple[str, ...] = ("auto",)
    slurm_mapping_dir: Path = Path("/var/run/gpufleet/jobs")
    gpustat_dir: Path = Path("/run/gpustat")
    kubelet_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    # the kubelet's pod log dirs (<namespace>_<pod>_<uid>): name the pods that the cgroup
    # fallback finds only by UID when the kubelet's API does not answer
    pod_log_dir: Path = Path("/var/log/pods")
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    attribution_ttl_s: float = 5.0  # re-ask the kubelet / re-read /proc at most this often
    # pod-name patterns whose (?P<job>...) group names a multi-pod job (gpufleet/pod_jobs.py);
    # "none" = every pod its own job
    kubernetes_job_patterns: tuple[str, ...] = DEFAULT_POD_JOB_PATTERNS
    # the progress relay's socket is 0660 (not world-writable: a local user could forge windows
    # or flood the relay); this group may write to it too, e.g. the training users' group.
    # None = the agent's own group only (GPUFLEET_PROGRESS_SOCKET_GROUP)
    progress_socket_group: str | None = None
    # serving engines' own metrics (docs/serving.md): rules as JSON, [{"job", "engine", "port", ...}]
    serving_rules: str | None = None
    serving_discover: bool = False  # probe the listening ports of the jobs' processes (Slurm, bare)
    # the pods on this node and their gpufleet.io/serving-* annotations (agent/sources/kubelet_pods.py):
    # off | kubelet (https://<node>:10250/pods) | apiserver (/api/v1/pods?fieldSelector=spec.nodeName=<node>)
    serving_pods: str = "off"
    serving_pods_url: str | None = None  # None: https://<node>:10250, or the in-cluster API server
    serving_pods_token_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    serving_pods_ca_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    serving_pods_insecure_skip_tls_verify: bool = False  # only when explicitly asked
    # delivery
    timeout_s: float = 10.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    retry_after_max_s: float = 300.0
    compress: str = "zstd"  # zstd | gzip | none
    # samples as binary columns (protocol.Packed): far cheaper for the collector. Off = the
    # list form, for a collector older than the packed form (upgrade collectors first).
    packed: bool = True
    fsync: bool = True  # fsync spool files: survives power loss, costs one fsync per flush
    # local Prometheus endpoint (None = off)
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    metrics_dcgm_names: bool = False  # also expose DCGM_FI_* names, to stand in for dcgm-exporter
    # Whether `node` came from a flag, the environment or a file rather than the hostname
    # default (set by load_config; not a setting): simulated nodes take their names from it.
    node_given: ClassVar[bool] = False

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting and what to do about it."""
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 (got {self.interval_s})")
        if self.flush_s < self.interval_s:
            raise ValueError(f"flush_s ({self.flush_s}) must be >= interval_s ({self.interval_s})")
        if self.source not in (*SOURCES, "auto"):
            raise ValueError(f"source {self.source!r}: use one of {', '.join(SOURCES)} or auto")
        bad = [a for a in self.attributors if a not in (*ATTRIBUTORS, "auto", "none")]
        if bad:
            raise ValueError(f"attributors {bad}: use any of {', '.join(ATTRIBUTORS)}, auto or none")
        if self.spool_max_bytes < 1024 * 1024:
            raise ValueError(f"spool_max_bytes {self.spool_max_bytes} is below 1 MiB")
        if self.compress not in ("zstd", "gzip", "none"):
            raise ValueError(f"compress {self.compress!r}: use zstd, gzip or none")
        PodJobs(self.kubernetes_job_patterns)  # ValueError names the pattern and what is wrong
        if self.serving_pods not in SERVING_PODS:
            raise ValueError(f"serving_pods {self.serving_pods!r}: use one of {', '.join(SERVING_PODS)}")
        if self.serving_pods_url is not None and not self.serving_pods_url.startswith(("http://", "https://")):
            raise ValueError(f"serving_pods_url {self.serving_pods_url!r} must start with https:// (or http://)")
        if not self.collector_url.startswith(("http://", "https://")):
            raise ValueError(f"collector_url {self.collector_url!r} must start with http:// or https://")


ENV_PREFIX = "GPUFLEET_"
ENV_ALIASES = {"collector_url": ("GPUFLEET_COLLECTOR_URL", "GPUFLEET_COLLECTOR"),
               "token": ("GPUFLEET_AGENT_TOKEN", "GPUFLEET_TOKEN")}


def env_name(name: str) -> str:
    return ENV_ALIASES.get(name, (ENV_PREFIX + name.upper(),))[0]


# One line per setting for docs/configuration.md (``gpufleet config docs``); a test fails when a
# field has none. Defaults that depend on the machine say so here instead of showing a value.
FIELD_DOCS: dict[str, str] = {
    "collector_url": "collector base URL",
    "token": "bearer token (`gpufleet token create --role agent`); a secret",
    "node": "node name (default: the hostname)",
    "cluster": "cluster name",
    "interval_s": "sample period",
    "flush_s": "batch period (>= interval_s)",
    "spool_dir": "durable spool (default `/var/lib/gpufleet/spool` as root, else `~/.cache/gpufleet/spool`)",
    "spool_max_bytes": "spool size bound: the oldest batches are dropped (and counted) beyond it",
    "spool_memory_max_bytes": "batches held in memory while the disk refuses writes",
    "source": "`nvml`, `dcgm-exporter`, `simulator` or `auto` (NVML when a GPU answers)",
    "simulate": "simulated nodes (with source simulator)",
    "gpus_per_node": "GPUs per simulated node",
    "dcgm_exporter_url": "dcgm-exporter `/metrics` URL (source dcgm-exporter)",
    "infiniband": "add IB/RoCE rates from sysfs when HCAs exist",
    "nic_health": "IB/RoCE port errors, congestion, rate and state every 10 s (docs/nccl.md)",
    "nccl_inspector_dir": "NCCL Inspector output, searched recursively (docs/nccl.md)",
    "gpm": "Hopper+ GPM profiling metrics through NVML",
    "xid_events": "XID error events through NVML",
    "attributors": "comma list of `slurm`, `kubernetes`, `process`, or `auto` / `none`",
    "slurm_mapping_dir": "job mapping dir the Slurm prolog writes (scripts/slurm/prolog.sh)",
    "gpustat_dir": "Princeton jobstats-style `/run/gpustat` dir",
    "kubelet_socket": "kubelet pod-resources socket",
    "pod_log_dir": "the kubelet's pod log dir (`<namespace>_<pod>_<uid>` entries): names the pods found by cgroup "
                   "UID when the kubelet socket does not answer (docs/agent.md)",
    "proc_root": "where /proc is (tests, containers)",
    "sys_root": "where /sys is (tests, containers)",
    "attribution_ttl_s": "re-ask the kubelet / re-read /proc at most this often",
    "kubernetes_job_patterns": "comma list of pod-name regexes whose `(?P<job>...)` group names the job a pod "
                               "belongs to (default: Kubeflow training operator and JobSet names; `none`: "
                               "one job per pod; docs/agent.md)",
    "progress_socket_group": "group that may also write to the progress relay's socket (0660; unset = the "
                             "agent's own group)",
    "serving_rules": "JSON list of `{\"job\": glob, \"engine\", \"port\", \"path\"?, \"deployment\"?}`: scrape "
                     "that port of the jobs on this node as a serving replica (docs/serving.md)",
    "serving_discover": "scrape the listening TCP ports of the jobs' GPU processes that answer as a serving "
                        "engine's `/metrics` (Slurm, bare processes; docs/serving.md)",
    "serving_pods": "list this node's pods and scrape those annotated `gpufleet.io/serving-engine`: `off`, "
                    "`kubelet` (its `/pods`; RBAC get `nodes/pods`) or `apiserver` (RBAC list `pods`; docs/serving.md)",
    "serving_pods_url": "base URL the pods are listed from (unset: `https://<node>:10250` for `kubelet`, the "
                        "in-cluster API server for `apiserver`)",
    "serving_pods_token_file": "service-account bearer token sent when listing pods (read again on each listing)",
    "serving_pods_ca_file": "CA that signed the kubelet's or API server's serving certificate",
    "serving_pods_insecure_skip_tls_verify": "list pods without verifying the server's certificate (kubelets with "
                                             "self-signed serving certificates; only when asked for)",
    "timeout_s": "HTTP timeout per push",
    "backoff_base_s": "first retry delay after a failed push (doubles up to backoff_max_s)",
    "backoff_max_s": "longest retry delay",
    "retry_after_max_s": "largest Retry-After the agent honours",
    "compress": "`zstd`, `gzip` or `none`",
    "packed": "samples as binary columns (docs/protocol.md); false only for a collector older than the packed form",
    "fsync": "fsync spool files: survives power loss, costs one fsync per flush",
    "metrics_port": "serve the agent's `/metrics` on this port (unset = off)",
    "metrics_addr": "address for `/metrics`",
    "metrics_dcgm_names": "also expose `DCGM_FI_*` names on `/metrics` (stand in for dcgm-exporter)",
}


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(AgentConfig)


def coerce(name: str, raw: Any) -> Any:
    """Turn a string/TOML value into the type the field declares; ValueError says which field."""
    hint = _hints()[name]
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if isinstance(hint, types.UnionType) else hint
    if raw is None or (optional and isinstance(raw, str) and raw.strip().lower() in ("", "none", "null")):
        if optional:
            return None
        raise ValueError(f"{name}: a value is required")
    try:
        if base is bool:
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {raw!r}")
        if base is int:
            return int(float(raw)) if isinstance(raw, str) and any(c in raw for c in ".eE") else int(raw)
        if base is float:
            return float(raw)
        if base is Path:
            return Path(str(raw)).expanduser()
        if typing.get_origin(base) is tuple:
            items = raw.split(",") if isinstance(raw, str) else list(raw)
            return tuple(s.strip() for s in items if str(s).strip())
        return str(raw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: {e}") from None


def from_mapping(values: Mapping[str, Any], origin: str) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(AgentConfig)}
    out: dict[str, Any] = {}
    for k, v in values.items():
        key = k.replace("-", "_")
        if key not in names:
            raise ValueError(f"{origin}: unknown agent setting {k!r} (known: {', '.join(sorted(names))})")
        out[key] = coerce(key, v)
    return out


def from_file(path: Path) -> dict[str, Any]:
    """Read a TOML file: keys at top level or under ``[agent]``."""
    data = tomllib.loads(Path(path).read_text())
    if "agent" in data and isinstance(data["agent"], dict):
        data = data["agent"]
    return from_mapping(data, str(path))


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(AgentConfig):
        for var in ENV_ALIASES.get(f.name, (ENV_PREFIX + f.name.upper(),)):
            if var in env:
                out[f.name] = coerce(f.name, env[var])
                break
    return out


def load_config(file: Path | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> AgentConfig:
    """Defaults < file < environment < explicit overrides (command-line flags)."""
    merged: dict[str, Any] = {}
    if file is not None:
        merged.update(from_file(file))
    merged.update(from_env(os.environ if env is None else env))
    if overrides:
        merged.update(from_mapping({k: v for k, v in overrides.items() if v is not None}, "flags"))
    cfg = AgentConfig(**merged)
    cfg.node_given = "node" in merged  # type: ignore[misc]  # per instance, see AgentConfig.node_given
    cfg.validate()
    return cfg
