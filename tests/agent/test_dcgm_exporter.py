"""dcgm-exporter source: every captured dump in ../shared/fixtures/dcgm-exporter, MIG and
label variants, counters turned into rates, and a scrape over real HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufleet.agent.sources.dcgm_exporter import DcgmExporterSource, parse_exposition
from gpufleet.catalog import CATALOG
from tests.conftest import shared_fixture

DUMPS = ["datadog-integrations-metrics.txt", "h100-k8s-issue490.txt", "readme-k8s-example.txt"]


@pytest.mark.parametrize("name", DUMPS)
def test_every_captured_dump_parses_into_valid_catalog_values(name: str) -> None:
    gpus = parse_exposition(shared_fixture("dcgm-exporter", name).read_text())
    assert gpus, "each dump has at least one GPU"
    for g in gpus.values():
        assert g.uuid.startswith("GPU-")
        for field, value in g.values.items():
            assert CATALOG[field].check(value) is None, (name, field, value)


def test_datadog_dump_scales_units_and_skips_label_less_series() -> None:
    gpus = parse_exposition(shared_fixture("dcgm-exporter", "datadog-integrations-metrics.txt").read_text())
    t4 = gpus["GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"]
    assert t4.model == "Tesla T4" and t4.index == 0
    assert t4.values["power_w"] == pytest.approx(8.969)
    assert t4.values["energy_j"] == pytest.approx(128996.013)  # mJ counter -> J
    assert t4.values["gpu_util"] == 0.0 and t4.values["fb_used_bytes"] == 0.0
    assert t4.info().memory_total_bytes == 15109 * 2**20  # used + free
    other = gpus["GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"]
    assert other.values["fb_total_bytes"] == 15109 * 2**20
    assert other.values["clock_event_reasons"] == 1.0  # old name DCGM_FI_DEV_CLOCK_THROTTLE_REASONS
    # label-less dummies (FAN_SPEED, PROF_SM_ACTIVE 0, ...) have no GPU: they are not rows
    assert all(k.startswith("GPU-") for k in gpus)


def test_pod_labels_become_attribution_and_empty_ones_do_not() -> None:
    gpus = parse_exposition(shared_fixture("dcgm-exporter", "h100-k8s-issue490.txt").read_text())
    g0 = gpus["GPU-8b2281de-6d3c-22ed-0ec8-d3b864870b8b"]
    g1 = gpus["GPU-15338f3e-5fd9-962d-921a-979b820520f0"]
    assert g0.job is not None and g0.job.job_id == "default/dcgmproftester2"
    assert g0.job.source == "kubernetes" and g0.job.labels["container"] == "dcgmproftester2"
    assert g1.job is None
    readme = parse_exposition(shared_fixture("dcgm-exporter", "readme-k8s-example.txt").read_text())
    (g,) = readme.values()
    assert g.job is None, 'pod="" is no attribution'
    assert g.values["sm_clock_mhz"] == 139.0  # spaces after commas in the label set


_H100 = 'gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",hostname="n1"'
VARIANTS = f"""\
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{{{_H100},GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",hpc_job="4242"}} 0.25
DCGM_FI_PROF_SM_ACTIVE{{{_H100},GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",hpc_job="4243"}} 0.75
# TYPE DCGM_FI_PROF_SM_UTIL_RATIO gauge
DCGM_FI_PROF_SM_UTIL_RATIO{{gpu="1",UUID="GPU-bbbb",pod_name="old-pod",pod_namespace="ml",container_name="c"}} 0.5
# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{gpu="1",UUID="GPU-bbbb"}} 68
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-bbbb"}} 87
# TYPE DCGM_FI_DEV_MEM_COPY_UTIL gauge
DCGM_FI_DEV_MEM_COPY_UTIL{{gpu="1",UUID="GPU-bbbb"}} NaN
# TYPE DCGM_FI_PROF_PCIE_TX_BYTES counter
DCGM_FI_PROF_PCIE_TX_BYTES{{gpu="1",UUID="GPU-bbbb"}} %d
"""


def test_mig_and_label_variants() -> None:
    gpus = parse_exposition(VARIANTS % 1000)
    a = gpus["MIG-aaaa-gi9"]
    assert a.mig_profile == "1g.10gb" and a.parent_uuid == "GPU-aaaa" and a.values["sm_active"] == 0.25
    assert a.job is not None and a.job.job_id == "4242" and a.job.source == "slurm"
    assert gpus["MIG-aaaa-gi2"].values["sm_active"] == 0.75 and gpus["MIG-aaaa-gi2"].job.job_id == "4243"
    b = gpus["GPU-bbbb"]
    assert b.values["sm_active"] == 0.5  # DCGM 4.6 name
    assert b.values["clock_event_reasons"] == 68.0  # DCGM 4.6 name
    assert b.values["gpu_util"] == pytest.approx(0.87)  # % -> ratio
    assert "mem_copy_util" not in b.values, "NaN is 'no value', not a sample"
    assert b.job is not None and b.job.job_id == "ml/old-pod"  # dcgm-exporter 1.x label names
    assert "pcie_tx_bytes_s" not in b.values and b.counters["pcie_tx_bytes_s"] == 1000.0



JOBSET = """\
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",pod="llm-node-0-0-x7k2p",namespace="ml",container="trainer"} 90
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1",pod="llm-node-0-1-q2w3e",namespace="ml",container="trainer"} 80
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-2",pod="llm-node-0-2-r4t5y",namespace="ml",gpufleet_job="override"} 70
"""


def test_a_jobsets_pods_scrape_as_one_job_unless_told_otherwise() -> None:
    from gpufleet.pod_jobs import PodJobs

    gpus = parse_exposition(JOBSET)
    assert {u: g.job.job_id for u, g in gpus.items() if g.job} == {
        "GPU-0": "ml/llm", "GPU-1": "ml/llm", "GPU-2": "override"}  # an explicit relabel wins
    assert gpus["GPU-0"].job == gpus["GPU-1"].job, "one description of the job from every pod"
    apart = parse_exposition(JOBSET, PodJobs(("none",)))
    assert apart["GPU-1"].job is not None and apart["GPU-1"].job.job_id == "ml/llm-node-0-1-q2w3e"

class Exporter:
    def __init__(self) -> None:
        self.body = ""
        self.fail = False
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if outer.fail:
                    self.send_error(500)
                    return
                data = outer.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/metrics"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    yield e
    e.httpd.shutdown()
    e.httpd.server_close()


def test_source_scrapes_over_http_turns_counters_into_rates(exporter: Exporter) -> None:
    src = DcgmExporterSource(exporter.url)
    try:
        exporter.body = VARIANTS % 1_000_000
        assert {d.uuid for d in src.devices()} == {"MIG-aaaa-gi9", "MIG-aaaa-gi2", "GPU-bbbb"}
        first = {r.uuid: r.values for r in src.read(100.0)}
        assert "pcie_tx_bytes_s" not in first["GPU-bbbb"], "a rate needs two scrapes"
        exporter.body = VARIANTS % 3_000_000
        second = {r.uuid: r.values for r in src.read(102.0)}
        assert second["GPU-bbbb"]["pcie_tx_bytes_s"] == pytest.approx(1_000_000.0)
        a = src.attribution(102.0)
        assert a.gpu_job == {"MIG-aaaa-gi9": "4242", "MIG-aaaa-gi2": "4243", "GPU-bbbb": "ml/old-pod"}
        exporter.body = VARIANTS % 10  # counter reset (exporter restart): no negative rate
        assert "pcie_tx_bytes_s" not in {r.uuid: r.values for r in src.read(104.0)}["GPU-bbbb"]
        exporter.fail = True
        assert src.read(106.0) == [] and src.errors == 1, "an exporter outage is counted, not raised"
    finally:
        src.close()


def test_xid_changes_become_events(exporter: Exporter) -> None:
    src = DcgmExporterSource(exporter.url)
    try:
        tmpl = '# TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-x"} %d\n'
        exporter.body = tmpl % 0
        src.read(1.0)
        exporter.body = tmpl % 48
        src.read(2.0)
        src.read(3.0)
        ev = src.drain_events()
        assert [(e.kind, e.code, e.gpu_uuid) for e in ev] == [("xid", 48, "GPU-x")]
    finally:
        src.close()


@pytest.mark.parametrize("name", ["default-counters.csv", "dcp-metrics-included.csv"])
def test_every_counter_the_exporter_ships_maps_as_the_catalog_says(name: str) -> None:
    """Render the shipped counter list as an exposition (one GPU, value 1) and check each
    field the catalog knows lands in its catalog field with the catalog's scale."""
    lines, expected = [], {}
    for raw in shared_fixture("dcgm-exporter", name).read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        field, kind = (p.strip() for p in raw.split(",")[:2])
        if kind not in ("gauge", "counter"):
            continue  # "label" rows are labels, not series
        lines += [f"# TYPE {field} {kind}", f'{field}{{gpu="0",UUID="GPU-csv"}} 1']
        f = CATALOG.by_dcgm_name().get(field)
        if f is not None:
            expected[f.name] = (f.dcgm_scale, kind)
    (g,) = parse_exposition("\n".join(lines) + "\n").values()
    assert expected, "the shipped lists name catalog fields"
    for fname, (scale, kind) in expected.items():
        if kind == "counter" and CATALOG[fname].unit.endswith("/s"):
            assert g.counters[fname] == pytest.approx(scale)
        else:
            assert g.values[fname] == pytest.approx(scale), fname
    assert set(g.values) | set(g.counters) == set(expected)
