"""The API serves the flag-kind registry and takes its enum from it (never a copy)."""

from __future__ import annotations

import httpx

from gpufleet.flagkinds import FLAG_KINDS, flag_kinds


def test_flag_kinds_endpoint_and_openapi_enum(api: tuple[httpx.Client, object]) -> None:
    c, _ = api
    r = c.get("/api/v1/flag-kinds")
    assert r.status_code == 200
    body = r.json()
    assert [k["name"] for k in body["kinds"]] == list(FLAG_KINDS)
    idle = next(k for k in body["kinds"] if k["name"] == "idle_gpu")
    assert idle["title"] == flag_kinds().get("idle_gpu").title
    assert idle["evidence"]["sm_active_max"]["unit"] == "ratio"
    assert "flagged_minutes" in body["common_evidence"]
    spec = c.get("/openapi.json").json()

    def enum_of(path: str, param: str) -> list[str]:
        (p,) = [p for p in spec["paths"][path]["get"]["parameters"] if p["name"] == param]
        schema = p["schema"]
        for alt in schema.get("anyOf", [schema]):
            if "enum" in alt:
                return list(alt["enum"])
        raise AssertionError(f"no enum for {param} of {path}: {schema}")

    assert enum_of("/api/v1/jobs", "flag") == list(FLAG_KINDS)
    assert enum_of("/api/v1/flags", "kind") == list(FLAG_KINDS)
    assert c.get("/api/v1/jobs", params={"flag": "not_a_kind"}).status_code in (400, 422)
