/* The job page as an instrument (docs/web.md "Job page"): header and KPIs, the goodput and
 * collectives panels (goodput.js, collectives.js), the flags, then one shared time range for
 * a GPU x time heatmap, per-GPU charts with a legend naming every GPU (the flagged ones
 * highlighted), NVLink per GPU and InfiniBand per NIC against their capacities, temperature,
 * the SM clock with its throttle reasons, events as markers on every chart, and a comparison
 * with another run. app.js calls window.gpufleetJobPage(ctx) with its shared helpers.
 * Speed (bench/web/job_page_speed.py): performance marks "job:data" when the series have
 * arrived and "job:interactive" once what is on screen is drawn; charts below the fold are
 * built when they scroll near. */
"use strict";
(() => {
  const GPU_CHARTS = [
    { field: "sm_active", title: "SM active", ratio: true },
    { field: "tensor_active", title: "Tensor active", ratio: true },
    { field: "dram_active", title: "DRAM active", ratio: true },
    { field: "power_w", title: "Power", unit: "W" },
    // "later": fetched once the page is interactive (on the first grid), so their parse is not
    // on the way to the first paint; a chart of them on screen waits for them
    { field: "temp_c", title: "Temperature", unit: "°C", later: true },
    { field: "sm_clock_mhz", title: "SM clock", unit: "MHz", clock: true, later: true },
    { field: "nvlink_tx_bytes_s", title: "NVLink tx per GPU", bytes: true, cap: "nvlink_bytes_s", later: true },
    { field: "nvlink_rx_bytes_s", title: "NVLink rx per GPU", bytes: true, cap: "nvlink_bytes_s", later: true },
  ];
  const FIRST = GPU_CHARTS.filter((g) => !g.later).map((g) => g.field);
  const LATER = [...GPU_CHARTS.filter((g) => g.later).map((g) => g.field), "clock_event_reasons"];
  const LINK_FIELDS = [["pcie_tx_bytes_s", "PCIe tx", "#3fb950"], ["pcie_rx_bytes_s", "PCIe rx", "#238636"],
    ["ib_tx_bytes_s", "IB tx", "#d29922"], ["ib_rx_bytes_s", "IB rx", "#9e6a03"]];
  const REASON_COLORS = { sw_power_cap: "#d29922", hw_slowdown: "#f85149", sw_thermal: "#db6d28", hw_thermal: "#ff7b72",
    hw_power_brake: "#a371f7" };
  const RANGES = [["all", "whole job", null], ["24h", "24 h", 86400], ["6h", "6 h", 21600], ["1h", "1 h", 3600], ["15m", "15 min", 900]];

  window.gpufleetJobPage = async function (c) {
    const { root, cfg, state, h, fill, api, qs, enc, table, kpi, when, dur, now, pct, num, gh, gib, rate, dash } = c;
    const C = window.gpufleetCharts, X = window.gpufleetXid;
    const { job_id: jobId, cluster } = cfg.args;
    const base = `/api/v1/jobs/${enc(jobId)}`;
    // every request starts at once: the series don't wait for the job's metadata
    const tsReq = api(`${base}/timeseries?${qs({ cluster, fields: FIRST.join(",") })}`);
    const linkReq = api(`${base}/timeseries?${qs({ cluster, gpu: "none", fields: LINK_FIELDS.map((l) => l[0]).join(",") })}`);
    const tlReq = api(`${base}/timeline?${qs({ cluster })}`);
    const catReq = api("/api/v1/catalog");
    // the job's GPU-time ledger (GET .../ledger); null where the server has none yet
    const ledReq = api(`${base}/ledger?${qs({ cluster })}`).catch(() => null);
    // the categories' titles live with the ledger (analysis/ledger_categories.toml, served with
    // the fleet ledger): a one-minute range carries them without summing anything
    const catTitlesReq = api("/api/v1/fleet/ledger?group_by=cause&start=-60s").then((r) => r.categories || [], () => []);
    for (const r of [tsReq, linkReq, tlReq, catReq]) r.catch(() => null);  // a 404 is reported once, by the detail call
    let j;
    try { j = await api(`${base}?${qs({ cluster })}`); } catch (e) { return c.fail(e); }
    await c.kindsReady;
    if (X) await X.ready;
    const s = j.summary;
    // One model (docs/goodput.md, "The ledger"): goodput, coverage and waste come from the ledger,
    // the REST one, else the report's own summary of it; no hardware score beside another ETTR.
    const has = (l) => (l && l.allocated_gpu_hours > 0 ? l : null);
    const L = has(await ledReq) || has(j.report && j.report.ledger);
    const catTitles = Object.fromEntries((await catTitlesReq).map((x) => [x.name, x.title]));
    const F = window.gpufleetFmt;
    const header = h("div", {},
      h("h1", {}, `Job ${j.job_id}`, j.name ? h("span", { class: "muted" }, ` · ${j.name}`) : null),
      h("div", { class: "meta" },
        h("span", {}, "user ", h("b", {}, j.user ?? dash)), h("span", {}, "cluster ", h("b", {}, j.cluster)),
        j.account ? h("span", {}, "account ", h("b", {}, j.account)) : null,
        j.partition ? h("span", {}, "partition ", h("b", {}, j.partition)) : null,
        j.namespace ? h("span", {}, "namespace ", h("b", {}, j.namespace)) : null,
        h("span", {}, "state ", h("b", { class: `state-${j.state}` }, j.state)),
        h("span", {}, "start ", h("b", {}, when(j.start_ts))),
        h("span", {}, "duration ", h("b", {}, dur((j.end_ts || now()) - (j.start_ts || now())))),
        h("span", {}, `${j.n_gpus} GPUs on ${j.nodes.length} node${j.nodes.length === 1 ? "" : "s"}`),
        j.links.grafana ? h("a", { href: j.links.grafana, target: "_blank", rel: "noopener", id: "grafana-link" }, "Grafana drilldown ↗") : null,
        h("a", { href: `${base}?${qs({ cluster, format: "csv" })}`, id: "csv-link", class: "sep" }, "per-GPU CSV")),
      Object.keys(j.labels || {}).length ? h("div", { class: "meta" }, "labels ",
        Object.entries(j.labels).map(([k, v]) => h("span", { class: "chip" }, `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`))) : null);
    const kp = h("div", { class: "kpis", id: "job-kpis" },
      ...(L ? [
        kpi("Goodput", pct(L.goodput), "productive / observed GPU time (the job's ledger)"),
        kpi("Coverage", pct(L.coverage), "observed / allocated GPU time: the rest had neither telemetry nor progress"),
        kpi("Allocated GPU-h", gh(L.allocated_gpu_hours)),
        kpi("Wasted GPU-h", gh(L.wasted_gpu_hours), L.cost !== null && L.cost !== undefined ? `${L.cost} ${L.currency || ""}` : ""),
      ] : [
        kpi("Goodput", pct(s.goodput_score), s.source === "live" ? "no report yet" : "productive / observed GPU time"),
        kpi("Allocated GPU-h", gh(s.allocated_gpu_hours)),
        kpi("Wasted GPU-h", gh(s.wasted_gpu_hours)),
      ]),
      kpi("SM active", pct(s.sm_active_mean)), kpi("Tensor active", pct(s.tensor_active_mean)),
      kpi("DRAM active", pct(s.dram_active_mean)), kpi("MFU (est.)", pct(s.mfu_estimate), "tensor_active x peak dense TFLOP/s"),
      kpi("Power", s.power_w_mean === null || s.power_w_mean === undefined ? dash : `${num(s.power_w_mean, 0)} W`));
    const picker = h("div", { class: "range-picker", id: "range-picker" });
    const eventsEl = h("div", { id: "job-events", class: "job-events" });
    const legendEl = h("div", { id: "gpu-legend", class: "gpu-legend" });
    const heatEl = h("div", { id: "heatmap", class: "chart wide" });
    const charts = h("div", { class: "charts", id: "charts" });
    const nicEl = h("div", { id: "nic-charts", class: "charts" });
    const cmpEl = h("div", { id: "compare" });
    const perGpu = h("div");
    const collEl = h("div", { id: "collectives" });  // filled by collectives.js (docs/nccl.md)
    const goodEl = h("div", { id: "goodput" });  // filled by goodput.js (docs/progress.md)
    // Where the allocated GPU time went: every category of the ledger once, adding up to 100%
    const ledgerEl = L ? ledgerTable(L) : null;
    function ledgerTable(l) {
      const titles = catTitles;
      const a = l.allocated_gpu_hours || 0;
      const rows = Object.entries(l.categories || {}).filter(([, v]) => v > 0).sort((x, y) => y[1] - x[1]);
      const color = (k) => (k === "productive" ? "#3fb950" : k === "unobserved" ? "#484f58" : "#d29922");
      return h("table", { id: "ledger", class: "badput" }, h("tbody", {}, rows.map(([k, v]) => h("tr", { "data-cause": k },
        h("td", {}, k === "unobserved" ? "unobserved (no telemetry, no progress)" : titles[k] || c.kindTitle(k).replace(/_/g, " ")),
        h("td", { class: "n" }, `${gh(v)} GPU-h`), h("td", { class: "n" }, a ? F.pct(v / a, 1) : dash),
        h("td", { style: { width: "50%" } }, h("div", { style: { background: color(k), height: "10px", width: `${a ? Math.min(100, (100 * v) / a) : 0}%` } }))))));
    }
    fill(root, header, kp, ledgerEl ? h("h2", {}, "Where the allocated GPU time went") : null, ledgerEl,
      h("h2", {}, "Progress (the job's own steps)"), goodEl, h("h2", {}, "Flags"), c.flagCards(j),
      h("div", { class: "sticky-range" }, h("h2", {}, "Time range ", h("span", { class: "muted", id: "range-label" })), picker),
      eventsEl, h("h2", {}, "GPU x time heatmap"), heatEl,
      h("h2", {}, "Per GPU (bold: job mean)"), legendEl, charts,
      h("h2", {}, "InfiniBand per NIC"), nicEl,
      h("h2", {}, "Compare with another run"), cmpEl,
      h("h2", {}, "Collectives and fabric"), collEl, h("h2", {}, "Per-GPU report"), perGpu);

    const current = new Map(j.gpus.map((g) => [g.uuid, g.current]));
    perGpu.append(table([
      { label: "Node", get: (g) => h("a", { href: c.nodeHref(j.cluster, g.node ?? "") }, g.node ?? dash) },
      { label: "GPU", n: true, get: (g) => g.index ?? dash },
      { label: "UUID", get: (g) => h("a", { class: "trunc muted", title: g.gpu_uuid, href: `/gpus/${enc(g.gpu_uuid)}` }, g.gpu_uuid) },
      { label: "SM", n: true, get: (g) => pct(g.sm_active_mean) },
      { label: "Tensor", n: true, get: (g) => pct(g.tensor_active_mean) },
      { label: "DRAM", n: true, get: (g) => pct(g.dram_active_mean) },
      { label: "Power", n: true, get: (g) => (g.power_w_mean === null || g.power_w_mean === undefined ? dash : `${num(g.power_w_mean, 0)} W`) },
      { label: "SM clock", n: true, get: (g) => (g.sm_clock_mhz_mean === null || g.sm_clock_mhz_mean === undefined ? dash : `${num(g.sm_clock_mhz_mean, 0)} MHz`) },
      { label: "Memory max", n: true, get: (g) => gib(g.fb_used_bytes_max) },
      { label: "SM now", n: true, get: (g) => { const cur = current.get(g.gpu_uuid); return cur ? pct(cur.sm_active) : dash; } },
    ], j.per_gpu, { class: "pergpu" }));

    const boxes = GPU_CHARTS.map((spec) => {
      const readout = h("span", { class: "rd" }), plotEl = h("div"), foot = h("div", { class: "chart-foot" });
      const box = h("div", { class: "chart", id: `chart-${spec.field}` }, h("div", { class: "ct" }, h("b", {}, `${spec.title}${spec.unit ? ` (${spec.unit})` : ""}`), readout), plotEl, foot);
      charts.append(box);
      return { spec, box, plotEl, readout, foot };
    });
    const linkBox = { box: h("div", { class: "chart", id: "chart-interconnect" }, h("div", { class: "ct" }, h("b", {}, "PCIe / IB (job mean per GPU)"), h("span", { class: "rd" })), h("div")) };
    linkBox.box.append(h("div", { class: "keys" }, LINK_FIELDS.map(([, label, color]) => h("span", {}, h("i", { style: { background: color } }), label))));
    charts.append(linkBox.box);

    const [ts, links, tl] = await Promise.all([tsReq, linkReq, tlReq.catch(() => null)]);
    performance.mark("job:data");
    const tData = performance.now();
    const G = ts.gpus.length;
    const t0 = ts.t.length ? ts.t[0] : ts.start, t1 = (ts.t.length ? ts.t[ts.t.length - 1] : ts.start) + ts.step;
    const timeline = C.timeline(t0, t1);
    const limits = (tl && tl.limits) || {};

    // ---- which GPUs the flags name: the GPUs a flag singles out (its scope when a GPU, the
    // evidence's gpu_uuid, the items of its gpus list, hw_fault's objects included), so a node
    // fault on one GPU marks that GPU, not the node's other seven; a node-scoped flag naming no
    // GPU marks the node's GPUs (the straggler node, a degraded NIC's node)
    const flagged = new Map();  // GPU position -> kind titles
    const uuidOf = (v) => (typeof v === "string" ? v : v && typeof v === "object" && typeof v.gpu_uuid === "string" ? v.gpu_uuid : null);
    for (const f of j.flags) {
      const ev = f.evidence || {};
      const named = [f.scope, ev.gpu_uuid, ...(Array.isArray(ev.gpus) ? ev.gpus : [])].map(uuidOf)
        .filter((u) => u && /^(GPU|MIG)-/.test(u));
      const hit = (g) => (named.length ? named.some((u) => g.uuid === u || (u.length >= 8 && g.uuid.startsWith(u)))
        : f.scope && f.scope === g.node);
      ts.gpus.forEach((g, i) => { if (hit(g)) flagged.set(i, [...(flagged.get(i) || []), c.kindTitle(f.kind)]); });
    }
    const label = (g) => `${g.node}:${g.index}`;
    const hue = (i) => Math.round((i * 360) / Math.max(1, G)) % 360;
    // highlight: the GPUs picked in the legend or the heatmap, else the flagged ones
    const picked = new Set();
    const lit = () => (picked.size ? picked : new Set(flagged.keys()));
    let litNow = lit();
    const stroke = (i) => () => (litNow.size && !litNow.has(i) ? `hsla(${hue(i)}, 20%, 55%, 0.18)`
      : litNow.has(i) ? `hsl(${hue(i)}, 85%, 62%)` : `hsla(${hue(i)}, 65%, 60%, ${G > 16 ? 0.35 : 0.6})`);
    const built = [];
    state.plots = built;  // tests read every chart's x range from here
    function relight() {
      litNow = lit();
      for (const { u } of built) {
        for (let i = 0; i < G; i++) u.series[i + 1].width = litNow.has(i) ? 2.2 : 1;
        u.redraw(false);
      }
      for (const chip of legendEl.querySelectorAll(".lg")) chip.classList.toggle("on", litNow.has(Number(chip.dataset.i)));
    }
    const toggle = (i) => { if (picked.has(i)) picked.delete(i); else picked.add(i); relight(); };
    fill(legendEl, h("span", { class: "muted" }, "GPUs (click to highlight): "), ts.gpus.map((g, i) => h("button", {
      class: `lg${flagged.has(i) ? " flagged" : ""}`, "data-i": i, "data-gpu": g.uuid, title: `${g.uuid}${flagged.has(i) ? ` · flagged: ${flagged.get(i).join(", ")}` : ""}`,
      onclick: () => toggle(i) }, h("i", { style: { background: `hsl(${hue(i)}, 70%, 60%)` } }), label(g),
      flagged.has(i) ? h("b", { class: "flag-mark" }, ` ⚑ ${flagged.get(i).join(", ")}`) : null)),
    flagged.size ? h("span", { class: "muted", id: "flagged-note" }, ` · highlighted: ${[...flagged.keys()].map((i) => label(ts.gpus[i])).join(", ")} (named by the flags)`) : null);

    // ---- events: markers on every chart, listed with NVIDIA's meaning
    const events = ((tl && tl.events) || []).map((e) => ({ ...e, short: e.kind === "xid" ? `XID ${e.code}` : e.kind.replace(/_/g, " ") }));
    const meaning = (e) => (X && X.describe(e.kind, e.code)) || e.message || e.kind;
    fill(eventsEl, events.length ? [h("span", { class: "muted" }, `Events on the timeline (${events.length}): `),
      events.slice(0, 12).map((e) => h("span", { class: "ev", title: e.message },
        h("i", { style: { background: C.eventColor(e.kind) } }), `${when(e.ts)} ${e.node}${e.gpu_index !== null ? `:${e.gpu_index}` : ""} · ${meaning(e)}`)),
      events.length > 12 ? h("span", { class: "muted" }, ` +${events.length - 12} more on the charts`) : null]
      : h("span", { class: "muted" }, "No XID, ECC or row-remap events on this job's GPUs."));

    // ---- the range picker: presets ending at the job's last minute, and a reset
    const rangeLabel = document.getElementById("range-label");
    const showRange = (lo, hi) => { rangeLabel.textContent = `${when(lo)} – ${when(hi)} (${dur(hi - lo)})`; };
    fill(picker, RANGES.filter(([, , sec]) => sec === null || sec < t1 - t0).map(([key, text, sec]) => h("button", { "data-range": key,
      onclick: () => (sec === null ? timeline.reset() : timeline.set(t1 - sec, t1)) }, text)),
    h("span", { class: "muted" }, " drag on any chart to zoom, double-click to reset"));
    timeline.onChange(showRange);
    showRange(t0, t1);
    state.timeline = timeline;

    // ---- heatmap: any numeric catalog field, loaded on demand
    const cat = await catReq.catch(() => null);
    const fields = ((cat && cat.data) || []).filter((f) => !["bitmask", "xid", "bool"].includes(f.unit));
    const fieldSel = h("select", { id: "heatmap-field" }, (fields.length ? fields : GPU_CHARTS.map((g) => ({ name: g.field }))).map((f) =>
      h("option", { value: f.name, selected: f.name === "sm_active" }, f.name)));
    const heatTitle = h("div", { class: "ct" }, h("b", {}, "Field "), fieldSel);
    heatEl.append(heatTitle);
    const hm = window.gpufleetHeatmap(heatEl, { gpus: ts.gpus.map((g, i) => ({ label: label(g), node: g.node, flagged: flagged.has(i) })),
      t: ts.t, step: ts.step, timeline, events, onPick: toggle });
    const unitOf = (name) => (fields.find((f) => f.name === name) || {}).unit || ((GPU_CHARTS.find((g) => g.field === name) || {}).ratio ? "ratio" : "");
    const fmtFor = (unit) => (unit === "ratio" ? pct : unit === "bytes/s" ? rate : unit === "bytes" ? gib : (v) => `${num(v, 0)}${unit && unit !== "count" ? ` ${unit === "C" ? "°C" : unit}` : ""}`);
    function showHeat(name, rows) {
      const unit = unitOf(name);
      let lo = Infinity, hi = -Infinity;
      for (const r of rows) for (const v of r) if (v !== null) { if (v < lo) lo = v; if (v > hi) hi = v; }
      if (unit === "ratio") { lo = 0; hi = 1; } else if (!(hi > lo)) { lo = Number.isFinite(lo) ? lo : 0; hi = lo + 1; }
      hm.show(rows, { lo, hi, fmt: fmtFor(unit) });
      state.heatmapField = name;
    }
    fieldSel.addEventListener("change", async () => {
      const name = fieldSel.value;
      if (ts.series[name]) { showHeat(name, ts.series[name]); return; }
      try {
        const r = await api(`${base}/timeseries?${qs({ cluster, fields: name, start: ts.start, end: ts.end, step: ts.step })}`);
        ts.series[name] = r.series[name];  // same start, end and GPUs: the same grid
        showHeat(name, r.series[name]);
      } catch (e) { state.errors.push(String(e)); }
    });
    showHeat("sm_active", ts.series.sm_active);

    // ---- per-GPU charts
    const reasons = (tl && tl.reason_bits && tl.reason_bits.throttle) || {};
    function clockBand(b) {
      const masks = ts.series.clock_event_reasons || [];
      const rows = [];
      for (const [bit, name] of Object.entries(reasons)) {
        const on = new Uint8Array(ts.t.length);
        let count = 0;
        for (let i = 0; i < ts.t.length; i++) {
          for (let g = 0; g < masks.length; g++) { const m = masks[g][i]; if (m !== null && (m & Number(bit))) { on[i] = 1; count++; break; } }
        }
        if (count) rows.push({ name, on, count, color: REASON_COLORS[name] || "#8b949e" });
      }
      fill(b.foot, rows.length ? [h("span", { class: "muted" }, "Throttle reasons (any GPU, band above the lines): "),
        rows.map((r) => h("span", { class: "reason", "data-reason": r.name }, h("i", { style: { background: r.color } }), `${r.name} ${dur(r.count * ts.step)}`))]
        : h("span", { class: "muted" }, masks.length ? "No throttle reason reported." : "No clock-event reasons reported."));
      return rows.length ? { rows, t: ts.t, step: ts.step } : null;
    }
    // every chart of the page's grids has the same width: measured once, at the first chart built
    let chartW = 0;
    const widthOf = (el) => (chartW ||= Math.max(300, (el.getBoundingClientRect().width || 560) - 12));
    let laterReq = null;
    const later = () => (laterReq ||= api(`${base}/timeseries?${qs({ cluster, fields: LATER.join(","), start: ts.start, end: ts.end, step: ts.step })}`)
      .then((r) => { for (const f of LATER) { ts.series[f] = r.series[f]; ts.aggregate[f] = r.aggregate[f]; } }));
    function build(b) {
      if (b.spec.later && !ts.aggregate[b.spec.field]) return later().then(() => build(b));
      const spec = b.spec, vals = ts.series[spec.field] || [];
      const fmt = spec.ratio ? pct : spec.bytes ? rate : (v) => num(v, 0);
      const lines = vals.map((v, i) => ({ label: label(ts.gpus[i]), color: stroke(i), values: v }));
      lines.push({ label: "job", color: "#e6edf3", width: 2, values: ts.aggregate[spec.field] || [] });
      const caps = [];
      if (spec.cap && limits[spec.cap]) caps.push({ value: limits[spec.cap], label: `capacity ${rate(limits[spec.cap])} per direction (${limits.model || "default model"})` });
      if (spec.clock && limits.max_sm_clock_mhz) caps.push({ value: limits.max_sm_clock_mhz, label: `max ${num(limits.max_sm_clock_mhz, 0)} MHz`, color: "#3fb950" });
      const u = C.chart(b.plotEl, { t: ts.t, lines, fmt, timeline, events, capacities: caps, band: spec.clock ? clockBand(b) : null, width: widthOf(b.plotEl),
        yRange: spec.ratio ? [0, 1] : "zero", axisSize: spec.bytes ? 72 : 60,
        onCursor: (i) => {
          if (i === null || i === undefined) { b.readout.textContent = ""; return; }
          let lo = Infinity, hi = -Infinity, at = -1;
          for (let g = 0; g < vals.length; g++) { const v = vals[g][i]; if (v !== null && v !== undefined) { if (v < lo) { lo = v; at = g; } if (v > hi) hi = v; } }
          const agg = (ts.aggregate[spec.field] || [])[i];
          b.readout.textContent = `${when(ts.t[i])}  job ${fmt(agg)}` + (hi >= lo ? `  GPUs ${fmt(lo)}…${fmt(hi)} (low ${label(ts.gpus[at])})` : "");
        } });
      for (let i = 0; i < G; i++) u.series[i + 1].width = litNow.has(i) ? 2.2 : 1;
      built.push({ u, field: spec.field });
      let pts = 0;
      for (const l of lines) for (const v of l.values) if (v !== null) pts++;
      state.charts[spec.field] = pts;
    }
    function buildLinks() {
      const lines = LINK_FIELDS.map(([f, lab, color]) => ({ label: lab, color, width: 1.5, values: links.aggregate[f] }));
      const caps = limits.ib_bytes_s ? [{ value: limits.ib_bytes_s, label: `IB capacity ${rate(limits.ib_bytes_s)} per direction`, color: "#d29922" }] : [];
      const u = C.chart(linkBox.box.children[1], { t: links.t, lines, fmt: rate, timeline, events, capacities: caps, axisSize: 72, width: widthOf(linkBox.box.children[1]) });
      built.push({ u, field: "interconnect" });
      state.charts.interconnect = lines.reduce((n, l) => n + l.values.filter((v) => v !== null).length, 0);
    }
    // above the fold now (what "interactive" waits for), the rest as it scrolls near
    const onScreen = (el) => el.getBoundingClientRect().top < innerHeight;
    const drawing = [];
    for (const b of boxes) { if (onScreen(b.box)) drawing.push(build(b)); else C.lazy(b.box, () => build(b)); }
    if (onScreen(linkBox.box)) buildLinks(); else C.lazy(linkBox.box, buildLinks);
    await Promise.all(drawing);
    relight();
    performance.mark("job:interactive");
    state.interactiveMs = performance.now() - tData;
    state.step = ts.step;
    later().catch((e) => state.errors.push(String(e)));  // the rest of the series, in the background

    C.lazy(nicEl, () => nicCharts().catch((e) => state.errors.push(String(e))));
    C.lazy(cmpEl, () => compare().catch((e) => state.errors.push(String(e))));
    if (window.gpufleetGoodput) await window.gpufleetGoodput(goodEl, base, cluster, j, L).catch((e) => state.errors.push(String(e)));
    c.done();
    // after done(): the panel loads on its own and never delays the page's own charts
    if (window.gpufleetCollectives) window.gpufleetCollectives(collEl, base, cluster).catch((e) => state.errors.push(String(e)));

    // ---- InfiniBand per NIC: each node's ports (GET /api/v1/nodes/{name}/nics), tx and rx
    // against the port's trained rate; the node API keeps at most 7 days before its newest sample
    async function nicCharts() {
      const hours = Math.min(168, Math.max(1, Math.ceil((t1 - t0) / 3600)));
      const got = await Promise.all(j.nodes.map((n) => api(`/api/v1/nodes/${enc(n)}/nics?${qs({ cluster, hours })}`).then((r) => [n, r], () => [n, null])));
      const ports = got.flatMap(([n, r]) => ((r && r.nics) || []).filter((p) => p.t && p.t.length).map((p) => ({ ...p, node: n })));
      if (!ports.length) { fill(nicEl, h("p", { class: "muted", id: "nic-none" }, "No InfiniBand/RoCE port samples from the job's nodes (the agent reports them with --nics).")); state.nicCharts = 0; return; }
      // one x axis for all ports: their sample times merged, each port's values placed on it
      const tx = [...new Set(ports.flatMap((p) => p.t))].sort((a, b) => a - b);
      const pos = new Map(tx.map((t, i) => [t, i]));
      const place = (p, key) => { const out = new Array(tx.length).fill(null); p.t.forEach((t, i) => { out[pos.get(t)] = p[key][i]; }); return out; };
      const top = Math.max(0, ...ports.flatMap((p) => p.rate_gbps.filter((v) => v !== null)));
      const lastRate = (p) => { for (let i = p.rate_gbps.length - 1; i >= 0; i--) if (p.rate_gbps[i] !== null) return p.rate_gbps[i]; return null; };
      for (const [key, title] of [["tx_bytes_s", "IB/RoCE tx per NIC"], ["rx_bytes_s", "IB/RoCE rx per NIC"]]) {
        const el = h("div");
        const keys = h("div", { class: "keys" }, ports.map((p, i) => h("span", {}, h("i", { style: { background: `hsl(${(i * 360) / ports.length}, 65%, 60%)` } }),
          `${p.node}:${p.nic}${p.gpus && p.gpus.length ? ` (GPU ${p.gpus.map((g) => g.index).join(",")})` : ""}`,
          // a port trained below the fastest one says so: the capacity line is the fastest's
          lastRate(p) !== null && lastRate(p) < top ? h("b", { class: "slow-port" }, ` at ${window.gpufleetFmt.linkRate(lastRate(p))}`) : null)));
        nicEl.append(h("div", { class: "chart", id: `nic-${key}` }, h("div", { class: "ct" }, h("b", {}, title)), el, keys));
        const u = C.chart(el, { t: tx, fmt: rate, timeline, events, axisSize: 72, width: widthOf(el),
          lines: ports.map((p, i) => ({ label: `${p.node}:${p.nic}`, color: `hsl(${(i * 360) / ports.length}, 65%, 60%)`, values: place(p, key) })),
          capacities: top ? [{ value: (top * 1e9) / 8, label: `link rate ${window.gpufleetFmt.linkRate(top)}` }] : [] });
        built.push({ u, field: key });
      }
      state.nicCharts = ports.length;
    }

    // ---- compare: the job mean of this run against another (same name's previous runs, or
    // any job id in the cluster), on time since each job's first minute
    async function compare() {
      const prev = await api(`${base}/previous-runs?${qs({ cluster })}`).catch(() => ({ data: [] }));
      const sel = h("select", { id: "compare-run" }, h("option", { value: "" }, prev.data.length ? "previous runs of this name…" : "no previous run of this name"),
        prev.data.map((r) => h("option", { value: r.job_id }, `${r.job_id} · ${when(r.start_ts)} · ${r.n_gpus} GPUs · goodput ${pct(r.goodput_score)}`)));
      const input = h("input", { id: "compare-id", placeholder: "or a job id", size: 14 });
      const out = h("div", { id: "compare-out" });
      const go = (id) => { if (id) run(id.trim()).catch((e) => fill(out, h("p", { class: "error" }, `Could not compare: ${e.message}`))); };
      sel.addEventListener("change", () => go(sel.value));
      fill(cmpEl, h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); go(input.value); } }, sel, input, h("button", { type: "submit" }, "Compare")), out);
      const FIELDS = [["sm_active", "SM active", pct], ["tensor_active", "Tensor active", pct], ["power_w", "Power (W)", (v) => num(v, 0)]];
      async function run(other) {
        const ob = `/api/v1/jobs/${enc(other)}`;
        const [od, os] = await Promise.all([api(`${ob}?${qs({ cluster })}`), api(`${ob}/timeseries?${qs({ cluster, gpu: "none", fields: FIELDS.map((f) => f[0]).join(",") })}`)]);
        // relative time axis: minutes since each job's first bucket, merged
        const rel = (t) => t.map((x) => x - t[0]);
        const a = rel(ts.t), b = rel(os.t);
        const xs = [...new Set([...a, ...b])].sort((p, q) => p - q);
        const on = (t, v) => { const m = new Map(t.map((x, i) => [x, v[i]])); return xs.map((x) => m.get(x) ?? null); };
        const os2 = od.summary;
        fill(out, table([
          { label: "Job", get: (r) => h("a", { href: c.jobHref(cluster, r.job_id) }, r.job_id) },
          { label: "Start", get: (r) => when(r.start_ts) }, { label: "GPUs", n: true, get: (r) => r.n_gpus },
          { label: "Goodput", n: true, get: (r) => pct(r.summary.goodput_score) },
          { label: "SM active", n: true, get: (r) => pct(r.summary.sm_active_mean) },
          { label: "Tensor active", n: true, get: (r) => pct(r.summary.tensor_active_mean) },
          { label: "Wasted GPU-h", n: true, get: (r) => gh(r.summary.wasted_gpu_hours) },
        ], [j, { ...od, summary: os2 }], { class: "compare" }));
        const grid = h("div", { class: "charts" });
        out.append(grid);
        for (const [f, title, fmt] of FIELDS) {
          const el = h("div");
          grid.append(h("div", { class: "chart", id: `compare-${f}` }, h("div", { class: "ct" }, h("b", {}, `${title}: job mean`)), el,
            h("div", { class: "keys" }, h("span", {}, h("i", { style: { background: "#58a6ff" } }), `this job ${j.job_id}`),
              h("span", {}, h("i", { style: { background: "#f778ba" } }), `job ${other}`))));
          new uPlot({ width: Math.max(300, (el.getBoundingClientRect().width || 560) - 12), height: 150, legend: { show: false },
            scales: { x: { time: false }, y: { range: f === "power_w" ? undefined : [0, 1] } },
            // round offsets: 5 min .. 1 day
            axes: [{ ...C.AXIS, space: 70, incrs: [300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400], values: (u, v) => v.map((x) => dur(x)) }, { ...C.AXIS, size: 56, values: (u, v) => v.map(fmt) }],
            series: [{}, { stroke: "#58a6ff", width: 1.5 }, { stroke: "#f778ba", width: 1.5 }] },
          [xs, on(a, ts.aggregate[f] || []), on(b, os.aggregate[f] || [])], el);
        }
        state.compared = other;
      }
    }
  };
})();
