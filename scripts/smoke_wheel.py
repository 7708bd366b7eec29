"""The artifact users install, tested the way the README's "Production" section uses it.

    bash scripts/smoke_wheel.sh          # scripts/test.sh runs it after the suite

1. Copies the working tree (git's tracked and untracked-not-ignored files) to a scratch folder,
   builds the wheel there with the README's own command, and the sdist (PEP 517, setuptools).
2. Checks both against the tree: every file under the package folders (Python, static JS/CSS/SVG,
   Alembic template and migrations, TOML, YAML, C sources, the Grafana dashboards) is in the wheel at
   its import path and
   in the sdist; a wheel built from the sdist holds the same files.
3. Runs the README's production block line by line, as written, in fresh virtualenvs (the server
   lines in one, the GPU-node lines in another), changing only what names the reader's site: the
   database URL (a throwaway PostgreSQL database), the Redis URL, host/port (127.0.0.1, a free
   port), `--workers 2`, the wheel's path and the collector's URL. The agent runs simulated
   (`--simulate 1`: no GPU here): `--once` as a bring-up check (exit 0; refused without
   `--cluster`: exit 1), then as a daemon whose samples must reach the API.
4. Headless Chromium signs in at /signin with the README's viewer token and loads every page;
   each must be styled (a computed style that only app.css sets) with no failed request and no
   script error. An admin token opens the tokens and silences pages.
5. A job's history (`gpufleet import`, an idle job) is flagged by the analysis pass that `beat`
   schedules and `worker` runs, and the alert reaches a local Slack stand-in.

Environment: GPUFLEET_TEST_PG_URL (an admin URL; default postgresql://postgres@127.0.0.1:5432/postgres),
GPUFLEET_TEST_REDIS_URL (default redis://127.0.0.1:6379/0), SMOKE_KEEP=1 keeps the scratch folder.
Debian's docker.io is not used: this machine has no container engine (docs in README "Production").
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import venv
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Excluded from the tree copy even when git is absent (an unpacked sdist).
SKIP_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
             ".hypothesis", "artifacts", "gpufleet-data", "node_modules"}
SDIST_TOP = ["setup.py", "pyproject.toml", "README.md"]
BG = "rgb(13, 17, 23)"  # app.css: body { background: var(--bg) } with --bg: #0d1117
T_START = time.monotonic()


def log(msg: str) -> None:
    print(f"[smoke_wheel {time.monotonic() - T_START:6.1f}s] {msg}", flush=True)


# --- the package layout (setup.py is its one home) ---------------------------------------

def package_roots(repo: Path = REPO) -> dict[str, str]:
    """{import name: folder} from setup.py's ROOTS and DATA_ROOTS (read, not run)."""
    roots: dict[str, str] = {}
    for node in ast.parse((repo / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("ROOTS", "DATA_ROOTS")
                                                for t in node.targets):
            roots.update(ast.literal_eval(node.value))
    return roots


def tree_files(repo: Path = REPO) -> list[str]:
    """The files a clone of the working tree has: git's tracked and untracked-not-ignored files
    (without git: every file outside the build and cache folders)."""
    if (repo / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, check=True,
                             capture_output=True).stdout.decode()
        return sorted(f for f in out.split("\0") if f and (repo / f).is_file())
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*")
                  if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(repo).parts)
                  and not any(part.endswith(".egg-info") for part in p.relative_to(repo).parts))


def expected_in_wheel(repo: Path = REPO) -> dict[str, str]:
    """{path in the wheel: path in the tree} for every file under a package folder."""
    folders = sorted(((f, pkg) for pkg, f in package_roots(repo).items()), key=lambda x: -len(x[0]))
    out: dict[str, str] = {}
    for f in tree_files(repo):
        for folder, pkg in folders:
            if f.startswith(folder + "/"):
                out[pkg.replace(".", "/") + f[len(folder):]] = f
                break
    return out


def check_wheel(names: list[str], repo: Path = REPO) -> list[str]:
    """What is wrong with a wheel's file list: files of the tree it lacks, files it has that the
    tree does not (stale build output)."""
    want = expected_in_wheel(repo)
    have = {n for n in names if ".dist-info/" not in n}
    problems = [f"missing from the wheel: {w} (from {src})" for w, src in sorted(want.items()) if w not in have]
    problems += [f"in the wheel but not in the tree: {n}" for n in sorted(have - set(want))
                 if not n.endswith(".so")]
    return problems


