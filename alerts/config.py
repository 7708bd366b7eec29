"""Alert configuration: rules, routing, lifecycle, delivery, cost and digest settings.

Loaded from a YAML file (``GPUFLEET_ALERT_RULES``; see ``alerts/rules.example.yaml``) and/or
``GPUFLEET_SLACK_WEBHOOK_URL``. Everything is a frozen dataclass so decision functions can take
it as plain data; errors name the offending key so an operator can fix the file."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet import durations
from gpufleet.flagkinds import FLAG_KINDS, SEVERITIES

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["FLAG_KINDS", "SEVERITIES"]
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

RULES_ENV = "GPUFLEET_ALERT_RULES"
WEBHOOK_ENV = "GPUFLEET_SLACK_WEBHOOK_URL"


class ConfigError(ValueError):
    pass




def parse_duration(v: Any, key: str = "duration") -> float:
    """``90``, ``"90s"``, ``"30m"``, ``"4h"``, ``"7d"`` -> seconds."""
    try:
        return durations.parse_duration(v)  # the one grammar (gpufleet/durations.py)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None


@dataclass(frozen=True)
class Rule:
    """Which flags alert. A flag alerts when ANY rule matches it."""

    name: str = "default"
    flags: tuple[str, ...] = FLAG_KINDS
    min_severity: str = "warning"
    min_gpus: int = 1
    min_duration_s: float = 1800.0  # JDS: nothing under 30 min of runtime
    min_wasted_gpu_hours: float = 1.0
    clusters: tuple[str, ...] = ()  # empty = any
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    exclude_users: tuple[str, ...] = ()


# Severity is not waste: two rules page on what a flag means, whatever GPU-hours it claims.
# "waste" pages on claimed GPU-hours; "hardware" pages a node fault at once; "fabric" pages the
# machine-side kinds whose cost the ledger books elsewhere (a degraded NIC, link errors claim no
# waste of their own) or that point at one node (the straggler, throttling, a slow rank); any
# critical flag pages at once ("critical"); "hang" pages a stopped job within minutes.
FABRIC_KINDS = tuple(k for k in ("collective_slow", "network_degraded", "link_errors", "straggler", "throttled",
                                 "slow_rank") if k in FLAG_KINDS)
DEFAULT_RULES = (
    Rule(name="waste", flags=tuple(k for k in FLAG_KINDS if k != "hw_fault")),
    Rule(name="hardware", flags=("hw_fault",), min_severity="info", min_duration_s=0.0, min_wasted_gpu_hours=0.0),
    Rule(name="fabric", flags=FABRIC_KINDS, min_severity="warning", min_duration_s=600.0, min_wasted_gpu_hours=0.0),
    Rule(name="critical", flags=FLAG_KINDS, min_severity="critical", min_gpus=0, min_duration_s=0.0,
         min_wasted_gpu_hours=0.0),
    # A critical hang (the job's own progress stopped, docs/progress.md) wastes every GPU from the
    # moment it starts: page within minutes, whatever it wasted so far, CPU-only jobs included.
    Rule(name="hang", flags=("hung",), min_severity="critical", min_gpus=0, min_duration_s=0.0,
         min_wasted_gpu_hours=0.0),
    # A serving deployment missing its SLO over the judged hour (docs/serving.md) is burning its
    # error budget: page whatever GPU-hours it claims (serving flags claim none yet).
    Rule(name="slo_burn", flags=tuple(k for k in ("slo_missed",) if k in FLAG_KINDS), min_severity="warning",
         min_duration_s=0.0, min_wasted_gpu_hours=0.0),
)


@dataclass(frozen=True)
class Route:
    """Send a job's messages somewhere else when all given fields match (first match wins)."""

    webhook: str
    cluster: str | None = None
    account: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class Delivery:
    rate_per_s: float = 1.0  # Slack: 1 message per second per webhook
    burst: int = 3  # "short bursts allowed"
    timeout_s: float = 10.0
    max_attempts: int = 12  # ~2 h of backoff at the defaults before a row is marked failed
    backoff_base_s: float = 2.0
    backoff_max_s: float = 900.0
    max_inline_wait_s: float = 2.0  # wait this long for the rate limiter; reschedule beyond
    lease_s: float = 60.0  # a claimed row no worker finished becomes claimable again


