"""Silences through the real API (uvicorn + token auth) and the CLI; `gpufleet alerts test`
against the local Slack stand-in."""

from __future__ import annotations

import json

import httpx
import pytest

from gpufleet.cli import main


def test_silence_api_needs_operator_and_validates(sqlite_url, live_server) -> None:  # type: ignore[no-untyped-def]
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.tokens import create_token

    e = make_engine(sqlite_url)
    viewer = create_token(e, "v", "viewer")
    op = create_token(e, "op", "operator")
    e.dispose()
    srv = live_server(sqlite_url, allow_anonymous=False)
    api = f"{srv.url}/api/v1/alerts"
    body = {"user": "alice", "flag": "idle_gpu", "expires_in": "2h", "reason": "known, fixing loader"}
    with httpx.Client(timeout=10) as c:
        assert c.post(f"{api}/silences", json=body).status_code == 401
        assert c.post(f"{api}/silences", json=body, headers={"Authorization": f"Bearer {viewer}"}).status_code == 403
        auth = {"Authorization": f"Bearer {op}"}
        r = c.post(f"{api}/silences", json=body, headers=auth)
        assert r.status_code == 201, r.text
        s = r.json()
        assert s["user"] == "alice" and s["kind"] == "idle_gpu" and s["created_by"] == "op"
        assert 7100 < s["expires_at"] - s["created_at"] <= 7200
        for bad in ({"reason": "x"}, {**body, "flag": "nope"}, {**body, "expires_in": "later"},
                    {**body, "expires_in": "400d"}):
            assert c.post(f"{api}/silences", json=bad, headers=auth).status_code == 422, bad
        listed = c.get(f"{api}/silences", headers={"Authorization": f"Bearer {viewer}"}).json()
        assert [x["id"] for x in listed] == [s["id"]]
        assert c.delete(f"{api}/silences/{s['id']}", headers=auth).json()["expired"] is True
        assert c.get(f"{api}/silences", headers=auth).json() == []
        assert c.delete(f"{api}/silences/{s['id']}", headers=auth).status_code == 404
        assert c.get(f"{api}", headers=auth).json() == []
        assert c.get(f"{api}/outbox", headers={"Authorization": f"Bearer {viewer}"}).status_code == 403


def test_cli_silences(sqlite_url, capsys) -> None:  # type: ignore[no-untyped-def]
    db = ["--database-url", sqlite_url]
    assert main(["alerts", "silence", "add", "--job", "123", "--cluster", "default", "--expires", "1h",
                 "--reason", "benchmark run", "--by", "carol", *db]) == 0
    row = json.loads(capsys.readouterr().out.strip())
    assert row["job"] == "123" and row["created_by"] == "carol"
    assert main(["alerts", "silence", "add", "--reason", "everything", *db]) == 2  # no matcher
    assert main(["alerts", "silence", "list", *db]) == 0
    assert json.loads(capsys.readouterr().out.strip())["id"] == row["id"]
    assert main(["alerts", "silence", "expire", str(row["id"]), *db]) == 0
    capsys.readouterr()
    assert main(["alerts", "silence", "list", *db]) == 0
    assert capsys.readouterr().out.strip() == ""


def test_cli_test_message_reaches_the_webhook(fake_slack, capsys) -> None:  # type: ignore[no-untyped-def]
    fake_slack.script = [429]
    fake_slack.retry_after = "0.2"
    assert main(["alerts", "test", "--webhook", fake_slack.url, "--timeout", "2"]) == 0
    (post,) = fake_slack.delivered()
    assert post.body["text"].startswith("gpufleet test message")
    assert len(post.body["blocks"]) <= 50
    assert "sent: HTTP 200" in capsys.readouterr().out


def test_cli_test_message_reports_permanent_failure(fake_slack, capsys) -> None:  # type: ignore[no-untyped-def]
    fake_slack.script = [404]
    assert main(["alerts", "test", "--webhook", fake_slack.url]) == 1
    assert "no_service" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["alerts", "check", "--rules", "alerts/rules.example.yaml"],
                                  ["alerts", "test", "--print"]])
def test_cli_check_and_print(args, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(args) == 0
    assert capsys.readouterr().out