def check_sdist(names: list[str], repo: Path = REPO) -> list[str]:
    top = {n.split("/", 1)[1] for n in names if "/" in n}
    want = set(expected_in_wheel(repo).values()) | set(SDIST_TOP)
    return [f"missing from the sdist: {f}" for f in sorted(want - top)]


# --- helpers -------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    """Polls until pred() is truthy; the bound only catches a hang (a loaded box is slow, not stuck)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # a service still starting answers with errors
            last = e
        time.sleep(every)
    raise SystemExit(f"FAILED: timed out waiting for {what} (last error: {last!r})")


def fail(msg: str) -> None:
    raise SystemExit(f"FAILED: {msg}")


class SlackSink:
    """A local stand-in for a Slack incoming webhook: records each POSTed message."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with suppress(ValueError):
                    sink.messages.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a: Any) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/services/T000/B000/SMOKE"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@contextmanager
def throwaway_database(admin_url: str) -> Iterator[str]:
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"gpufleet_smoke_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = make_url(admin_url).set(drivername="postgresql")
    dsn = admin.render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the README's production block ---------------------------------------------------------

def readme_block(readme: str) -> list[str]:
    """The command lines of the first bash block under "## Production" (comments kept)."""
    sec = readme.split("\n## Production", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```bash\n(.*?)```", sec, re.S)
    if m is None:
        raise SystemExit("FAILED: README.md: no bash block in the Production section")
    return [ln for ln in m.group(1).splitlines() if ln.strip()]


class Site:
    """The reader's site, as this machine has it: what the README's names become here."""

    def __init__(self, tmp: Path, db_url: str, redis_url: str, slack: SlackSink) -> None:
        self.tmp = tmp
        self.src = tmp / "gpufleet"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db_url = db_url
        self.redis_url = redis_url
        self.venvs = {"server": tmp / "venv-server", "agent": tmp / "venv-agent"}
        for d in self.venvs.values():
            venv.EnvBuilder(with_pip=True, clear=True).create(d)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLEET_", "VIRTUAL_ENV", "PYTHON"))}
        self.env.update(GPUFLEET_SLACK_WEBHOOK_URL=slack.url, GPUFLEET_ANALYSIS_INTERVAL_S="5",
                        GPUFLEET_PUBLIC_URL=self.url)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tokens: dict[str, str] = {}

    def rewrite(self, line: str) -> str:
        """The README line with this site's names (and nothing else) in place of the reader's."""
        wheel = next((self.src / "dist").glob("gpufleet-*.whl"), None)
        subs = [
            ("postgresql://gpufleet@db/gpufleet", self.db_url),
            ("redis://redis:6379/0", self.redis_url),
            ("--host 0.0.0.0 --port 8000", f"--host 127.0.0.1 --port {self.port}"),
            ("--workers 4", "--workers 2"),  # two CPUs here
            ("https://gpufleet.example", self.url),
        ]
        if wheel is not None:
            subs.append(("/path/to/gpufleet-0.1.0-cp311-cp311-linux_x86_64.whl", str(wheel)))
        for a, b in subs:
            line = line.replace(a, b)
        return line

    def run_block(self, lines: list[str]) -> None:
        role = "server"
        for raw in lines:
            code = raw.split("  #", 1)[0].split("\t#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
            if raw.lstrip().startswith("#"):
                role = "agent" if "GPU node" in raw else "server" if "collector" in raw else role
                continue
            if code.startswith("git clone"):
                continue  # the scratch copy of the working tree stands in for the clone
            self.step(role, self.rewrite(code))

    def step(self, role: str, cmd: str) -> None:
        env = dict(self.env, PATH=f"{self.venvs[role] / 'bin'}:{self.env.get('PATH', '')}",
                   VIRTUAL_ENV=str(self.venvs[role]))
        if m := re.fullmatch(r"export (\w+)=(\S+)", cmd):
            self.env[m.group(1)] = m.group(2)
            log(f"{role}: {cmd}")
            return
        words = cmd.split()
        sub = words[words.index("gpufleet") + 1] if "gpufleet" in words else ""
        if sub in ("serve", "worker", "beat"):
            log(f"{role}: {cmd} &")
            logf = open(self.tmp / f"{sub}.log", "wb")  # noqa: SIM115 - the process owns it
            self.procs[sub] = subprocess.Popen(["bash", "-c", cmd], cwd=self.tmp, env=env, stdout=logf,
                                               stderr=subprocess.STDOUT, start_new_session=True)
            if sub == "serve":
                wait_for(lambda: self.http("GET", "/readyz").status_code == 200 or self.died("serve"), 300,
                         "serve to answer /readyz")
            return
        if sub == "agent":
            self.agent_steps(cmd, env)
            return
        log(f"{role}: {cmd}")
        r = subprocess.run(["bash", "-c", cmd], cwd=self.src if "dist" in cmd or cmd.endswith(" .") else self.tmp,
                           env=env, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            fail(f"`{cmd}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        if sub == "token":
            name = words[words.index("create") + 1]
            self.tokens[name] = r.stdout.strip().splitlines()[-1]
            self.env.setdefault("TOKEN", self.tokens[name])  # the README's "$TOKEN": the agent's

    def died(self, name: str) -> bool:
        p = self.procs[name]
        if p.poll() is not None:
            fail(f"`gpufleet {name}` exited {p.returncode}:\n{(self.tmp / f'{name}.log').read_text()[-4000:]}")
        return False

    def http(self, method: str, path: str, token: str | None = None, **kw: Any) -> Any:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, self.url + path, headers=headers, timeout=30, **kw)

    def agent_steps(self, cmd: str, env: dict[str, str]) -> None:
        """The README's agent line, simulated: a bring-up check, then the daemon."""
        sim = f" --simulate 1 --gpus-per-node 2 --spool-dir {self.tmp / 'spool'}"
        log(f"agent: {cmd} --once{sim}")
        r = subprocess.run(["bash", "-c", cmd + sim + " --once"], cwd=self.tmp, env=env, capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0 or "sent 1 batch" not in r.stdout:
            fail(f"agent --once (bring-up check) exited {r.returncode}:\n{r.stdout}\n{r.stderr[-3000:]}")
        wrong = cmd.replace("--cluster prod ", "")
        r = subprocess.run(["bash", "-c", wrong + f" --simulate 1 --gpus-per-node 2 --once --spool-dir "
                                                  f"{self.tmp / 'spool-refused'}"],
                           cwd=self.tmp, env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 1 or "403" not in r.stdout + r.stderr:
            fail(f"agent --once without --cluster (refused, 403) must exit 1; got {r.returncode}:\n"
                 f"{r.stdout}\n{r.stderr[-3000:]}")
        log("agent: --once exits 0 when stored, 1 when refused (403)")
        logf = open(self.tmp / "agent.log", "wb")  # noqa: SIM115 - the process owns it
        self.procs["agent"] = subprocess.Popen(["bash", "-c", f"{cmd}{sim} --flush 2"], cwd=self.tmp,
                                               env=env, stdout=logf, stderr=subprocess.STDOUT,
                                               start_new_session=True)

    def stop(self) -> None:
        for name, p in reversed(list(self.procs.items())):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(30)
                    log(f"{name} needed SIGKILL")


# --- the phases ----------------------------------------------------------------------------

def copy_tree(dst: Path) -> None:
    for f in tree_files():
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dst / f)


def build_and_check(site: Site) -> Path:
    src = site.src
    wheel = next((src / "dist").glob("gpufleet-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    problems = check_wheel(names, src)  # the copy it was built from: others may be editing the tree
    log(f"wheel {wheel.name}: {len(names)} files, {sum(n.startswith('gpufleet/api/static/') for n in names)} "
        f"static assets")
    log("sdist: python -m build --sdist (in its own virtualenv)")
    bvenv = site.tmp / "venv-build"
    venv.EnvBuilder(with_pip=True, clear=True).create(bvenv)
    for cmd in ([str(bvenv / "bin" / "pip"), "install", "-q", "build"],
                [str(bvenv / "bin" / "python"), "-m", "build", "--sdist", "--outdir", str(site.tmp / "sdist"), "."]):
        r = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            fail(f"`{' '.join(cmd)}` failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    sdist = next((site.tmp / "sdist").glob("gpufleet-*.tar.gz"))
    with tarfile.open(sdist) as t:
        snames = t.getnames()
    problems += check_sdist(snames, src)
    log(f"sdist {sdist.name}: {len(snames)} entries; a wheel from it")
    r = subprocess.run([str(site.venvs["server"] / "bin" / "pip"), "wheel", "--no-deps", "-q", "-w",
                        str(site.tmp / "from-sdist"), str(sdist)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        fail(f"wheel from the sdist failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    again = zipfile.ZipFile(next((site.tmp / "from-sdist").glob("*.whl"))).namelist()
    strip = {n for n in names if ".dist-info/" not in n}
    if (diff := strip ^ {n for n in again if ".dist-info/" not in n}):
        problems.append(f"the wheel built from the sdist differs from the tree's: {sorted(diff)[:20]}")
    if problems:
        fail("artifact contents:\n  " + "\n  ".join(problems))
    log("wheel and sdist hold every file of the package folders")
    return wheel


def check_server_install(site: Site) -> None:
    py = site.venvs["agent"] / "bin" / "python"
    r = subprocess.run([str(py), "-c", "import importlib.util as u; print([m for m in ('fastapi', 'sqlalchemy', "
                        "'celery', 'numpy') if u.find_spec(m)])"], capture_output=True, text=True)
    if r.stdout.strip() != "[]":
        fail(f"the agent install pulled server packages: {r.stdout} {r.stderr}")
    r = site.http("GET", "/static/app.css")
    if r.status_code != 200 or "--bg" not in r.text:
        fail(f"/static/app.css from the installed wheel: HTTP {r.status_code}")
    # `gpufleet grafana push` uploads the dashboards the wheel carries (no checkout beside it)
    env = dict(site.env, PATH=f"{site.venvs['server'] / 'bin'}:{site.env.get('PATH', '')}")
    r2 = subprocess.run(["bash", "-c", "gpufleet grafana push --dry-run --no-datasource"], cwd=site.tmp, env=env,
                        capture_output=True, text=True, timeout=300)
    shipped = sorted(p.stem for p in (site.src / "dashboards" / "json").glob("*.json"))
    if r2.returncode != 0 or json.loads(r2.stdout)["dashboards"] != shipped:
        fail(f"grafana push --dry-run from the wheel: {r2.returncode}\n{r2.stdout[-2000:]}\n{r2.stderr[-2000:]}")
    log(f"server install: /static/app.css served; grafana push has the {len(shipped)} dashboards")


def check_data_arrives(site: Site) -> str:
    viewer = site.tokens["alice"]

    def job_on_node() -> str | None:
        r = site.http("GET", "/api/v1/jobs", viewer, params={"cluster": "prod", "limit": 50})
        r.raise_for_status()
        items = r.json()["data"]
        return items[0]["job_id"] if items else None

    job = wait_for(job_on_node, 300, "the simulated agent's job in /api/v1/jobs")
    log(f"agent daemon: job {job} on gpu-a017 is in the API")
    return str(job)


def check_analysis_and_slack(site: Site, slack: SlackSink) -> None:
    from gpufleet.agent.simulator import make_job, write_ndjson_history

    now = time.time()
    job = make_job("idle_gpu", "smoke-idle", 4, now - 45 * 60, 45 * 60, node_prefix="hist")
    hist = site.tmp / "history.ndjson"
    with hist.open("w") as f:
        write_ndjson_history(f, [job], interval_s=10.0, cluster="prod")
    cmd = f"gpufleet import {hist}"
    log(f"server: {cmd}")
    env = dict(site.env, PATH=f"{site.venvs['server'] / 'bin'}:{site.env.get('PATH', '')}")
    r = subprocess.run(["bash", "-c", cmd], cwd=site.tmp, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        fail(f"`{cmd}` exited {r.returncode}:\n{r.stdout}\n{r.stderr[-3000:]}")
    viewer = site.tokens["alice"]

    def flagged() -> list[str]:
        site.died("worker")
        site.died("beat")
        r = site.http("GET", "/api/v1/flags", viewer, params={"open": "true", "cluster": "prod"})
        r.raise_for_status()
        return [f["kind"] for f in r.json()["data"] if f["job_id"] == "smoke-idle"]

    kinds = wait_for(flagged, 600, "beat + worker's analysis pass to flag job smoke-idle", every=1.0)
    log(f"analysis (beat -> worker) flagged smoke-idle: {sorted(set(kinds))}")
    msg = wait_for(lambda: [m for m in slack.messages if "smoke-idle" in json.dumps(m)], 600,
                   "the alert for smoke-idle at the Slack stand-in", every=1.0)
    log(f"Slack stand-in got {len(slack.messages)} message(s), {len(msg)} about smoke-idle")


def watch(pg: Any) -> list[str]:
    """The page's script errors and failed requests, as they happen."""
    errors: list[str] = []

    def console(m: Any) -> None:
        if m.type == "error":
            errors.append(f"console: {m.text}")

    def response(r: Any) -> None:
        if r.status >= 400:
            errors.append(f"HTTP {r.status} {r.url}")

    pg.on("console", console)
    pg.on("pageerror", lambda x: errors.append(f"pageerror: {x}"))
    pg.on("response", response)
    return errors


def check_pages(site: Site, job: str) -> None:
    from playwright.sync_api import sync_playwright

    admin = site.tokens["smoke-admin"]
    gpus = site.http("GET", "/api/v1/nodes/gpu-a017", site.tokens["alice"], params={"cluster": "prod"})
    gpus.raise_for_status()
    uuid_ = re.search(r'"uuid":\s*"([^"]+)"', gpus.text)
    viewer_pages = ["/", "/jobs", "/flags", f"/jobs/{job}?cluster=prod", "/nodes/gpu-a017?cluster=prod",
                    "/jobs/smoke-idle?cluster=prod"]
    if uuid_:
        viewer_pages.append(f"/gpus/{uuid_.group(1)}")
    # The API's own pages (Swagger UI, ReDoc: their assets come from the installed fastapi-offline)
    # have their own look: checked for loading without a failed request or script error.
    admin_pages = ["/tokens", "/silences", "/docs", "/redoc"]
    shots = Path(os.environ.get("SMOKE_SCREENSHOTS", site.tmp / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            for token, pages in (("alice", viewer_pages), ("smoke-admin", admin_pages)):
                ctx = browser.new_context(viewport={"width": 1440, "height": 900})
                pg = ctx.new_page()
                pg.set_default_timeout(60000)
                errors = watch(pg)
                pg.goto(site.url + "/")
                pg.wait_for_url("**/signin**")
                pg.fill("#token", site.tokens[token] if token == "alice" else admin)
                pg.click("#signin-form button[type=submit]")
                pg.wait_for_function("() => !location.pathname.startsWith('/signin')")
                errors.clear()  # the 401s that sent the browser to /signin
                for path in pages:
                    pg.goto(site.url + path)
                    if token == "alice":  # the dashboard pages say when their data is in
                        pg.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
                    pg.wait_for_load_state("networkidle")
                    bg = pg.evaluate("() => getComputedStyle(document.body).backgroundColor")
                    sheets = pg.evaluate("() => [...document.styleSheets].map(s => s.href).filter(Boolean)")
                    name = re.sub(r"\W+", "-", path.split("?")[0]).strip("-") or "fleet"
                    pg.screenshot(path=str(shots / f"smoke-{name}.png"), full_page=False)
                    text = pg.inner_text("body")
                    if bg != BG and path not in ("/docs", "/redoc"):
                        fail(f"{path} is not styled (body background {bg}, stylesheets {sheets})")
                    if pg.url.split("?")[0].endswith("/signin"):
                        fail(f"{path} sent the signed-in {token} back to /signin")
                    if errors:
                        fail(f"{path}: {errors}")
                    if "Loading..." in text:
                        fail(f"{path} still says Loading... once its data is in")
                    what = "loaded" if path in ("/docs", "/redoc") else "styled"
                    log(f"browser ({token}): {path} {what}, {len(sheets)} stylesheet(s), no errors")
                ctx.close()
        finally:
            browser.close()


def main() -> int:
    admin_url = os.environ.get("GPUFLEET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    redis_url = os.environ.get("GPUFLEET_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-smoke-"))
    slack = SlackSink()
    ok = False
    try:
        with throwaway_database(admin_url) as db_url:
            site = Site(tmp, db_url, redis_url, slack)
            try:
                copy_tree(site.src)
                lines = readme_block((REPO / "README.md").read_text())
                build = [ln for ln in lines if "pip wheel" in ln]
                if not build:
                    fail("README production block: no `pip wheel` line")
                site.run_block(build)
                build_and_check(site)
                site.run_block([ln for ln in lines if "pip wheel" not in ln])
                check_server_install(site)
                site.step("server", "gpufleet token create smoke-admin --role admin")
                job = check_data_arrives(site)
                check_analysis_and_slack(site, slack)
                check_pages(site, job)
                ok = True
            finally:
                site.stop()  # before the database goes
                if not ok:
                    for f in sorted(tmp.glob("*.log")):
                        print(f"--- {f.name} (last 3000 chars)\n{f.read_text(errors='replace')[-3000:]}")
        log(f"PASSED (scratch {tmp})")
    finally:
        slack.close()
        if os.environ.get("SMOKE_KEEP") != "1":
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
