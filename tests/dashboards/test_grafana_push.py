"""`gpufleet grafana push` against a real local HTTP server that answers the few Grafana API
calls it makes and records them (Grafana itself cannot be installed here)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.cli import main
from gpufleet.commands import grafana as cmd

from .conftest import DASHBOARDS

DS_URL = "postgresql://gpufleet_grafana:s3cr%40t@db.internal:6543/gpufleet?sslmode=verify-full"


class FakeGrafana(ThreadingHTTPServer):
    """State: data sources and folders by uid, dashboards by uid; every request recorded."""

    def __init__(self, status: int | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.calls: list[dict[str, Any]] = []
        self.datasources: dict[str, dict[str, Any]] = {}
        self.folders: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.force_status = status

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeGrafana

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        s = self.server
        s.calls.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"),
                        "body": body})
        if s.force_status:
            return self._reply(s.force_status, {"message": "invalid API key"})
        m, p = self.command, self.path
        if m == "GET" and p.startswith("/api/datasources/uid/"):
            uid = p.rsplit("/", 1)[1]
            if uid in s.datasources:
                return self._reply(200, s.datasources[uid])
            return self._reply(404, {"message": "Data source not found"})
        if m == "POST" and p == "/api/datasources":
            s.datasources[body["uid"]] = {**body, "id": 7, "version": 1}
            return self._reply(200, {"id": 7, "message": "Datasource added", "datasource": body})
        if m == "PUT" and p.startswith("/api/datasources/uid/"):
            s.datasources[p.rsplit("/", 1)[1]] = {**body, "version": body["version"] + 1}
            return self._reply(200, {"message": "Datasource updated"})
        if m == "GET" and p.startswith("/api/folders/"):
            uid = p.rsplit("/", 1)[1]
            if uid in s.folders:
                return self._reply(200, s.folders[uid])
            return self._reply(404, {"message": "folder not found"})
        if m == "POST" and p == "/api/folders":
            s.folders[body["uid"]] = body
            return self._reply(200, {"uid": body["uid"], "title": body["title"], "id": 3})
        if m == "POST" and p == "/api/dashboards/db":
            d = body["dashboard"]
            s.dashboards[d["uid"]] = body
            return self._reply(200, {"status": "success", "uid": d["uid"], "url": f"/d/{d['uid']}/x", "version": 1})
        return self._reply(404, {"message": f"unexpected {m} {p}"})

    do_GET = do_POST = do_PUT = _handle


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    srv = FakeGrafana()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _push(srv: FakeGrafana, *extra: str) -> int:
    return main(["grafana", "push", "--url", srv.url, "--token", "glsa_t0ken", "--datasource-url", DS_URL,
                 *extra])


def test_push_creates_datasource_folder_and_every_dashboard(grafana: FakeGrafana) -> None:
    assert _push(grafana) == 0
    assert [(c["method"], c["path"]) for c in grafana.calls] == [
        ("GET", "/api/datasources/uid/gpufleet-pg"),
        ("POST", "/api/datasources"),
        ("GET", "/api/folders/gpufleet"),
        ("POST", "/api/folders"),
        *[("POST", "/api/dashboards/db")] * 5,
    ]
    assert {c["auth"] for c in grafana.calls} == {"Bearer glsa_t0ken"}
    ds = grafana.calls[1]["body"]
    assert ds["uid"] == "gpufleet-pg" and ds["type"] == "grafana-postgresql-datasource"
    assert ds["url"] == "db.internal:6543" and ds["user"] == "gpufleet_grafana"
    assert ds["jsonData"]["database"] == "gpufleet" and ds["jsonData"]["sslmode"] == "verify-full"
    assert ds["secureJsonData"] == {"password": "s3cr@t"}
    assert grafana.calls[3]["body"] == {"title": "gpufleet", "uid": "gpufleet"}
    # Each dashboard goes up exactly as committed (id cleared so Grafana matches on uid).
    for f in sorted((DASHBOARDS / "json").glob("*.json")):
        want = json.loads(f.read_text())
        sent = grafana.dashboards[want["uid"]]
        assert sent["dashboard"] == {**want, "id": None}
        assert sent["folderUid"] == "gpufleet" and sent["overwrite"] is True


def test_second_push_updates_in_place(grafana: FakeGrafana) -> None:
    assert _push(grafana) == 0
    grafana.calls.clear()
    assert _push(grafana) == 0
    methods = [(c["method"], c["path"]) for c in grafana.calls]
    assert ("PUT", "/api/datasources/uid/gpufleet-pg") in methods
    assert ("POST", "/api/datasources") not in methods and ("POST", "/api/folders") not in methods
    put = next(c for c in grafana.calls if c["method"] == "PUT")
    assert put["body"]["id"] == 7 and put["body"]["version"] == 1


def test_basic_auth_and_dashboards_only(grafana: FakeGrafana) -> None:
    assert main(["grafana", "push", "--url", grafana.url, "--token", "admin:admin", "--no-datasource"]) == 0
    assert not any("datasources" in c["path"] for c in grafana.calls)
    assert grafana.calls[0]["auth"].startswith("Basic ")
    assert len(grafana.dashboards) == 5


def test_rejected_token_fails_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    srv = FakeGrafana(status=401)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        assert _push(srv) == 1
    finally:
        srv.shutdown()
        srv.server_close()
    err = capsys.readouterr().err
    assert "401" in err and "--token" in err


def test_missing_arguments_say_what_to_pass(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    for var in ("GRAFANA_URL", "GPUFLEET_GRAFANA_URL", "GRAFANA_TOKEN", "GPUFLEET_GRAFANA_DATASOURCE_URL"):
        monkeypatch.delenv(var, raising=False)
    assert main(["grafana", "push", "--url", "http://127.0.0.1:9", "--token", "x"]) == 2
    assert "--datasource-url" in capsys.readouterr().err
    assert main(["grafana", "push", "--url", "http://127.0.0.1:9", "--token", "x",
                 "--datasource-url", "mysql://h/db"]) == 2
    assert "postgresql://" in capsys.readouterr().err


def test_dry_run_hides_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grafana", "push", "--dry-run", "--datasource-url", DS_URL]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["datasource"]["secureJsonData"] == {"password": "***"}
    assert out["dashboards"] == ["gpufleet-fleet", "gpufleet-goodput", "gpufleet-job", "gpufleet-nodes",
                                 "gpufleet-waste"]


def test_unreachable_grafana_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["grafana", "push", "--url", url, "--token", "x", "--no-datasource", "--timeout", "3"]) == 1
    assert "cannot reach Grafana" in capsys.readouterr().err


def test_provisioning_files_agree_with_push_and_dashboards() -> None:
    from gpufleet_dashboards import DATASOURCE_TYPE, DATASOURCE_UID

    ds_yaml = yaml.safe_load((DASHBOARDS / "provisioning/datasources/gpufleet.yaml").read_text())
    (ds,) = ds_yaml["datasources"]
    assert (ds["uid"], ds["type"]) == (DATASOURCE_UID, DATASOURCE_TYPE) == (cmd.DATASOURCE_UID, cmd.DATASOURCE_TYPE)
    assert ds["user"] == cmd.GRAFANA_ROLE
    pushed = cmd.datasource_payload(DS_URL)
    assert set(ds["jsonData"]) == set(pushed["jsonData"])
    assert ds["jsonData"]["timeInterval"] == pushed["jsonData"]["timeInterval"] == "1m"
    prov = yaml.safe_load((DASHBOARDS / "provisioning/dashboards/gpufleet.yaml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["folderUid"] == cmd.FOLDER_UID
    assert Path(provider["options"]["path"]).is_absolute()
    assert cmd.DEFAULT_DASHBOARDS == DASHBOARDS / "json"
