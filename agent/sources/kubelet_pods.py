"""The pods on this node, with their annotations, for the serving scrape (docs/serving.md).

Two places answer with a v1 ``PodList`` of the node's pods:

* the kubelet's authenticated HTTPS endpoint, ``https://<node>:10250/pods`` (``serving_pods =
  kubelet``). The kubelet checks the service-account bearer token with a TokenReview and asks the
  API server, by SubjectAccessReview, whether the account may ``get`` ``nodes/pods`` (Kubernetes
  1.33+, fine-grained kubelet authorization, on by default) or else ``nodes/proxy`` (older
  kubelets; that one also allows exec into the node's pods: grant it only where needed).
* the API server, ``/api/v1/pods?fieldSelector=spec.nodeName=<node>`` (``serving_pods =
  apiserver``): RBAC ``list`` on ``pods``, cluster-wide.

The token is read from its file on every listing (the kubelet rotates projected tokens); the CA
is the service account's ``ca.crt`` unless ``serving_pods_insecure_skip_tls_verify`` is set. A
listing that fails is recorded with a reason naming what to fix and the last good listing is
kept; it never raises into the sample cycle.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger(__name__)

KUBELET_PORT = 10250


class PodListError(Exception):
    """Why a listing failed, in words that name the fix."""


def default_base_url(mode: str, node: str, env: dict[str, str] | None = None) -> str:
    """The kubelet on this node, or the in-cluster API server (the variables every pod gets)."""
    if mode == "kubelet":
        return f"https://{node}:{KUBELET_PORT}"
    env = dict(os.environ) if env is None else env
    host = env.get("KUBERNETES_SERVICE_HOST")
    if not host:
        return "https://kubernetes.default.svc"
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"


def pods_url(mode: str, base_url: str, node: str) -> str:
    base = base_url.rstrip("/")
    if mode == "kubelet":
        return f"{base}/pods"
    return f"{base}/api/v1/pods?" + urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}"})


def parse_pod_list(body: bytes) -> list[dict[str, Any]]:
    """The items of a v1 PodList; PodListError when the body is not one."""
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise PodListError(f"the answer is not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise PodListError(f"the answer is not a PodList (kind {kind!r}, no items list)")
    return [p for p in doc["items"] if isinstance(p, dict)]


class PodLister:
    """Lists the node's pods on demand, at most once per ``retry_s`` after a failure."""

    def __init__(self, mode: str, node: str, *, base_url: str | None = None,
                 token_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
                 ca_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
                 insecure_skip_tls_verify: bool = False, timeout_s: float = 2.0, retry_s: float = 30.0) -> None:
        if mode not in ("kubelet", "apiserver"):
            raise ValueError(f"serving_pods {mode!r}: use kubelet or apiserver")
        self.mode = mode
        self.node = node
        self.url = pods_url(mode, base_url or default_base_url(mode, node), node)
        self.token_file = Path(token_file)
        self.ca_file = Path(ca_file)
        self.insecure = insecure_skip_tls_verify
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.pods: list[dict[str, Any]] = []  # the last good listing
        self.listed = False  # a listing has succeeded at least once
        self.error: str | None = None  # the last listing's failure (None: it succeeded)
        self.errors = 0
        self._failed_at = -1e18
        self._last_log = -1e18

    def current(self, now_m: float | None = None) -> list[dict[str, Any]]:
        """List again (unless the last try failed less than ``retry_s`` ago) and return the pods:
        the new listing, or the last good one when this one failed."""
        now_m = time.monotonic() if now_m is None else now_m
        if self.error is not None and now_m - self._failed_at < self.retry_s:
            return self.pods
        try:
            self.pods = self.fetch()
        except PodListError as e:
            self.errors += 1
            self.error = str(e)
            self._failed_at = now_m
            if now_m - self._last_log >= 60:
                self._last_log = now_m
                log.warning("listing pods at %s failed: %s (serving targets from pods: %s)", self.url, e,
                            "the last good listing" if self.listed else "none yet")
        else:
            self.error = None
            self.listed = True
        return self.pods

    def _verify(self) -> ssl.SSLContext | bool:
        if self.insecure or not self.url.startswith("https://"):
            return False
        try:
            return ssl.create_default_context(cafile=str(self.ca_file))
        except (OSError, ssl.SSLError) as e:
            raise PodListError(f"cannot read the CA {self.ca_file} ({e}): mount the service account's ca.crt "
                               "or set serving_pods_ca_file") from None

    def fetch(self) -> list[dict[str, Any]]:
        headers = {"Accept": "application/json"}
        try:
            token = self.token_file.read_text().strip()
        except OSError:
            token = ""
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            r = httpx.get(self.url, headers=headers, verify=self._verify(), timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise PodListError(f"{type(e).__name__}: {e}") from None
        if r.status_code == 401:
            raise PodListError(f"401 Unauthorized: the {self.mode} did not accept the token in {self.token_file}"
                               + ("" if token else " (there is none)")
                               + (" (the kubelet needs --authentication-token-webhook)" if self.mode == "kubelet"
                                  else ""))
        if r.status_code == 403:
            need = "get on nodes/pods (nodes/proxy before Kubernetes 1.33)" if self.mode == "kubelet" \
                else "list on pods"
            raise PodListError(f"403 Forbidden: the service account needs RBAC {need} ({r.text[:200]!r})")
        if r.status_code != 200:
            raise PodListError(f"HTTP {r.status_code} ({r.text[:200]!r})")
        return parse_pod_list(r.content)
