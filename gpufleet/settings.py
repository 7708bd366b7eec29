"""Server-side settings: ONE typed object (``Settings``), one nested section per part, each field
with exactly one ``GPUFLEET_*`` environment variable. Built once per process by the CLI (from the
environment, then the command's flags) and passed down: the app (``app.state.settings``), the
Celery app (``celery_app.make_celery(settings)``), the maintenance loop, the embedded analysis loop.
No part reads ``os.environ`` for a setting that lives here.

Why the sections are separate ``BaseSettings`` with an explicit variable per field, not one model
with ``env_nested_delimiter``: the variable names predate the sections (``GPUFLEET_DATABASE_URL``,
``GPUFLEET_INGEST_QUEUE_ROWS``, ...) and deployments set them; nested names (section, two
underscores, field) would break every one of them.

The agent's settings are not here: a GPU node installs without pydantic (``agent/config.py``
is stdlib). ``gpufleet config docs`` renders both into docs/configuration.md; a test fails when
the file and the models differ."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gpufleet.pod_jobs import DEFAULT_PATTERNS as DEFAULT_POD_JOB_PATTERNS
from gpufleet.pod_jobs import PodJobs

DAY = 86400.0
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def env(name: str, default: Any, doc: str, **kw: Any) -> Any:
    """A field read from ``GPUFLEET_<name>`` with its one-line documentation."""
    return Field(default, validation_alias="GPUFLEET_" + name, description=doc, **kw)


class Section(BaseModel):
    """A plain model: building one never reads the environment (``Settings`` does that, once).
    Fields are set by name in code (``DatabaseSettings(url=...)``), by variable name from the
    environment."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True, frozen=True)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Self:
        return cls.model_validate(dict(values))


class DatabaseSettings(Section):
    url: str | None = env("DATABASE_URL", None, "SQLAlchemy URL (`sqlite:///...` or `postgresql://...`, which uses "
                          "psycopg 3); unset = SQLite `gpufleet.db` under the data dir")
    data_dir: Path = env("DATA_DIR", Path("./gpufleet-data"),
                         "embedded SQLite database, `gpufleet up`'s agent spools, the beat schedule file")

    def resolved_url(self) -> str:
        from gpufleet.storage.db import resolve_url

        return resolve_url(self.url, self.data_dir)


class HttpSettings(Section):
    host: str = env("HOST", "127.0.0.1", "listen address of `gpufleet serve`")
    port: int = env("PORT", 8000, "listen port of `gpufleet serve`", ge=0, le=65535)
    workers: int = env("WORKERS", 1, "collector/API processes of `gpufleet serve`", ge=1)
    public_url: str = env("PUBLIC_URL", "", "base URL used in links (Slack, Grafana); empty = `http://host:port`")
    max_body_bytes: int = env("MAX_BODY_BYTES", 8 * 1024 * 1024, "largest decompressed ingest body", gt=0)
    max_rows_per_batch: int = env("MAX_ROWS_PER_BATCH", 20_000, "largest ingest batch in sample rows", gt=0)
    # Slow-client limits (api/http_timeouts.py, issue 18): a request's headers, then its body.
    header_timeout_s: float = env("HTTP_HEADER_TIMEOUT_S", 10.0, "request headers must arrive within this", gt=0)
    body_idle_s: float = env("HTTP_BODY_IDLE_S", 30.0, "longest pause between request body chunks", gt=0)
    body_min_rate: float = env("HTTP_BODY_MIN_RATE", 1024.0, "slowest average body rate (bytes/s) accepted once "
                               "the grace period has passed", gt=0)
    body_grace_s: float = env("HTTP_BODY_GRACE_S", 60.0, "time a body may take before the minimum rate applies",
                              gt=0)
    metrics_dir: str = env("METRICS_DIR", "", "where the processes of `gpufleet serve --workers N` share their "
                           "/metrics (each process's counters, labelled `worker`); empty = a temporary directory "
                           "`serve` creates and removes (api/metrics_share.py)")


