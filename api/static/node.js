/* The node page (/nodes/{name}): its GPUs now, per-GPU charts over a chosen range (SM activity,
 * power, temperature, memory used) with a legend that highlights one GPU, its XID / ECC /
 * row-remap events as markers on every chart and decoded in a table (events.js, xid.js), the
 * jobs that held its GPUs, and its NICs (collectives.js). Charts come from charts.js (the job
 * page's synced uPlot helpers). app.js hands its helpers over; strings go in as text. */
(function () {
  "use strict";
  const CHARTS = [
    { field: "sm_active", title: "SM active", fmt: (v) => `${Math.round(v * 100)}%`, yRange: [0, 1] },
    { field: "power_w", title: "Power", unit: "W", fmt: (v) => `${Math.round(v)}` },
    { field: "temp_c", title: "Temperature", unit: "°C", fmt: (v) => `${Math.round(v)}` },
    { field: "fb_used_bytes", title: "Memory used", unit: "GiB", fmt: (v) => `${Math.round(v)}`, scale: 2 ** -30 },
  ];
  const RANGES = [["6 h", 6 * 3600], ["24 h", 86400], ["7 d", 7 * 86400]];

  // The drain advice: the most severe open flag whose suggestion says to drain, the GPUs it
  // names and the command with this node's name (GET /api/v1/nodes/{name} "drain").
  function drainBox(n) {
    const { h } = window.gpufleetDom;
    const d = n.drain;
    if (!d) return null;
    const gpus = (d.gpus || []).map((g) => `GPU ${g.index}`).join(", ");
    return h("div", { class: `drain sev-${d.severity}`, id: "drain-advice" },
      h("b", {}, `Drain advised: ${d.severity}`), ` · job ${d.job_id}${gpus ? ` · ${gpus}` : ""}`,
      h("div", {}, d.suggestion), h("code", {}, d.command));
  }

  function flagTable(n) {
    const { h } = window.gpufleetDom;
    const F = window.gpufleetFmt;
    const flags = n.flags || [];
    if (!flags.length) return h("p", { class: "muted", id: "node-flags" }, "No open flags on this node or its GPUs.");
    const tbl = document.createElement("div");
    tbl.id = "node-flags";
    const rows = flags.map((f) => h("tr", { "data-kind": f.kind },
      h("td", {}, h("span", { class: `chip ${f.severity}`, "data-kind": f.kind, title: f.kind }, (window.gpufleetFlagTitle || ((k) => k))(f.kind))),
      h("td", {}, h("span", { class: `sev ${f.severity}` }, f.severity)),
      h("td", {}, (f.gpus || []).length ? f.gpus.map((g) => `GPU ${g.index}`).join(", ") : "node"),
      h("td", {}, h("a", { href: `/jobs/${encodeURIComponent(f.job_id)}?cluster=${encodeURIComponent(f.cluster)}` }, f.job_id)),
      h("td", {}, F.when(f.start_ts)), h("td", { class: "n" }, F.gh(f.wasted_gpu_hours)),
      h("td", { class: "wrap" }, f.suggestion)));
    tbl.className = "tw";
    tbl.append(h("table", { class: "nodeflags" }, h("thead", {}, h("tr", {}, ["Flag", "Severity", "Where", "Job", "Since", "Wasted GPU-h", "Suggestion"]
      .map((x) => h("th", { class: x === "Wasted GPU-h" ? "n" : "" }, x)))), h("tbody", {}, rows)));
    return tbl;
  }

  window.gpufleetNodePage = async function (t) {
    const { root, cfg, h, fill, api, table, when, pct, num, dash, enc, jobHref, state, chip } = t;
    const { name, cluster } = cfg.args;
    const base = `/api/v1/nodes/${enc(name)}`;
    const C = window.gpufleetCharts, E = window.gpufleetEvents;
    let range = 86400;
    const seriesReq = (sec) => api(`${base}/timeseries?${new URLSearchParams({ cluster, start: `-${sec}s` })}`);
    let tsReq = seriesReq(range);
    tsReq.catch(() => null);  // a 404 is reported once, by the detail call
    const n = await api(`${base}?${new URLSearchParams({ cluster })}`);
    if (t.kindsReady) await t.kindsReady;  // flag titles from the registry
    if (window.gpufleetXid) await window.gpufleetXid.ready;  // XID meanings (xid.js)
    const thr = (g) => g.throttle;
    const legend = h("div", { class: "gpu-legend", id: "node-legend" });
    const picker = h("div", { class: "range-picker", id: "node-range" });
    const charts = h("div", { class: "charts", id: "node-charts" });
    const events = n.events.map((e) => ({ ...e, short: E.short(e) }));
    fill(root,
      h("h1", {}, `Node ${n.name}`),
      h("div", { class: "meta" }, h("span", {}, "cluster ", h("b", {}, n.cluster)), h("span", {}, "agent ", h("b", {}, n.agent_version ?? dash)),
        h("span", {}, "last seen ", h("b", {}, when(n.last_seen))), h("span", {}, `${n.gpus.length} GPUs`),
        Object.entries(n.labels || {}).map(([k, v]) => h("span", { class: "chip" }, `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`))),
      drainBox(n),
      h("h2", {}, "Open flags on this node"), flagTable(n),
      h("h2", {}, "GPUs"),
      h("div", { class: "scrollx" }, table([
        { label: "GPU", n: true, get: (g) => g.index },
        { label: "Model", get: (g) => g.model ?? dash },
        { label: "UUID", get: (g) => h("a", { class: "trunc", title: g.uuid, href: `/gpus/${enc(g.uuid)}` }, g.uuid) },
        { label: "Job", get: (g) => (g.job ? h("a", { href: jobHref(g.job.cluster, g.job.job_id) }, g.job.job_id) : dash) },
        { label: "User", get: (g) => h("span", { class: "trunc", title: g.job?.user ?? "" }, g.job?.user ?? dash) },
        // only the GPUs a flag names are marked: a node's fault on GPU 3 leaves GPUs 0-2 and 4-7 clean
        { label: "Flags", get: (g) => (g.flags || []).map((f) => chip(f)) },
        { label: "SM now", n: true, get: (g) => pct(g.current?.sm_active) },
        { label: "Tensor now", n: true, get: (g) => pct(g.current?.tensor_active) },
        { label: "Power", n: true, get: (g) => (g.current ? `${num(g.current.power_w, 0)} W` : dash) },
        { label: "Temp", n: true, get: (g) => (g.current ? `${num(g.current.temp_c, 0)} °C` : dash) },
        { label: "SM clock", n: true, get: (g) => (g.current ? `${num(g.current.sm_clock_mhz, 0)} MHz` : dash) },
        { label: "Clock reasons now", get: (g) => (g.current?.clock_event_reasons || []).map((r) => h("span", { class: "chip" }, r.replace(/_/g, " "))) },
        { label: "Throttled 24 h", n: true, title: "minutes slowed by power/thermal/HW reasons", get: (g) => (thr(g) ? `${pct(thr(g).throttled_fraction)} (${thr(g).throttled_minutes} min)` : dash) },
        { label: "Max temp 24 h", n: true, get: (g) => (thr(g) ? `${num(thr(g).temp_c_max, 0)} °C` : dash) },
      ], n.gpus, { class: "gpus" })),
      h("h2", {}, "Per GPU over time ", picker), legend, charts,
      h("h2", {}, "XID / ECC / health events (7 days)"), E.table(events, { id: "node-events" }),
      h("h2", {}, "Jobs on this node (7 days)"),
      (n.jobs || []).length ? table([
        { label: "Job", get: (j) => h("a", { href: jobHref(j.cluster, j.job_id) }, j.job_id) },
        { label: "Name", get: (j) => h("span", { class: "trunc", title: j.name ?? "" }, j.name ?? "") },
        { label: "User", get: (j) => j.user ?? dash },
        { label: "State", get: (j) => h("span", { class: `state-${j.state}` }, j.state) },
        { label: "GPUs here", n: true, get: (j) => j.gpus },
        { label: "From", get: (j) => when(j.start_ts) },
        { label: "Until", get: (j) => (j.end_ts ? when(j.end_ts) : "running") },
      ], n.jobs, { class: "nodejobs" }) : h("p", { class: "muted" }, "No job held this node's GPUs in the last 7 days."));

    // ---- charts: one line per GPU; the legend highlights one, the range picker refetches
    const G = n.gpus.length;
    const hue = (i) => Math.round((i * 360) / Math.max(1, G)) % 360;
    let lit = null;  // position of the highlighted GPU
    const stroke = (i) => () => (lit === null ? `hsl(${hue(i)}, 65%, 60%)` : lit === i ? `hsl(${hue(i)}, 85%, 65%)` : `hsla(${hue(i)}, 20%, 55%, 0.2)`);
    let plots = [];
    state.plots = plots;
    function drawLegend(ts) {
      fill(legend, h("span", { class: "muted" }, "GPU: "), ts.gpus.map((g, i) => h("button", {
        class: `lg${lit === i ? " on" : ""}`, "data-gpu": g.uuid, title: g.uuid,
        onclick: () => { lit = lit === i ? null : i; drawLegend(ts); for (const u of plots) u.redraw(false); },
      }, h("i", { style: { background: `hsl(${hue(i)}, 65%, 60%)` } }), `GPU ${g.index}`)));
    }
    function drawCharts(ts) {
      for (const u of plots) u.destroy();
      plots = []; state.plots = plots;
      clearEl(charts);
      const t0 = ts.t.length ? ts.t[0] : ts.start, t1 = (ts.t.length ? ts.t[ts.t.length - 1] : ts.start) + ts.step;
      const timeline = C.timeline(t0, t1);
      state.charts = {};
      state.step = ts.step;
      for (const spec of CHARTS) {
        const plotEl = h("div");
        const readout = h("span", { class: "rd" });
        charts.append(h("div", { class: "chart", id: `node-chart-${spec.field}` },
          h("div", { class: "ct" }, h("b", {}, `${spec.title}${spec.unit ? ` (${spec.unit})` : ""}`), readout), plotEl));
        const rows = (ts.series[spec.field] || []).map((vals) => (spec.scale ? vals.map((v) => (v === null ? null : v * spec.scale)) : vals));
        let points = 0;
        for (const r of rows) for (const v of r) if (v !== null) points++;
        state.charts[spec.field] = points;
        const u = C.chart(plotEl, { t: ts.t, fmt: spec.fmt, yRange: spec.yRange, timeline, events, height: 160,
          lines: rows.map((vals, i) => ({ label: `GPU ${ts.gpus[i].index}`, values: vals, color: stroke(i), width: 1.5 })),
          onCursor: (idx) => {
            if (idx === null || idx === undefined) { readout.textContent = ""; return; }
            const vals = rows.map((r) => r[idx]).filter((v) => v !== null && v !== undefined);
            const one = lit !== null ? rows[lit][idx] : null;
            const u = spec.unit ? ` ${spec.unit}` : "";
            readout.textContent = `${when(ts.t[idx])}  ` + (lit !== null ? `GPU ${ts.gpus[lit].index} ${one === null || one === undefined ? dash : spec.fmt(one) + u}`
              : vals.length ? `GPUs ${spec.fmt(Math.min(...vals))}…${spec.fmt(Math.max(...vals))}${u}` : dash);
          } });
        plots.push(u);
      }
      if (!ts.t.length || !Object.values(state.charts).some((p) => p > 0)) {
        charts.prepend(h("p", { class: "muted", id: "node-charts-empty" }, "No samples from this node in the range."));
      }
    }
    function clearEl(el) { while (el.firstChild) el.removeChild(el.firstChild); }
    fill(picker, RANGES.map(([label, sec]) => h("button", { class: sec === range ? "on" : "", "data-range": sec,
      onclick: async () => {
        range = sec;
        for (const b of picker.children) b.className = Number(b.dataset.range) === sec ? "on" : "";
        tsReq = seriesReq(sec);
        const ts = await tsReq;
        drawCharts(ts);
      } }, label)));
    const ts = await tsReq;
    drawLegend(ts);
    drawCharts(ts);

    if (window.gpufleetNodeNics) {  // the node's IB/RoCE ports (collectives.js, docs/nccl.md)
      const nicEl = h("div", { id: "node-nics" });
      root.append(h("h2", {}, "NICs (InfiniBand / RoCE)"), nicEl);
      await window.gpufleetNodeNics(nicEl, name, cluster).catch((e) => state.errors.push(String(e)));
    }
  };
})();