@dataclass(frozen=True)
class Digest:
    enabled: bool = False
    hour_utc: int = 9  # send the day's digest once the UTC clock passes this hour
    top_n: int = 5
    window_s: float = 86400.0
    min_wasted_gpu_hours: float = 1.0


@dataclass(frozen=True)
class AlertConfig:
    default_webhook: str | None = None
    routes: tuple[Route, ...] = ()
    mentions: dict[str, str] = field(default_factory=dict)  # user -> Slack member id (U…)
    rules: tuple[Rule, ...] = DEFAULT_RULES
    repeat_interval_s: float = 4 * 3600.0  # Alertmanager's repeat_interval default
    send_resolved: bool = True
    price_per_gpu_hour: float = 0.0
    currency: str = "USD"
    base_url: str = ""  # gpufleet web UI, for job links
    grafana_url: str = ""
    # the gpufleet-job dashboard's variables: cluster name and job (the job's primary key)
    grafana_job_path: str = ("/d/gpufleet-job/gpufleet-job?var-cluster={cluster}&var-job={job_pk}"
                             "&from={from_ms}&to={to_ms}")
    job_path: str = "/jobs/{job_id}?cluster={cluster}"  # the web dashboard's job page
    delivery: Delivery = field(default_factory=Delivery)
    digest: Digest = field(default_factory=Digest)

    @property
    def enabled(self) -> bool:
        return bool(self.default_webhook or self.routes)

    def with_links(self, base_url: str = "", grafana_url: str = "") -> AlertConfig:
        """Fill link bases from the server settings when the rules file leaves them empty."""
        return replace(self, base_url=self.base_url or base_url, grafana_url=self.grafana_url or grafana_url)


