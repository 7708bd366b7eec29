"""One Settings: every variable documented from the models, read in one place, never written;
bad values named; flags over the environment; the Settings a command built reach the processes
it starts (``serve --workers 2``) without environment variables."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpufleet.settings import Settings, SettingsError

from .conftest import free_port

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ["gpufleet", "agent", "collector", "storage", "analysis", "alerts", "api", "migrations"]
VAR = re.compile(r"GPUFLEET_[A-Z0-9_]*[A-Z0-9]")


def product_files() -> list[Path]:
    return [p for d in PRODUCT for p in sorted((REPO / d).rglob("*.py"))]


def test_configuration_md_is_generated_from_the_models() -> None:
    from gpufleet.commands.config import DOC, updated

    text = DOC.read_text()
    assert updated(text) == text, "docs/configuration.md is out of date: run `gpufleet config docs`"


def test_every_variable_the_product_names_is_documented() -> None:
    from gpufleet.commands.config import render

    table = set(VAR.findall(render()))
    named: dict[str, set[str]] = {}
    for path in product_files():
        for name in VAR.findall(path.read_text()):
            named.setdefault(name, set()).add(str(path.relative_to(REPO)))
    # A prefix (code building "GPUFLEET_EXPORT_" + name) counts when documented names carry it.
    missing = {n: sorted(p) for n, p in named.items()
               if n not in table and not any(t.startswith(n + "_") for t in table)}
    assert not missing, f"GPUFLEET_* variables named in code but not in the settings models/docs: {missing}"


def test_no_process_writes_its_environment() -> None:
    """Settings are passed down, not smuggled through os.environ (``serve`` and ``worker`` used to)."""
    bad = []
    for path in product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            target = None
            if isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                target = next((t for t in targets if isinstance(t, ast.Subscript)
                               and ast.unparse(t.value) == "os.environ"), None)
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
                    "os.environ.update", "os.environ.setdefault", "os.putenv", "os.environ.pop"):
                target = node
            if target is not None:
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bad, f"environment writes in product code: {bad}"


def test_old_variable_names_keep_working() -> None:
    """The names deployments already set (docs before the sections existed) map onto the model."""
    env = {"GPUFLEET_DATABASE_URL": "postgresql://db/x", "GPUFLEET_DATA_DIR": "/d", "GPUFLEET_ALLOW_ANONYMOUS": "true",
           "GPUFLEET_REDIS_URL": "redis://r:6379/1", "GPUFLEET_PUBLIC_URL": "http://p", "GPUFLEET_GRAFANA_URL": "http://g",
           "GPUFLEET_ANALYSIS_INTERVAL_S": "7", "GPUFLEET_MAX_BODY_BYTES": "1000", "GPUFLEET_MAX_ROWS_PER_BATCH": "9",
           "GPUFLEET_THRESHOLDS": "/t.toml", "GPUFLEET_SLACK_WEBHOOK_URL": "http://hook", "GPUFLEET_ALERT_RULES": "/r",
           "GPUFLEET_GC_THRESHOLD": "0", "GPUFLEET_INGEST_QUEUE_ROWS": "5", "GPUFLEET_INGEST_GROUP_ROWS": "4",
           "GPUFLEET_INGEST_MAX_AGE_S": "60", "GPUFLEET_INGEST_MAX_FUTURE_S": "1", "GPUFLEET_INGEST_RETRY_AFTER_S": "3",
           "GPUFLEET_RETENTION_RAW_DAYS": "2", "GPUFLEET_RETENTION_ROLLUP_DAYS": "3",
           "GPUFLEET_MAINTENANCE_INTERVAL_S": "11", "GPUFLEET_RETENTION_INTERVAL_S": "12",
           "GPUFLEET_IMPORT_MAX_BYTES": "13", "GPUFLEET_ANALYSIS_CACHE_MB": "14", "GPUFLEET_ANALYSIS_LOCK_TTL_S": "15",
           "GPUFLEET_HOST": "0.0.0.0", "GPUFLEET_PORT": "9", "GPUFLEET_WORKERS": "3"}
    s = Settings.from_env(env)
    assert (s.database.url, str(s.database.data_dir), s.auth.allow_anonymous) == ("postgresql://db/x", "/d", True)
    assert (s.celery.redis_url, s.http.public_url, s.grafana.url) == ("redis://r:6379/1", "http://p", "http://g")
    assert (s.analysis.interval_s, s.http.max_body_bytes, s.http.max_rows_per_batch) == (7, 1000, 9)
    assert (str(s.analysis.thresholds), s.alerts.slack_webhook_url, str(s.alerts.rules)) == \
        ("/t.toml", "http://hook", "/r")
    assert s.gc.threshold == 0
    c = s.collector
    assert (c.queue_rows, c.group_rows, c.max_age_s, c.max_future_s, c.retry_after_s, c.import_max_bytes) == \
        (5, 4, 60, 1, 3, 13)
    m = s.maintenance
    assert (m.raw_days, m.rollup_days, m.interval_s, m.retention_interval_s) == (2, 3, 11, 12)
    assert (s.analysis.cache_mb, s.analysis.lock_ttl_s) == (14, 15)
    assert (s.http.host, s.http.port, s.http.workers) == ("0.0.0.0", 9, 3)
    assert "http://hook" not in repr(s), "the webhook is a secret"


def test_defaults_without_environment_and_empty_means_unset() -> None:
    s = Settings.from_env({"GPUFLEET_THRESHOLDS": "", "GPUFLEET_DATABASE_URL": ""})
    assert s == Settings.of({})
    assert s.analysis.thresholds is None and s.database.url is None
    assert s.analysis.interval_s == 60  # one default for beat and `up`
    assert s.celery.broker() == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(("env", "said"), [
    ({"GPUFLEET_PORT": "eighty"}, "GPUFLEET_PORT='eighty'"),
    ({"GPUFLEET_PORT": "70000"}, "GPUFLEET_PORT='70000'"),
    ({"GPUFLEET_INGEST_QUEUE_ROWS": "0"}, "GPUFLEET_INGEST_QUEUE_ROWS='0'"),
    ({"GPUFLEET_ALLOW_ANONYMOUS": "perhaps"}, "GPUFLEET_ALLOW_ANONYMOUS='perhaps'"),
])
def test_a_bad_value_names_its_variable(env: dict[str, str], said: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(said)):
        Settings.from_env(env)


def test_replace_validates_and_leaves_the_original() -> None:
    s = Settings.of({})
    t = s.replace(auth={"allow_anonymous": True}, collector={"queue_rows": 7})
    assert (t.auth.allow_anonymous, t.collector.queue_rows) == (True, 7)
    assert (s.auth.allow_anonymous, s.collector.queue_rows) == (False, 400_000)
    with pytest.raises(ValueError):
        s.replace(collector={"queue_rows": -1})
    with pytest.raises(ValueError, match="unknown settings sections"):
        s.replace(nope={"x": 1})


def test_command_flags_beat_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gpufleet.cli import build_parser
    from gpufleet.commands._db import settings_from_args
    from gpufleet.commands.serve import _flags

    monkeypatch.setenv("GPUFLEET_DATABASE_URL", "sqlite:////env.db")
    monkeypatch.setenv("GPUFLEET_PORT", "9001")
    monkeypatch.setenv("GPUFLEET_WORKERS", "3")
    args = build_parser().parse_args(["serve", "--database-url", f"sqlite:///{tmp_path}/flag.db", "--port", "9002",
                                      "--allow-anonymous"])
    s = settings_from_args(args, **_flags(args))
    assert s.database.url == f"sqlite:///{tmp_path}/flag.db"
    assert (s.http.port, s.http.workers, s.auth.allow_anonymous) == (9002, 3, True)


def test_bad_environment_stops_a_command_with_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["GPUFLEET_INGEST_QUEUE_ROWS"] = "lots"
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "migrate", "--data-dir", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "GPUFLEET_INGEST_QUEUE_ROWS='lots'" in r.stderr
    assert not (tmp_path / "gpufleet.db").exists(), "nothing was created with a bad configuration"


def test_celery_app_is_built_from_settings_not_at_import() -> None:
    code = ("import sys, gpufleet.celery_app as m; assert '_app' in vars(m) and m._app is None; "
            "from gpufleet.settings import Settings, settings_of; "
            "s = Settings.of({'celery': {'redis_url': 'redis://h:1/2'}, 'analysis': {'interval_s': 5}}); "
            "app = m.make_celery(s); assert settings_of(app) is s; assert app.conf.broker_url == 'redis://h:1/2'; "
            "assert app.conf.beat_schedule['analyze-due-jobs']['schedule'] == 5.0; print('ok')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.slow
def test_serve_workers_get_the_command_line_settings(sqlite_url: str, tmp_path: Path) -> None:
    """`serve --workers 2 --allow-anonymous --database-url X` with none of it in the environment:
    both spawned workers must serve anonymous reads from X (they used to read os.environ)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "serve", "--database-url", sqlite_url,
                             "--port", str(port), "--workers", "2", "--allow-anonymous"],
                            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        ok = 0
        while time.monotonic() < deadline and ok < 20:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs", timeout=5,
                              headers={"Connection": "close"})
            except httpx.HTTPError:
                time.sleep(0.3)
                continue
            assert r.status_code == 200, r.text  # anonymous allowed: the flag reached the worker
            ok += 1
        text = (tmp_path / "serve.log").read_text()
        assert ok == 20, text[-3000:]
        assert text.count("Started server process") == 2, text[-3000:]
        assert not (tmp_path / "gpufleet-data").exists(), "workers used the flag's database, not a default one"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
