"""Reads of a cluster-scoped viewer (``gpufleet token create NAME --role viewer --cluster C``, or
a browser session signed in with one): pure decisions over a request's method, path and query.

Fail closed: only the read endpoints listed here, each of which takes a ``cluster`` query
parameter that filters all it returns, answer such a caller, with ``cluster`` forced to C (absent:
set to C; another cluster: 403). Every other ``/api/`` and ``/web/`` path is refused, so an
endpoint added later reads nothing for it until it is listed here (a test checks each listed
route takes ``cluster``). HTML shells and static files carry no data and pass."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode

# Read endpoints whose every answer is filtered by their ``cluster`` query parameter.
SCOPED_READS = tuple(re.compile(p) for p in (
    r"/api/v1/fleet/summary", r"/api/v1/fleet/ledger", r"/api/v1/flags",
    r"/api/v1/jobs", r"/api/v1/jobs/.+",  # a job, its timeseries/timeline/previous-runs/progress/collectives/ledger
    r"/api/v1/nodes", r"/api/v1/nodes/[^/]+", r"/api/v1/nodes/[^/]+/(timeseries|nics)",
    r"/api/v1/deployments", r"/api/v1/deployments/[^/]+",
))
# The same for everyone: no cluster's data in them.
UNSCOPED = frozenset({"/api/v1/catalog", "/api/v1/flag-kinds", "/api/v1/auth/me", "/api/v1/auth/signout",
                      "/api/v1/auth/signin"})
READ = frozenset({"GET", "HEAD"})


class OutOfScope(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def scoped_query(method: str, path: str, query_string: bytes, cluster: str) -> bytes:
    """The query string a request of a viewer scoped to ``cluster`` runs with; raises
    OutOfScope (403) for what such a viewer may not read."""
    if path in UNSCOPED:
        return query_string
    if not (path.startswith("/api/") or path.startswith("/web/")):
        return query_string  # pages and static files: the data comes from the API, scoped there
    if method.upper() not in READ or not any(p.fullmatch(path) for p in SCOPED_READS):
        raise OutOfScope(f"this token reads only cluster {cluster!r}, and {path} is not a per-cluster read "
                         "(docs/api.md, Token scope)")
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    asked = {v for k, v in pairs if k == "cluster"}
    if asked - {cluster}:
        raise OutOfScope(f"this token reads only cluster {cluster!r}, not {', '.join(sorted(asked - {cluster}))}")
    return urlencode([(k, v) for k, v in pairs if k != "cluster"] + [("cluster", cluster)]).encode("latin-1")
