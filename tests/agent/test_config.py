"""Agent configuration: defaults < TOML file < GPUFLEET_* environment < flags."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from gpufleet.agent.config import AgentConfig, env_name, load_config
from gpufleet.cli import build_parser
from gpufleet.commands.agent import config_from_args


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text('[agent]\ncollector_url = "http://file:1"\ninterval_s = 2.0\nflush_s = 20\ncluster = "file"\n')
    env = {"GPUFLEET_COLLECTOR_URL": "http://env:2", "GPUFLEET_FLUSH_S": "30"}
    cfg = load_config(f, env, {"collector_url": "http://flag:3", "interval_s": None})
    assert cfg.collector_url == "http://flag:3"  # flag beats env beats file
    assert cfg.flush_s == 30.0  # env beats file
    assert cfg.interval_s == 2.0  # file beats default; an absent flag (None) does not override
    assert cfg.cluster == "file"


def test_every_setting_has_an_env_twin() -> None:
    env = {}
    for f in dataclasses.fields(AgentConfig):
        env[env_name(f.name)] = {"collector_url": "http://x:1", "attributors": "slurm,process", "source": "nvml",
                                 "compress": "gzip", "metrics_addr": "127.0.0.1",
                                 "kubernetes_job_patterns": "none", "serving_pods": "kubelet",
                                 "serving_pods_url": "https://10.0.2.15:10250"}.get(f.name, "")
    # Fill the rest with values of the right type and check each one lands.
    samples = {int: "7", float: "11.5", bool: "false", Path: "/tmp/x", str: "abc"}
    hints = AgentConfig.__annotations__
    for f in dataclasses.fields(AgentConfig):
        if env[env_name(f.name)]:
            continue
        t = hints[f.name]
        for typ, val in samples.items():
            if typ.__name__ in str(t):
                env[env_name(f.name)] = val
                break
    env["GPUFLEET_SPOOL_MAX_BYTES"] = str(2**21)
    env["GPUFLEET_INTERVAL_S"], env["GPUFLEET_FLUSH_S"] = "1", "5"
    env["GPUFLEET_METRICS_PORT"] = "9500"
    cfg = load_config(None, env)
    assert cfg.collector_url == "http://x:1"
    assert cfg.attributors == ("slurm", "process")
    assert cfg.spool_max_bytes == 2**21 and cfg.metrics_port == 9500
    assert cfg.token == "abc" and cfg.node == "abc"
    assert cfg.fsync is False and cfg.spool_dir == Path("/tmp/x")
    assert cfg.kubernetes_job_patterns == ("none",)
    assert cfg.serving_pods == "kubelet" and cfg.serving_pods_url == "https://10.0.2.15:10250"


def test_token_env_twin_and_bad_values() -> None:
    assert load_config(None, {"GPUFLEET_AGENT_TOKEN": "s3cret"}).token == "s3cret"
    with pytest.raises(ValueError, match="interval_s"):
        load_config(None, {"GPUFLEET_INTERVAL_S": "fast"})
    with pytest.raises(ValueError, match="flush_s"):
        load_config(None, {"GPUFLEET_INTERVAL_S": "10", "GPUFLEET_FLUSH_S": "1"})
    with pytest.raises(ValueError, match="source"):
        load_config(None, {"GPUFLEET_SOURCE": "magic"})


def test_pod_job_patterns_from_env_and_a_bad_one_named() -> None:
    custom = load_config(None, {"GPUFLEET_KUBERNETES_JOB_PATTERNS": r"^(?P<job>.+)-\d+$, ^(?P<job>x)$"})
    assert custom.kubernetes_job_patterns == (r"^(?P<job>.+)-\d+$", "^(?P<job>x)$")
    kubeflow = r"-(?:master|worker|chief|ps|evaluator|launcher)-\d+$"
    assert load_config(None, {}).kubernetes_job_patterns[0].endswith(kubeflow)
    bad = r"^(.+)-\d+$"
    with pytest.raises(ValueError, match="has no") as e:
        load_config(None, {"GPUFLEET_KUBERNETES_JOB_PATTERNS": bad})
    assert repr(bad) in str(e.value)


def test_unknown_file_key_is_named(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text('colector_url = "http://x"\n')
    with pytest.raises(ValueError, match="colector_url"):
        load_config(f, {})


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["agent", *argv])


def test_cli_flags_map_onto_config(tmp_path: Path) -> None:
    cfg = config_from_args(_args("--collector", "http://c:9", "--token", "t", "--simulate", "3",
                                 "--spool-dir", str(tmp_path), "--interval", "0.5", "--flush", "5",
                                 "--attributors", "slurm", "--metrics-port", "0", "--no-gpm"), env={})
    assert (cfg.collector_url, cfg.token, cfg.simulate, cfg.source) == ("http://c:9", "t", 3, "simulator")
    assert cfg.spool_dir == tmp_path and cfg.interval_s == 0.5 and cfg.flush_s == 5.0
    assert cfg.attributors == ("slurm",) and cfg.metrics_port == 0 and cfg.gpm is False


def test_cli_simulate_without_count_means_one() -> None:
    cfg = config_from_args(_args("--simulate"), env={})
    assert cfg.simulate == 1 and cfg.source == "simulator"


def test_cli_env_twin_for_simulate_and_source() -> None:
    cfg = config_from_args(_args(), env={"GPUFLEET_SIMULATE": "2", "GPUFLEET_COLLECTOR_URL": "http://e:1"})
    assert cfg.simulate == 2 and cfg.source == "simulator" and cfg.collector_url == "http://e:1"
    cfg = config_from_args(_args(), env={"GPUFLEET_SOURCE": "dcgm-exporter"})
    assert cfg.source == "dcgm-exporter"
