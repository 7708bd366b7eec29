/* gpufleet dashboard. Plain script, no build step; charts by uPlot (served from the
 * installed uplot-python package). Every string from the API goes into the DOM as a text
 * node or an attribute value, never through innerHTML, so a job named <script>..</script>
 * stays text. Each page sets window.__gpufleet.ready when it has drawn its data (tests and
 * the render benchmark wait on it). */
"use strict";
(() => {
  const root = document.getElementById("app");
  const cfg = JSON.parse(root.dataset.config);
  const T0 = performance.now();
  const state = (window.__gpufleet = { ready: false, renderMs: null, charts: {}, errors: [] });
  // live refresh period; ?refresh=<seconds> overrides it (>= 2 s)
  const REFRESH_MS = Math.max(2000, 1000 * (Number(new URLSearchParams(location.search).get("refresh")) || 15));

  // The sticky time bar sits right under the sticky header (whose height depends on its
  // contents: search box, user menu), so neither hides the other or the charts' titles.
  const headerH = () => { const hd = document.querySelector("header"); if (hd) document.documentElement.style.setProperty("--header-h", `${Math.ceil(hd.getBoundingClientRect().height)}px`); };
  headerH();
  addEventListener("resize", headerH);
  if (window.ResizeObserver && document.querySelector("header")) new ResizeObserver(headerH).observe(document.querySelector("header"));

  // ---- DOM helpers -------------------------------------------------------------------
  const { h, append } = window.gpufleetDom; // api/static/dom.js
  const clear = (el) => { while (el.firstChild) el.removeChild(el.firstChild); return el; };
  const fill = (el, ...kids) => append(clear(el), kids);
  const enc = encodeURIComponent;
  const qs = (o) => Object.entries(o).filter(([, v]) => v !== null && v !== undefined && v !== "")
    .map(([k, v]) => `${enc(k)}=${enc(v)}`).join("&");

  // ---- formatting: one rule for every page (fmt.js) -----------------------------------
  const F = window.gpufleetFmt;
  const { dash, num, gh, gib, rate, when } = F;
  const pct = (v) => F.pct(v);  // whole percent; one argument, so it is safe in Array.map
  function dur(s) {
    if (s === null || s === undefined || s < 0) return dash;
    const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    return d ? `${d}d ${hh}h` : hh ? `${hh}h ${String(m).padStart(2, "0")}m` : `${m}m`;
  }
  const now = () => Date.now() / 1000;
  // SM activity -> red (idle) .. amber .. green (busy); grey = no data
  function heat(v) {
    if (v === null || v === undefined) return "#30363d";
    const x = Math.max(0, Math.min(1, v));
    const hue = x < 0.5 ? x * 2 * 45 : 45 + (x - 0.5) * 2 * 75;
    return `hsl(${hue.toFixed(0)} ${x < 0.5 ? 70 : 60}% ${x < 0.5 ? 45 : 40}%)`;
  }
  const jobHref = (cluster, id) => `/jobs/${enc(id)}?${qs({ cluster })}`;
  const nodeHref = (cluster, name) => `/nodes/${enc(name)}?${qs({ cluster })}`;

  async function api(path) {
    const r = await fetch(path, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!r.ok) {
      let detail = `${r.status} ${r.statusText}`;
      try { const j = await r.json(); if (j.detail) detail = typeof j.detail === "string" ? j.detail : JSON.stringify(j.detail); } catch { /* not JSON */ }
      const e = new Error(detail); e.status = r.status; throw e;
    }
    return r.json();
  }
  // The flag-kind registry (GET /api/v1/flag-kinds, from gpufleet/flagkinds.toml): kinds,
  // titles, evidence labels and units. Never copied here, so a new kind needs no change.
  // evidence.js fetches it once and formats every flag's evidence from it.
  const EV = window.gpufleetEvidence;
  let KINDS = { kinds: [], common_evidence: {} };
  const kindsReady = EV.registry().then((r) => { KINDS = r; }, () => { /* pages still show raw names */ });
  const kindOf = (name) => KINDS.kinds.find((k) => k.name === name);
  const kindTitle = (name) => (kindOf(name) || {}).title || name;
  window.gpufleetFlagTitle = kindTitle;  // node.js labels its flag table with the registry's titles
  const kindOptions = () => [["", "any"], ...KINDS.kinds.map((k) => [k.name, k.title])];
  const status = (t) => { document.getElementById("status").textContent = t; };
  function done() {
    if (!state.ready) { state.renderMs = performance.now() - T0; state.ready = true; document.body.dataset.ready = "1"; }
  }
  function fail(err) {
    state.errors.push(String(err.message || err));
    fill(root, h("p", { class: "error" }, `Could not load: ${err.message || err}`));
    done();
  }
  // Open flags, most severe first: "3 · 1 critical" in red when any is critical
  const SEVS = ["critical", "warning", "info"];
  function openFlagsKpi(byS) {
    const total = Object.values(byS || {}).reduce((a, b) => a + b, 0);
    const worst = SEVS.find((x) => byS[x]);
    const el = h("div", { class: `kpi${worst ? ` sev-${worst}` : ""}`, id: "kpi-open-flags",
      title: SEVS.filter((x) => byS[x]).map((x) => `${byS[x]} ${x}`).join(", ") || "none" },
    h("div", { class: "v" }, `${total}`, worst === "critical" ? h("span", { class: "sev critical" }, ` · ${byS.critical} critical`) : null),
    h("div", { class: "l" }, "Open flags"));
    return el;
  }
  const kpi = (label, value, title) => h("div", { class: "kpi", title }, h("div", { class: "v" }, value), h("div", { class: "l" }, label));
  // The chip reads as the registry's title, not the identifier; the identifier stays in the tooltip and
  // data-kind, for people who grep logs or the API for it.
  const chip = (f) => h("span", { class: `chip ${f.severity}${f.open === false ? " closed" : ""}`, "data-kind": f.kind,
    title: `${f.kind}: ${f.severity}${f.open === false ? " (resolved)" : ""}` }, kindTitle(f.kind));
  function table(cols, rows, opts = {}) {
    const head = h("tr", {}, cols.map((c) => {
      const th = h("th", { class: [c.n ? "n" : "", c.sort ? "sortable" : "", c.sort && opts.sort === c.sort ? `sorted ${opts.order === "asc" ? "asc" : ""}` : ""].join(" "), title: c.title }, c.label);
      if (c.sort && opts.onSort) th.addEventListener("click", () => opts.onSort(c.sort));
      return th;
    }));
    const body = rows.map((r) => h("tr", {}, cols.map((c) => h("td", { class: [c.n ? "n" : "", c.wrap ? "wrap" : ""].join(" ") }, c.get(r)))));
    // wide tables scroll inside their box instead of widening the page
    return h("div", { class: "tw" }, h("table", { class: opts.class }, h("thead", {}, head), h("tbody", {}, body)));
  }
  function every(ms, fn) {
    // bounded live refresh: skipped while the tab is hidden, one request at a time
    let busy = false;
    setInterval(async () => {
      if (document.hidden || busy) return;
      busy = true;
      try { await fn(); state.refreshes = (state.refreshes || 0) + 1; status(`updated ${F.clock()}`); } catch (e) { status(`update failed: ${e.message}`); } finally { busy = false; }
    }, ms);
  }

  // ---- Fleet ---------------------------------------------------------------------------
  async function fleetPage() {
    const W = window.gpufleetFleet ? window.gpufleetFleet.range() : { key: "24h", label: "24 h" };  // fleet.js
    const kpis = h("div", { class: "kpis" });
    const waste = h("div", { class: "bars" });
    const grid = h("div", { class: "grid", id: "gpu-grid" });
    const gridNote = h("span", { class: "muted" });
    const flagsBox = h("div");
    const topJobs = h("div");
    const topUsers = h("div");
    const workloads = h("div", { id: "workloads" });
    fill(root, 
      h("h1", {}, "Fleet", window.gpufleetFleet ? window.gpufleetFleet.rangePicker(W) : null), kpis,
      h("h2", {}, "GPUs by node, colored by SM activity (newest minute)"),
      h("div", { class: "legend" }, "idle", h("span", { class: "ramp" }), "busy",
        h("span", { class: "cell", style: { marginLeft: "12px" } }), "no data",
        h("span", { class: "cell free", style: { marginLeft: "12px", background: "transparent" } }), "unallocated", gridNote),
      grid,
      h("div", { class: "cols" },
        h("section", {}, h("h2", {}, `GPU-hours wasted, last ${W.label}, by cause`), waste),
        h("section", {}, h("h2", {}, `Top wasting users (${W.label})`), topUsers)),
      h("section", {}, h("h2", {}, `GPU-hours wasted, last ${W.label}, by workload: training and serving`), workloads),
      h("section", {}, h("h2", {}, "Open flags, most severe first"), flagsBox),
      h("section", {}, h("h2", {}, `Top wasting jobs (${W.label})`), topJobs));

    // The fleet's GPU-time ledger over the page's range (GET /api/v1/fleet/ledger): goodput,
    // coverage, waste by cause and by user all come from it, so they add up to one total. Null
    // where the server has no ledger yet (an older server): the summary's figures stand in.
    const ledger = (group) => api(`/api/v1/fleet/ledger?${qs({ group_by: group, start: `-${W.key}` })}`)
      .catch((e) => (e.status === 404 ? null : Promise.reject(e)));

    async function loadSummary() {
      const [s, byCause, byUser] = await Promise.all([api(`/api/v1/fleet/summary?window=${W.key}`), ledger("cause"), ledger("user")]);
      await kindsReady;  // the waste bars are labelled with the registry's titles
      // the ledger once it holds GPU time for the range (analysis folds it per job-minute)
      const L = byCause && byCause.total && byCause.total.allocated_gpu_hours > 0 ? byCause.total : null;
      const ledgerKpis = L ? [
        kpi(`Goodput ${W.label}`, pct(L.goodput), "productive / observed GPU time (the ledger; docs/goodput.md)"),
        kpi(`Coverage ${W.label}`, pct(L.coverage), "observed / allocated GPU time: the rest had neither telemetry nor progress"),
        kpi(...window.gpufleetFleet.wasteKpi({ wasted_gpu_hours_total: L.wasted_gpu_hours, allocated_gpu_hours: L.allocated_gpu_hours }, W)),
      ] : [
        ...(window.gpufleetFleetEttr ? [kpi("Fleet ETTR", ...window.gpufleetFleetEttr(s))] : []),
        kpi(...window.gpufleetFleet.wasteKpi(s, W)),
      ];
      fill(kpis,
        kpi("SM active now", pct(s.current.sm_active), "mean over reporting GPUs, newest minute"),
        kpi("Tensor active now", pct(s.current.tensor_active)),
        kpi(`SM active ${W.label}`, pct(s.window.sm_active)),
        kpi(`Tensor active ${W.label}`, pct(s.window.tensor_active)),
        kpi("GPUs reporting", `${s.gpus_reporting} / ${s.gpus}`, `${s.nodes} nodes`),
        kpi("GPUs allocated", `${s.gpus_allocated}`),
        ...ledgerKpis,
        openFlagsKpi(s.open_flags));
      const causes = L ? byCause.groups.filter((g) => g.kind === "badput" && g.gpu_hours > 0).map((g) => [g.key, g.gpu_hours])
        : Object.entries(s.wasted_gpu_hours).filter(([, v]) => v > 0);
      const title = (k) => (L ? ((byCause.categories || []).find((c) => c.name === k) || {}).title || kindTitle(k) : kindTitle(k));
      const max = Math.max(1e-9, ...causes.map(([, v]) => v || 0));
      // causes that round to 0.0 GPU-h are summed in one line rather than drawn as empty bars
      const big = causes.filter(([, v]) => gh(v) !== "0.0"), small = causes.filter(([, v]) => gh(v) === "0.0");
      fill(waste, causes.length ? [big.map(([k, v]) => h("div", { class: "bar", "data-kind": k }, h("span", { title: k }, title(k)),
        h("div", { class: "track" }, h("div", { class: "fill", style: { width: `${((v || 0) / max) * 100}%` } })),
        h("span", { class: "n" }, gh(v)))),
      small.length ? h("p", { class: "muted", id: "small-causes", title: small.map(([k, v]) => `${title(k)} ${F.num(v, 3)}`).join(", ") },
        `+ ${F.plural(small.length, "cause", "causes")} under 0.05 GPU-h each`) : null]
        : h("p", { class: "muted" }, `No waste in the last ${W.label}.`));
      fill(workloads, window.gpufleetFleet.workloadTable(s, { h, table, title }));
      const wasters = s.top_jobs.filter((j) => j.wasted_gpu_hours > 0);
      const users = L && byUser ? byUser.groups.map((g) => ({ user: g.key, jobs: g.jobs, allocated_gpu_hours: g.allocated_gpu_hours,
        wasted_gpu_hours: g.wasted_gpu_hours, goodput: g.goodput })) : s.top_users;
      const wastingUsers = users.filter((u) => u.wasted_gpu_hours > 0).slice(0, 10);
      fill(topJobs, wasters.length ? table([
        { label: "Job", get: (j) => h("a", { href: jobHref(j.cluster, j.job_id) }, j.job_id) },
        { label: "Name", get: (j) => h("span", { class: "trunc" }, j.name ?? "") },
        { label: "User", get: (j) => j.user ?? dash },
        { label: "Wasted GPU-h", n: true, get: (j) => gh(j.wasted_gpu_hours) },
        { label: "Goodput", n: true, title: "productive / observed GPU time (the job's ledger)", get: (j) => pct(j.goodput_score) },
      ], wasters, { class: "topjobs" }) : h("p", { class: "muted" }, s.top_jobs.length ? "No job wasted GPU time." : "No analysed jobs yet."));
      fill(topUsers, wastingUsers.length ? table([
        { label: "User", get: (u) => h("a", { href: `/jobs?${qs({ user: u.user ?? "", sort: "waste" })}` }, u.user ?? dash) },
        { label: "Jobs", n: true, get: (u) => u.jobs },
        { label: "Allocated GPU-h", n: true, get: (u) => gh(u.allocated_gpu_hours) },
        { label: "Wasted GPU-h", n: true, get: (u) => gh(u.wasted_gpu_hours) },
        ...(L && byUser ? [{ label: "Goodput", n: true, title: "productive / observed GPU time", get: (u) => pct(u.goodput) }] : []),
      ], wastingUsers, { class: "topusers" }) : h("p", { class: "muted" }, users.length ? "No user wasted GPU time." : "No analysed jobs yet."));
    }

    async function loadGrid() {
      const nodes = [];
      let cursor = null;
      for (let page = 0; page < 10; page++) {  // at most 20,000 nodes
        const r = await api(`/api/v1/nodes?${qs({ limit: 2000, cursor })}`);
        nodes.push(...r.data);
        cursor = r.next_cursor;
        if (!cursor) break;
      }
      const frag = document.createDocumentFragment();
      let n = 0;
      for (const node of nodes) {
        const cells = node.gpus.map((g) => {
          n++;
          const c = g.current;
          const gf = g.flags || [];  // open flags naming this GPU, most severe first
          const tip = [`${node.name} GPU ${g.index}`, g.model, c ? `SM ${pct(c.sm_active)} · tensor ${pct(c.tensor_active)} · ${num(c.power_w, 0)} W` : "no data in 5 min",
            g.job ? `job ${g.job.job_id} (${g.job.user ?? "?"})${g.job.name ? ` ${g.job.name}` : ""}` : "not allocated",
            ...gf.map((f) => `⚑ ${f.severity}: ${kindTitle(f.kind)} (job ${f.job_id})`)].filter(Boolean).join("\n");
          return h("a", { class: `cell${g.job ? "" : " free"}${gf.length ? ` flagged sev-${gf[0].severity}` : ""}`,
            href: gf.length ? nodeHref(node.cluster, node.name) : g.job ? jobHref(g.job.cluster, g.job.job_id) : nodeHref(node.cluster, node.name),
            title: tip, "data-gpu": g.uuid, "data-sm": c && c.sm_active !== null ? c.sm_active : "", style: { background: g.job || (c && c.sm_active > 0.05) ? heat(c ? c.sm_active : null) : "transparent" } });  // no job, no work: not "idle red"
        });
        const worst = SEVS.find((x) => (node.flags || []).some((f) => f.severity === x));
        frag.append(h("div", { class: `node${node.stale ? " stale" : ""}${worst ? ` sev-${worst}` : ""}`, "data-node": node.name },
          h("a", { class: "nn", href: nodeHref(node.cluster, node.name),
            title: [node.name, ...(node.flags || []).map((f) => `⚑ ${f.severity}: ${kindTitle(f.kind)} (job ${f.job_id})`)].join("\n") },
          worst ? h("span", { class: `sev ${worst}` }, "⚑ ") : null, node.name),
          h("div", { class: "cells" }, cells)));
      }
      fill(grid, frag);
      gridNote.textContent = ` · ${nodes.length} nodes, ${n} GPUs`;
      if (!nodes.length) grid.append(h("p", { class: "muted" }, "No nodes yet: start an agent (gpufleet agent --simulate)."));
    }

    async function loadFlags() {
      await kindsReady;
      const f = await api("/api/v1/flags?open=true&limit=15&sort=severity");  // most severe first
      fill(flagsBox, f.data.length ? table([
        { label: "Flag", get: (x) => chip(x) },
        { label: "Severity", get: (x) => h("span", { class: `sev ${x.severity}` }, x.severity) },
        { label: "Job", get: (x) => h("a", { href: jobHref(x.cluster, x.job_id) }, x.job_id) },
        { label: "User", get: (x) => x.user ?? dash },
        { label: "Wasted GPU-h", n: true, get: (x) => gh(x.wasted_gpu_hours) },
        { label: "Suggestion", wrap: true, get: (x) => h("span", { class: "clamp", title: x.suggestion }, x.suggestion) },
      ], f.data, { class: "openflags" }) : h("p", { class: "muted" }, "No open flags."),
      f.count > f.data.length ? h("p", {}, h("a", { href: "/flags" }, `all ${f.count} open flags →`)) : null);
    }

    await Promise.all([loadSummary(), loadGrid(), loadFlags()]);
    done();
    every(REFRESH_MS, () => Promise.all([loadSummary(), loadGrid(), loadFlags()]));
  }

  // ---- Jobs ----------------------------------------------------------------------------
  async function jobsPage() {
    await kindsReady;
    const p = new URLSearchParams(location.search);
    const f = { cluster: p.get("cluster") || "", user: p.get("user") || "", state: p.get("state") || "",
      flag: p.get("flag") || "", since: p.get("since") || "", sort: p.get("sort") || "start", order: p.get("order") || "desc" };
    const out = h("div");
    const count = h("span", { class: "muted", id: "job-count" });
    const input = (name, label, ph) => h("label", {}, label, h("input", { name, value: f[name], placeholder: ph, size: 12,
      onchange: (e) => { f[name] = e.target.value.trim(); reload(); } }));
    const select = (name, label, options) => h("label", {}, label, h("select", { name, onchange: (e) => { f[name] = e.target.value; reload(); } },
      options.map(([v, t]) => h("option", { value: v, selected: f[name] === v }, t))));
    fill(root, h("h1", {}, "Jobs ", count),
      h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); reload(); } },
        input("user", "User", "any user"), input("cluster", "Cluster", "all clusters"),
        select("state", "State", [["", "any"], ["running", "running"], ["ended", "ended"]]),
        select("flag", "Flag", kindOptions()),
        select("since", "Active in", [["", "any time"], ["-1h", "last hour"], ["-24h", "last 24 h"], ["-7d", "last 7 days"]]),
        select("sort", "Sort", [["start", "start time"], ["waste", "wasted GPU-h"], ["gpus", "GPUs"]]),
        select("order", "Order", [["desc", "desc"], ["asc", "asc"]])),
      out);

    let cursor = null;
    let rows = [];
    const cols = () => [
      { label: "Job", get: (j) => h("a", { href: jobHref(j.cluster, j.job_id) }, j.job_id) },
      { label: "Name", get: (j) => h("span", { class: "trunc", title: j.name ?? "" }, j.name ?? "") },
      { label: "User", get: (j) => j.user ?? dash },
      { label: "Cluster", get: (j) => j.cluster },
      { label: "State", get: (j) => h("span", { class: `state-${j.state}` }, j.state) },
      { label: "GPUs", n: true, sort: "gpus", get: (j) => j.n_gpus },
      { label: "Start", sort: "start", get: (j) => when(j.start_ts) },
      { label: "Duration", n: true, get: (j) => dur((j.end_ts || now()) - (j.start_ts || now())) },
      { label: "SM", n: true, title: "mean sm_active (report)", get: (j) => pct(j.sm_active_mean) },
      { label: "Tensor", n: true, get: (j) => pct(j.tensor_active_mean) },
      { label: "Wasted GPU-h", n: true, sort: "waste", get: (j) => gh(j.wasted_gpu_hours) },
      { label: "Goodput", n: true, title: "productive / observed GPU time (the job's ledger)", get: (j) => pct(j.goodput_score) },
      { label: "Flags", get: (j) => j.flags.map(chip) },
    ];
    function draw(more) {
      fill(out, rows.length ? table(cols(), rows, { sort: f.sort, order: f.order, class: "jobs",
        onSort: (k) => { if (f.sort === k) f.order = f.order === "desc" ? "asc" : "desc"; else { f.sort = k; f.order = "desc"; } syncForm(); reload(); } })
        : h("p", { class: "muted" }, "No jobs match these filters."),
      more ? h("button", { class: "more", onclick: () => load(true) }, "Load more") : null);
    }
    function syncForm() {
      for (const el of root.querySelectorAll(".filters select, .filters input")) el.value = f[el.name];
    }
    async function load(append) {
      const r = await api(`/api/v1/jobs?${qs({ ...f, limit: 100, cursor: append ? cursor : null })}`);
      rows = append ? rows.concat(r.data) : r.data;
      cursor = r.next_cursor;
      count.textContent = `${r.count} match`;
      draw(!!cursor);
    }
    async function reload() {
      history.replaceState(null, "", `/jobs?${qs(f)}`);
      try { await load(false); } catch (e) { fill(out, h("p", { class: "error" }, e.message)); }
      state.reloads = (state.reloads || 0) + 1;
    }
    await load(false);
    done();
  }

  // ---- Job -----------------------------------------------------------------------------
  // The page itself is job.js (charts.js, heatmap.js); the flag cards stay here, beside the
  // evidence formatting they share with the flags page.
  function jobFlagCards(j) {
    return h("div", { class: "flags", id: "flags" }, j.flags.length ? j.flags.map((f) => h("div", { class: `flag ${f.severity}` },
      h("div", {}, h("span", { class: "k", title: f.kind }, kindTitle(f.kind)), " ",
        h("span", { class: `chip ${f.severity}`, "data-kind": f.kind }, f.severity), f.scope ? h("span", { class: "muted" }, ` on ${f.scope}`) : null,
        h("span", { class: "muted", style: { float: "right" } }, `${gh(f.wasted_gpu_hours)} GPU-h${f.open ? "" : " · resolved"}`)),
      h("div", { class: "s" }, f.suggestion),
      EV.table(f.kind, f.evidence),  // evidence.js: labels, units, meanings, folded lists
    )) : h("p", { class: "muted" }, j.summary.source === "live" ? "Not analysed yet; no flags." : "No flags: this job uses its GPUs well."));
  }
  const jobPage = () => window.gpufleetJobPage({ root, cfg, state, h, fill, api, qs, enc, table, kpi, when, dur, now, pct, num, gh, gib, rate, dash,
    kindsReady, kindTitle, flagCards: jobFlagCards, nodeHref, jobHref, done, fail });

  // ---- Node: node.js (charts, events, jobs) -------------------------------------------

  // ---- Flags ---------------------------------------------------------------------------
  async function flagsPage() {
    await kindsReady;
    const p = new URLSearchParams(location.search);
    const f = { open: p.get("open") ?? "true", kind: p.get("kind") || "", severity: p.get("severity") || "", sort: p.get("sort") || "severity" };
    // severity (then waste) and waste come from the API's own order, across pages; newest sorts the page
    const sorters = { severity: null, waste: null, newest: (a, b) => b.start_ts - a.start_ts };
    // One line of evidence (evidence.js): the measured cause, then the first three numbers the
    // registry labels, with their units; unlabelled keys read as words, long lists as counts.
    const evLine = (x) => EV.line(x.kind, x.evidence, 3);
    const out = h("div");
    const sel = (name, label, options) => h("label", {}, label, h("select", { name, onchange: (e) => { f[name] = e.target.value; load(); } },
      options.map(([v, t]) => h("option", { value: v, selected: f[name] === v }, t))));
    fill(root, h("h1", {}, "Flags"), h("div", { class: "filters" },
      sel("open", "Status", [["true", "open"], ["false", "resolved"], ["", "all"]]),
      sel("kind", "Kind", kindOptions()),
      sel("severity", "Severity", [["", "any"], ...(KINDS.severities || ["critical", "warning", "info"]).slice().reverse().map((v) => [v, v])]),
      sel("sort", "Sort", [["severity", "most severe"], ["waste", "most wasteful"], ["newest", "newest"]])), out);
    async function load() {
      history.replaceState(null, "", `/flags?${qs(f)}`);
      const r = await api(`/api/v1/flags?${qs({ open: f.open, kind: f.kind, severity: f.severity, limit: 200, sort: f.sort === "waste" ? "waste" : "severity" })}`);
      if (sorters[f.sort]) r.data.sort(sorters[f.sort]);
      fill(out, h("p", { class: "muted" }, `${F.plural(r.count, "flag", "flags")}${r.count > r.data.length ? `, showing the first ${r.data.length}` : ""}`),
        r.data.length ? table([
          { label: "Flag", get: (x) => chip(x) },
          { label: "Severity", get: (x) => h("span", { class: `sev ${x.severity}` }, x.severity) },
          { label: "Job", get: (x) => h("a", { href: jobHref(x.cluster, x.job_id) }, x.job_id) },
          { label: "Name", get: (x) => h("span", { class: "trunc" }, x.job_name ?? "") },
          { label: "User", get: (x) => x.user ?? dash },
          { label: "Scope", get: (x) => x.scope || "job" },
          { label: "Since", get: (x) => when(x.start_ts) },
          { label: "Wasted GPU-h", n: true, get: (x) => gh(x.wasted_gpu_hours) },
          { label: "Evidence", wrap: true, get: (x) => h("span", { class: "evline" }, evLine(x)) },
          { label: "Suggestion", wrap: true, get: (x) => x.suggestion },
        ], r.data, { class: "flagtable" }) : null);
    }
    await load();
    done();
  }

  const pages = { fleet: fleetPage, jobs: jobsPage, job: jobPage, flags: flagsPage,
    node: () => window.gpufleetNodePage({ root, cfg, h, fill, api, table, when, pct, num, dash, enc, jobHref, state, chip, kindTitle, kindsReady }).then(done),  // node.js
    gpu: () => window.gpufleetGpuPage({ root, cfg, h, fill, api, table, kpi, when, pct, num, dash, enc, jobHref, nodeHref }).then(done),  // gpu.js
    deployment: () => window.gpufleetDeploymentPage({ root, cfg, api }).then(done) };  // deployment.js
  // The registry loads alongside each page's own data; pages await it only before they draw.
  (pages[cfg.page] || fleetPage)().catch(fail);
})();