class AuthSettings(Section):
    """Tokens, browser sessions and the trusted SSO proxy (api/auth, docs/auth.md). Lists stay
    comma-separated strings here; api/auth/config.py parses them (addresses, group=role pairs)."""

    allow_anonymous: bool = env("ALLOW_ANONYMOUS", False, "accept requests without a token (admin!); `gpufleet up` "
                                "turns it on only when listening on loopback")
    allowed_hosts: str = env("ALLOWED_HOSTS", "", "comma list of host names browsers may use (`.example.com` = "
                             "subdomains, `*` = any); the public URL's host and the listen address are implied")
    session_ttl_s: float = env("SESSION_TTL_S", 12 * 3600.0, "signed-in browser session lifetime", gt=0)
    cookie_secure: Literal["auto", "true", "false"] = env("COOKIE_SECURE", "auto", "Secure session cookie: `auto` "
                                                          "= when the request came over HTTPS")
    trusted_proxies: str = env("TRUSTED_PROXIES", "", "comma list of addresses/CIDRs of the SSO proxy whose identity "
                               "headers are believed; empty = SSO mode off")
    proxy_user_header: str = env("PROXY_USER_HEADER", "x-forwarded-user", "SSO proxy header naming the user")
    proxy_email_header: str = env("PROXY_EMAIL_HEADER", "x-forwarded-email", "SSO proxy header with the e-mail")
    proxy_groups_header: str = env("PROXY_GROUPS_HEADER", "x-forwarded-groups", "SSO proxy header with the groups")
    proxy_group_roles: str = env("PROXY_GROUP_ROLES", "", "SSO group -> role map, `group=role,...` (`*` = any "
                                 "signed-in user); roles viewer, operator, admin")
    signin_max_failures: int = env("SIGNIN_MAX_FAILURES", 10, "wrong sign-ins one source (client address) may "
                                   "make per window; more are answered 429 with Retry-After", ge=1)
    signin_window_s: float = env("SIGNIN_WINDOW_S", 60.0, "the sign-in throttle's window in seconds", gt=0)


