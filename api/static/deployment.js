/* The deployment page (/deployments/{name}, api/web_serving.py; docs/serving.md): one
 * GET /api/v1/deployments/{name}. app.js routes the page here with its helpers (the pages' one
 * shell: navigation, search, session); every API string goes into the DOM as text (dom.js's h),
 * never through innerHTML. Resolves when drawn (app.js then sets window.__gpufleet.ready). */
(function () {
  "use strict";
  const pct = (v) => (v === null || v === undefined ? "—" : `${(100 * v).toFixed(1)}%`);
  const ms = (v) => (v === null || v === undefined ? "—" : v >= 1 ? `${v.toFixed(v >= 10 ? 0 : 1)} s`
    : `${(1000 * v).toFixed(v < 0.01 && v > 0 ? 1 : 0)} ms`);
  const n = (v, d = 1) => (v === null || v === undefined ? "—" : Number(v).toFixed(d));
  const range = (r) => (r ? `${pct(r[0])} – ${pct(r[1])}` : "");
  // The SLO between two bucket bounds: the value is interpolated, the range is what the buckets prove.
  const proven = (r, exact) => (exact === false ? `estimated; proven ${range(r)}` : exact === true ? "exact (on a bucket bound)" : range(r));

  async function page({ root, cfg, api }) {
    const { h, append } = window.gpufleetDom;
    const kpi = (label, value, sub) => h("div", { class: "kpi" }, h("div", { class: "l" }, label),
      h("div", { class: "v" }, value), sub ? h("div", { class: "l" }, sub) : null);
    const chartBox = (title) => {
      const el = h("div", { class: "chart" });
      return [h("section", {}, h("h3", {}, title), el), el];
    };
    const params = new URLSearchParams(location.search);
    const q = new URLSearchParams({ start: params.get("start") || "-6h" });
    if (params.get("end")) q.set("end", params.get("end"));
    if (cfg.args.cluster) q.set("cluster", cfg.args.cluster);
    let d;
    try {
      d = await api(`/api/v1/deployments/${encodeURIComponent(cfg.args.name)}?${q}`);
    } catch (e) {
      if (!e.status) throw e;
      while (root.firstChild) root.removeChild(root.firstChild);
      append(root, [h("h1", {}, `Deployment ${cfg.args.name}`), h("p", { class: "muted" }, String(e.message))]);
      return;
    }
    while (root.firstChild) root.removeChild(root.firstChild);
    const C = window.gpufleetCharts;
    const s = d.summary, slo = s.slo;
    append(root, [
      h("h1", {}, `Deployment ${d.deployment}`),
      h("p", { class: "muted" }, `cluster ${d.cluster} · SLO ${slo.source}: TTFT ≤ ${slo.ttft_ms} ms and TPOT ≤ `
        + `${slo.tpot_ms} ms at p${Math.round(slo.percentile * 100)} · ${s.replicas} replicas on ${n(s.gpus, 0)} GPUs`),
      h("div", { class: "kpis" },
        kpi("goodput (both SLOs)", pct(s.goodput_share), `proven ${range(s.goodput_range)}`),
        kpi("TTFT attainment", pct(s.ttft_attainment), proven(s.ttft_attainment_range, s.ttft_attainment_exact)),
        kpi(`TPOT attainment${s.tpot_from === "itl" ? " (per token)" : ""}`, pct(s.tpot_attainment),
          proven(s.tpot_attainment_range, s.tpot_attainment_exact)),
        kpi("requests/s", n(s.requests_per_s, 2), `goodput ${n(s.goodput_rps_per_gpu, 2)} req/s per GPU`),
        kpi("output tokens / GPU-s", n(s.generation_tokens_per_gpu_s, 0),
          `prompt ${n(s.prompt_tokens_per_gpu_s, 0)}`),
        kpi("cost / M good tokens", s.cost_per_million_good_tokens === null ? "—" : n(s.cost_per_million_good_tokens, 2),
          s.slo_met === null ? "SLO: unknown" : s.slo_met ? "SLO met" : "SLO missed")),
    ]);
    for (const note of s.notes || []) append(root, [h("p", { class: "muted" }, note)]);
    const t = d.series.map((p) => p.minute);
    const col = (k) => d.series.map((p) => p[k]);
    const tl = C.timeline(t[0], t[t.length - 1] + 60);
    const grid = h("div", { class: "cols" });
    append(root, [grid]);
    const [c1, e1] = chartBox("SLO attainment per minute");
    const [c2, e2] = chartBox("p99 TTFT against its SLO");
    const [c3, e3] = chartBox("p99 TPOT against its SLO");
    const [c4, e4] = chartBox("output tokens per GPU-second and KV-cache use");
    append(grid, [c1, c2, c3, c4]);
    C.chart(e1, { t, timeline: tl, yRange: [0, 1], fmt: (v) => `${Math.round(v * 100)}%`,
      capacities: [{ value: slo.percentile, label: `p${Math.round(slo.percentile * 100)} target`, color: "#d29922" }],
      lines: [{ label: "TTFT", color: "#58a6ff", values: col("ttft_attainment") },
        { label: "TPOT", color: "#a371f7", values: col("tpot_attainment") },
        { label: "goodput", color: "#3fb950", values: col("goodput_share"), width: 2 }] });
    C.chart(e2, { t, timeline: tl, fmt: (v) => ms(v), axisSize: 70,
      capacities: [{ value: slo.ttft_ms / 1000, label: `SLO ${slo.ttft_ms} ms` }],
      lines: [{ label: "p99 TTFT", color: "#58a6ff", values: col("ttft_p99") }] });
    C.chart(e3, { t, timeline: tl, fmt: (v) => ms(v), axisSize: 70,
      capacities: [{ value: slo.tpot_ms / 1000, label: `SLO ${slo.tpot_ms} ms` }],
      lines: [{ label: "p99 TPOT", color: "#a371f7", values: col("tpot_p99") }] });
    const maxTok = Math.max(1, ...col("gen_tokens_per_gpu_s").filter((v) => v !== null));
    C.chart(e4, { t, timeline: tl, yRange: [0, 1], fmt: (v) => `${Math.round(v * 100)}%`,
      lines: [{ label: "KV use", color: "#d29922", values: col("kv_usage") },
        { label: "tokens/GPU-s (of peak)", color: "#3fb950",
          values: col("gen_tokens_per_gpu_s").map((v) => (v === null ? null : v / maxTok)) }] });
    append(root, [h("p", { class: "muted small" }, `legend: attainment — TTFT blue, TPOT purple, goodput green; `
      + `tokens per GPU-second green as a share of its peak (${n(maxTok, 0)}), KV use amber`)]);

    const rows = d.replicas.map((x) => h("tr", {},
      h("td", {}, x.replica), h("td", {}, x.node || "—"), h("td", {}, String((x.gpu_uuids || []).length || x.gpus)),
      h("td", {}, n(x.requests_per_s, 2)), h("td", {}, ms(x.latency.ttft && x.latency.ttft.p99)),
      h("td", {}, ms(x.latency[x.tpot_from || "tpot"] && x.latency[x.tpot_from || "tpot"].p99)),
      h("td", {}, pct(x.goodput_share)), h("td", {}, pct(x.kv_usage_mean)), h("td", {}, n(x.batch_size_mean, 1))));
    append(root, [h("section", {}, h("h3", {}, "Replicas"),
      h("table", {}, h("thead", {}, h("tr", {}, ...["replica", "node", "GPUs", "req/s", "p99 TTFT",
        "p99 TPOT", "goodput", "KV use", "batch"].map((x) => h("th", {}, x)))), h("tbody", {}, ...rows)))]);
    const findings = d.findings.map((f) => h("li", {}, h("b", {}, `${f.kind} (${f.target})`), ` — ${f.suggestion}`));
    append(root, [h("section", {}, h("h3", {}, "Findings"),
      findings.length ? h("ul", {}, ...findings) : h("p", { class: "muted" }, "none"))]);
    if (C.flush) await C.flush();
  }
  window.gpufleetDeploymentPage = page;
})();