def _tuple(v: Any, key: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    if not isinstance(v, list):
        raise ConfigError(f"{key}: expected a list of strings, got {v!r}")
    return tuple(str(x) for x in v)


def _check_keys(d: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(d) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")


def _rule(d: Any, i: int) -> Rule:
    where = f"rules[{i}]"
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a mapping")
    _check_keys(d, {"name", "flags", "min_severity", "severity", "min_gpus", "min_duration", "min_wasted_gpu_hours",
                    "clusters", "accounts", "partitions", "exclude_users"}, where)
    flags = _tuple(d.get("flags"), f"{where}.flags") or FLAG_KINDS
    if flags == ("*",):
        flags = FLAG_KINDS
    bad = [f for f in flags if f not in FLAG_KINDS]
    if bad:
        raise ConfigError(f"{where}.flags: unknown flag kind(s) {bad}; known: {list(FLAG_KINDS)}")
    sev = str(d.get("min_severity", d.get("severity", "warning")))
    if sev not in SEVERITIES:
        raise ConfigError(f"{where}.min_severity: {sev!r} is not one of {list(SEVERITIES)}")
    return Rule(
        name=str(d.get("name", f"rule{i}")),
        flags=flags,
        min_severity=sev,
        min_gpus=int(d.get("min_gpus", 1)),
        min_duration_s=parse_duration(d.get("min_duration", 1800), f"{where}.min_duration"),
        min_wasted_gpu_hours=float(d.get("min_wasted_gpu_hours", 1.0)),
        clusters=_tuple(d.get("clusters"), f"{where}.clusters"),
        accounts=_tuple(d.get("accounts"), f"{where}.accounts"),
        partitions=_tuple(d.get("partitions"), f"{where}.partitions"),
        exclude_users=_tuple(d.get("exclude_users"), f"{where}.exclude_users"),
    )


def _route(d: Any, i: int) -> Route:
    where = f"slack.routes[{i}]"
    if not isinstance(d, dict) or "webhook" not in d:
        raise ConfigError(f"{where}: expected a mapping with 'webhook' and a 'match' of cluster/account/user")
    _check_keys(d, {"webhook", "match"}, where)
    m = d.get("match") or {}
    if not isinstance(m, dict) or not m:
        raise ConfigError(f"{where}.match: give at least one of cluster, account, user")
    _check_keys(m, {"cluster", "account", "user"}, f"{where}.match")
    return Route(webhook=str(d["webhook"]), cluster=m.get("cluster"), account=m.get("account"), user=m.get("user"))


def _dc(cls: type[DataclassInstance], d: Any, where: str, durations: dict[str, str]) -> Any:
    """Build a settings dataclass from a mapping; ``durations`` maps file keys to fields."""
    if d is None:
        return cls()
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a mapping")
    fields = set(cls.__dataclass_fields__)
    kw: dict[str, Any] = {}
    for k, v in d.items():
        if k in durations:
            kw[durations[k]] = parse_duration(v, f"{where}.{k}")
        elif k in fields:
            default = getattr(cls(), k)
            if isinstance(default, bool) and not isinstance(v, bool):
                raise ConfigError(f"{where}.{k}: expected true or false, got {v!r}")
            try:
                kw[k] = type(default)(v)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{where}.{k}: expected a {type(default).__name__}, got {v!r}") from e
        else:
            raise ConfigError(f"{where}: unknown key {k!r}; allowed: {sorted(fields | set(durations))}")
    return cls(**kw)


def parse_config(doc: Any, *, webhook_override: str | None = None) -> AlertConfig:
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError("alert rules file: expected a mapping at the top level")
    _check_keys(doc, {"slack", "rules", "lifecycle", "cost", "links", "delivery", "digest"}, "alert rules file")
    slack = doc.get("slack") or {}
    _check_keys(slack, {"default_webhook", "routes", "mentions"}, "slack")
    routes = tuple(_route(r, i) for i, r in enumerate(slack.get("routes") or []))
    mentions = {str(k): str(v) for k, v in (slack.get("mentions") or {}).items()}
    rules = tuple(_rule(r, i) for i, r in enumerate(doc["rules"])) if doc.get("rules") else DEFAULT_RULES
    life = doc.get("lifecycle") or {}
    _check_keys(life, {"repeat_interval", "send_resolved"}, "lifecycle")
    cost = doc.get("cost") or {}
    _check_keys(cost, {"price_per_gpu_hour", "currency"}, "cost")
    links = doc.get("links") or {}
    _check_keys(links, {"base_url", "grafana_url", "grafana_job_path", "job_path"}, "links")
    delivery = _dc(Delivery, doc.get("delivery"), "delivery", {
        "timeout": "timeout_s", "backoff_base": "backoff_base_s", "backoff_max": "backoff_max_s",
        "max_inline_wait": "max_inline_wait_s", "lease": "lease_s"})
    digest = _dc(Digest, doc.get("digest"), "digest", {"window": "window_s"})
    cfg = AlertConfig(
        default_webhook=webhook_override or slack.get("default_webhook"),
        routes=routes,
        mentions=mentions,
        rules=rules,
        repeat_interval_s=parse_duration(life.get("repeat_interval", "4h"), "lifecycle.repeat_interval"),
        send_resolved=bool(life.get("send_resolved", True)),
        price_per_gpu_hour=float(cost.get("price_per_gpu_hour", 0.0)),
        currency=str(cost.get("currency", "USD")),
        base_url=str(links.get("base_url", "")),
        grafana_url=str(links.get("grafana_url", "")),
        delivery=delivery,
        digest=digest,
    )
    if "grafana_job_path" in links:
        cfg = replace(cfg, grafana_job_path=str(links["grafana_job_path"]))
    if "job_path" in links:
        cfg = replace(cfg, job_path=str(links["job_path"]))
    if cfg.delivery.rate_per_s <= 0 or cfg.delivery.burst < 1 or cfg.delivery.max_attempts < 1:
        raise ConfigError("delivery: rate_per_s must be > 0, burst >= 1, max_attempts >= 1")
    if not 0 <= cfg.digest.hour_utc <= 23:
        raise ConfigError("digest.hour_utc: expected 0-23")
    return cfg


def load_config(path: str | Path | None = None, *, webhook: str | None = None) -> AlertConfig:
    """The rules file (argument, else ``$GPUFLEET_ALERT_RULES``) with the webhook (argument,
    else ``$GPUFLEET_SLACK_WEBHOOK_URL``) as the default route. Neither set: alerts disabled."""
    import yaml

    path = path or os.environ.get(RULES_ENV) or None
    webhook = webhook or os.environ.get(WEBHOOK_ENV) or None
    doc: Any = None
    if path:
        p = Path(path).expanduser()
        try:
            doc = yaml.safe_load(p.read_text())
        except OSError as e:
            raise ConfigError(f"cannot read alert rules file {p}: {e.strerror}") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"alert rules file {p} is not valid YAML: {e}") from e
    return parse_config(doc, webhook_override=webhook)