class CollectorSettings(Section):
    """Per process: with ``serve --workers N`` every worker has its own write queue."""

    queue_rows: int = env("INGEST_QUEUE_ROWS", 400_000, "rows waiting for the writer before ingest answers 503", gt=0)
    group_rows: int = env("INGEST_GROUP_ROWS", 50_000, "most rows one group commit takes", gt=0)
    max_age_s: float = env("INGEST_MAX_AGE_S", 30 * DAY, "samples older than this are rejected (load history "
                           "with `gpufleet import`)", gt=0)
    max_future_s: float = env("INGEST_MAX_FUTURE_S", 300.0, "clock skew tolerated ahead of the collector", ge=0)
    retry_after_s: int = env("INGEST_RETRY_AFTER_S", 2, "Retry-After on 503 answers", ge=0)
    remote_write_linger_s: float = env(
        "REMOTE_WRITE_LINGER_S", 0.5, "most seconds a group commit waits for remote-write bodies still being "
        "parsed, so one commit folds several scrapes of a GPU-minute (0: never wait; docs/prometheus.md)", ge=0, le=30)
    import_max_bytes: int = env("IMPORT_MAX_BYTES", 8 * 1024**3, "`POST /api/v1/import` body limit (decompressed)",
                                gt=0)
    # Read by storage/minute_features.py in the write path itself (storage gets no Settings object there).
    fold: Path | None = env("FOLD", None, "TOML file overriding storage/fold.toml, the minute-feature fold's busy "
                            "level, throttle mask and critical XIDs; applies to minutes folded afterwards")
    # The agent reads the same variable (agent/config.py), so one value groups a job's pods
    # alike whether they arrive from the agent or by remote write.
    kubernetes_job_patterns: tuple[str, ...] = env(
        "KUBERNETES_JOB_PATTERNS", DEFAULT_POD_JOB_PATTERNS,
        "comma list of pod-name regexes whose `(?P<job>...)` group names the job a pod belongs to, for pods "
        "arriving by remote write (default: Kubeflow training operator and JobSet names; `none`: one job per pod; "
        "the agent reads the same variable; docs/prometheus.md)")

    @field_validator("kubernetes_job_patterns", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        if isinstance(v, str):  # from the environment, split as the agent splits it
            return tuple(p.strip() for p in v.split(",") if p.strip())
        return v

    @field_validator("kubernetes_job_patterns")
    @classmethod
    def _compiles(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        PodJobs(v)  # ValueError names the pattern and what is wrong with it
        return v


class MaintenanceSettings(Section):
    """Housekeeping (``storage/maintenance.py``): cheap and idempotent, run by every server process."""

    interval_s: float = env("MAINTENANCE_INTERVAL_S", 60.0, "period of partitions-ahead and stale-job passes", gt=0)
    retention_interval_s: float = env("RETENTION_INTERVAL_S", 3600.0, "period of retention passes", gt=0)
    raw_days: float = env("RETENTION_RAW_DAYS", 31.0, "raw sample retention in days; fractions keep hours (0.25 = "
                          "6 h); keep it above the ingest max age, or late batches land in dropped days. Also kept "
                          "this long: training-progress windows (job_progress), NCCL collective windows, NIC "
                          "samples, the idempotency ledger, delivered or failed alert notifications", gt=0)
    rollup_days: float = env("RETENTION_ROLLUP_DAYS", 400.0, "retention of the 1-minute rollups and of the minute "
                             "features the analysis reads (gpu_minute_features, job_hist_features); node events "
                             "(XIDs) are kept as long", gt=0)
    stale_job_s: float = env("STALE_JOB_S", 300.0, "a running job no node reported for this long is ended", gt=0)


class ExportSettings(Section):
    """Remote-write export of stored samples (collector/export). Off unless ``url`` is set. Lists
    are comma-separated; collector/export parses them."""

    url: str = env("EXPORT_URL", "", "Prometheus remote-write receiver to copy stored samples to; empty = off")
    token: str | None = env("EXPORT_TOKEN", None, "bearer token for the receiver (a secret)", repr=False)
    fields: str = env("EXPORT_FIELDS", "", "comma list of catalog fields to export; empty = every field")
    labels: str = env("EXPORT_LABELS", "", "comma list of labels on exported series; empty = the exporter's default")
    queue_dir: Path | None = env("EXPORT_QUEUE_DIR", None, "on-disk send queue; default `<data dir>/export-queue`")
    queue_bytes: int = env("EXPORT_QUEUE_BYTES", 256 * 1024 * 1024, "send queue bound (oldest dropped, counted)", gt=0)
    max_samples_per_send: int = env("EXPORT_MAX_SAMPLES_PER_SEND", 20_000, "samples per remote-write request", gt=0)
    flush_s: float = env("EXPORT_FLUSH_S", 1.0, "most time rows wait to be encoded", gt=0)
    timeout_s: float = env("EXPORT_TIMEOUT_S", 30.0, "HTTP timeout per send", gt=0)
    min_backoff_s: float = env("EXPORT_MIN_BACKOFF_S", 0.5, "first retry delay", gt=0)
    max_backoff_s: float = env("EXPORT_MAX_BACKOFF_S", 30.0, "longest retry delay", gt=0)
    pending_rows: int = env("EXPORT_PENDING_ROWS", 500_000, "rows waiting for the encoder before new ones are "
                            "dropped (counted)", gt=0)


class AnalysisSettings(Section):
    interval_s: float = env("ANALYSIS_INTERVAL_S", 60.0, "seconds between analysis passes (beat and `gpufleet up`)",
                            gt=0)
    progress_interval_s: float = env("ANALYSIS_PROGRESS_INTERVAL_S", 10.0,
                                     "seconds between progress passes (beat and `gpufleet up`): "
                                     "a hang is flagged about 60 s after the last step plus this", gt=0)
    thresholds: Path | None = env("THRESHOLDS", None, "goodput thresholds override, key by key (docs/goodput.md)")
    serving_thresholds: Path | None = env("SERVING_THRESHOLDS", None, "serving flag thresholds file, replacing "
                                          "analysis/serving/thresholds.toml (docs/serving.md)")
    cache_mb: float = env("ANALYSIS_CACHE_MB", 512.0, "per-process cache of job features", ge=0)
    lock_ttl_s: float = env("ANALYSIS_LOCK_TTL_S", 30.0, "Redis lock that keeps two analysis runs apart; refreshed "
                            "after every job, so a killed worker delays the next run by at most this", gt=0)
    shards: int = env("ANALYSIS_SHARDS", 8, "shards one analysis pass is split into (jobs by a stable hash of their "
                      "id), each a hardware-analysis task and a progress-pass task, each under its own lock",
                      ge=1, le=4096)


class AlertsSettings(Section):
    rules: Path | None = env("ALERT_RULES", None, "Slack alert rules file (docs/alerts.md)")
    slack_webhook_url: str | None = env("SLACK_WEBHOOK_URL", None, "default Slack webhook (a secret)", repr=False)

    @property
    def enabled(self) -> bool:
        return bool(self.rules or self.slack_webhook_url)


class GrafanaSettings(Section):
    url: str = env("GRAFANA_URL", "", "Grafana base URL: drilldown links, and `gpufleet grafana push`; empty hides "
                   "the links")
    datasource_url: str | None = env("GRAFANA_DATASOURCE_URL", None, "PostgreSQL URL Grafana reads "
                                     "(`grafana push`); default: the database URL")
    dashboards_dir: Path | None = env("DASHBOARDS_DIR", None, "dashboards `grafana push` uploads; default: packaged")


class CelerySettings(Section):
    redis_url: str | None = env("REDIS_URL", None, "Celery broker/backend and the analysis lock (`worker`, `beat`); "
                                f"unset = embedded mode in `up`, `{DEFAULT_REDIS}` for `worker`/`beat`")

    def broker(self) -> str:
        return self.redis_url or DEFAULT_REDIS


class GcSettings(Section):
    threshold: int = env("GC_THRESHOLD", 50_000, "server processes: CPython's gen0 GC threshold after freezing "
                         "what exists at startup; 0 keeps Python's defaults (gpufleet/gctune.py)", ge=0)


class CostSettings(Section):
    gpu_hour_price: float | None = env("GPU_HOUR_PRICE", None, "price of one GPU-hour: the web pages show waste as "
                                       "cost too; unset shows GPU-hours only", ge=0)
    gpu_hour_price_by_cluster: dict[str, float] = env("GPU_HOUR_PRICE_BY_CLUSTER", {}, "JSON `{cluster: price}`: "
                                                      "a cluster's own GPU-hour price, over `GPU_HOUR_PRICE`")
    currency: str = env("CURRENCY", "USD", "currency of the GPU-hour prices (ISO 4217 code)",
                        pattern=r"^[A-Z]{3}$")

    @field_validator("gpu_hour_price_by_cluster", mode="before")
    @classmethod
    def _json_object(cls, v: Any) -> Any:
        if isinstance(v, str):  # from the environment: a JSON object
            try:
                return json.loads(v)
            except ValueError as e:
                raise ValueError(f"not a JSON object ({e})") from None
        return v

    @field_validator("gpu_hour_price_by_cluster")
    @classmethod
    def _no_negative(cls, v: dict[str, float]) -> dict[str, float]:
        if bad := sorted(k for k, p in v.items() if p < 0):
            raise ValueError(f"negative price for {', '.join(bad)}")
        return v

    def price(self, cluster: str | None = None) -> float | None:
        """The GPU-hour price for ``cluster`` (its own, else the default); None: no price set."""
        if cluster is not None and cluster in self.gpu_hour_price_by_cluster:
            return self.gpu_hour_price_by_cluster[cluster]
        return self.gpu_hour_price


SECTIONS: dict[str, type[Section]] = {
    "database": DatabaseSettings,
    "http": HttpSettings,
    "auth": AuthSettings,
    "collector": CollectorSettings,
    "maintenance": MaintenanceSettings,
    "export": ExportSettings,
    "analysis": AnalysisSettings,
    "alerts": AlertsSettings,
    "grafana": GrafanaSettings,
    "celery": CelerySettings,
    "gc": GcSettings,
    "cost": CostSettings,
}


def _section(name: str) -> Any:
    return Field(default_factory=SECTIONS[name])


def read_environ(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The ``GPUFLEET_*`` variables of ``environ`` as ``{section: {field: raw}}``. An empty
    variable counts as unset (``GPUFLEET_THRESHOLDS=`` in a unit file means "the default");
    unknown ``GPUFLEET_*`` names are ignored: the agent's live in the same namespace."""
    out: dict[str, dict[str, str]] = {}
    upper = {k.upper(): v for k, v in environ.items() if v != ""}
    for sname, cls in SECTIONS.items():
        vals = {f: upper[n] for f, info in cls.model_fields.items() if (n := env_name(info)) in upper}
        if vals:
            out[sname] = vals
    return out


class _FlatEnv(PydanticBaseSettingsSource):
    """pydantic-settings source for the flat variable names (see the module docstring)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads all sections at once

    def __call__(self) -> dict[str, Any]:
        return read_environ(os.environ)


class Settings(BaseSettings):
    """Every server-side setting. ``Settings()`` reads the environment; ``Settings.of({...})``
    takes explicit values (``{"auth": {"allow_anonymous": True}}``) over the defaults only."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Arguments beat the environment; no .env file or secrets dir (a surprise in production).
        return init_settings, _FlatEnv(settings_cls)

    database: DatabaseSettings = _section("database")
    http: HttpSettings = _section("http")
    auth: AuthSettings = _section("auth")
    collector: CollectorSettings = _section("collector")
    maintenance: MaintenanceSettings = _section("maintenance")
    export: ExportSettings = _section("export")
    analysis: AnalysisSettings = _section("analysis")
    alerts: AlertsSettings = _section("alerts")
    grafana: GrafanaSettings = _section("grafana")
    celery: CelerySettings = _section("celery")
    gc: GcSettings = _section("gc")
    cost: CostSettings = _section("cost")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """From ``environ`` (default: this process's environment) over the defaults; a bad
        value raises SettingsError naming the variable."""
        raw = read_environ(os.environ if environ is None else environ)
        try:
            return cls.of(raw)
        except ValidationError as e:
            raise SettingsError.of(e, raw) from None

    @classmethod
    def of(cls, values: Mapping[str, Mapping[str, Any]] | None = None) -> Settings:
        values = values or {}
        unknown = set(values) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown settings sections {sorted(unknown)} (known: {', '.join(SECTIONS)})")
        # model_construct: each section is validated already, and Settings() would read the environment.
        return cls._assemble({n: c.of(values.get(n, {})) for n, c in SECTIONS.items()})

    @classmethod
    def _assemble(cls, sections: dict[str, Any]) -> Settings:
        return cls.model_construct(None, **sections)

    def replace(self, **sections: Mapping[str, Any]) -> Settings:
        """A copy with some fields of some sections changed (validated):
        ``s.replace(database={"url": u}, auth={"allow_anonymous": True})``."""
        out: dict[str, Any] = {}
        for name, cls in SECTIONS.items():
            cur: Section = getattr(self, name)
            if name in sections:
                cur = cls.of({**cur.model_dump(), **sections[name]})
            out[name] = cur
        unknown = set(sections) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown settings sections {sorted(unknown)} (known: {', '.join(SECTIONS)})")
        return Settings._assemble(out)

    def database_url(self) -> str:
        return self.database.resolved_url()

    def base_url(self) -> str:
        return self.http.public_url.rstrip("/") or f"http://{self.http.host}:{self.http.port}"


class SettingsError(ValueError):
    """A bad setting, said with the variable's name: ``GPUFLEET_PORT='x': Input should be ...``."""

    @classmethod
    def of(cls, e: ValidationError, raw: Mapping[str, Mapping[str, str]]) -> SettingsError:
        lines = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            sname = next((n for n, c in SECTIONS.items() if c.__name__ == e.title and field in c.model_fields), None)
            if sname is None:
                lines.append(f"{field or e.title}: {err['msg']}")
                continue
            name = env_name(SECTIONS[sname].model_fields[field])
            got = raw.get(sname, {}).get(field)
            lines.append(f"{name}={got!r}: {err['msg']}" if got is not None else f"{name}: {err['msg']}")
        return cls("; ".join(lines))


def variables() -> list[tuple[str, str, FieldInfo]]:
    """(section, field, info) for every setting, in declaration order (the docs table's rows)."""
    return [(s, f, info) for s, cls in SECTIONS.items() for f, info in cls.model_fields.items()]


def env_name(info: FieldInfo) -> str:
    assert isinstance(info.validation_alias, str), "every setting names its one environment variable"
    return info.validation_alias


def settings_of(app: Any) -> Settings:
    """The Settings a Celery app was built with (``celery_app.make_celery``). An app built
    elsewhere (a bare ``Celery()`` in a test, tasks called directly) gets the environment's."""
    conf = getattr(app, "conf", None)
    s = conf.get("gpufleet_settings") if conf is not None else None
    return s if isinstance(s, Settings) else Settings.from_env()
