/* gpufleet job page: the goodput panel from the job's own progress (GET /api/v1/jobs/{id}
 * goodput and /progress, docs/progress.md). Plain script, no build step, loaded before app.js,
 * which calls window.gpufleetGoodput(el, apiBase, cluster, job) on the job page and
 * window.gpufleetFleetEttr(summary) on the fleet page. API strings go into the DOM as text. */
"use strict";
(() => {
  const dash = "–";
  const { h } = window.gpufleetDom; // api/static/dom.js
  const pct = (v) => window.gpufleetFmt.pct(v, 1);  // one rounding rule (fmt.js)
  const secs = (v) => {
    if (v === null || v === undefined) return dash;
    if (v < 120) return `${v.toFixed(1)} s`;
    if (v < 7200) return `${(v / 60).toFixed(1)} min`;
    return `${(v / 3600).toFixed(2)} h`;
  };
  const num = (v, d = 0) => window.gpufleetFmt.num(v, d);
  const CAUSE_LABEL = {
    init: "init", compile: "compile", data_wait: "data wait", checkpoint_save: "checkpoint save",
    checkpoint_load: "checkpoint load", eval: "eval", restart_lost: "lost to restarts", idle: "idle (no process)",
    hung: "hung (no steps)", unexplained: "unexplained",
  };
  // the same markup as app.js's KPIs: value, label, the explanation as a tooltip
  const kpi = (label, value, sub) => h("div", { class: "kpi", title: sub || null }, h("div", { class: "v" }, value),
    h("div", { class: "l" }, label));

  function badputBars(g) {
    const a = g.allocated_s || 0;
    const rows = [["productive", g.productive_s], ...Object.entries(g.badput_s || {}).filter(([, v]) => v > 0.0005 * a)
      .sort((x, y) => y[1] - x[1])];
    return h("table", { id: "badput", class: "badput" }, h("tbody", {}, rows.map(([k, v]) => h("tr", { "data-cause": k },
      h("td", {}, k === "productive" ? "productive" : (CAUSE_LABEL[k] || k)),
      h("td", { class: "n" }, secs(v)), h("td", { class: "n" }, pct(a ? v / a : null)),
      h("td", { style: { width: "50%" } }, h("div", { style: { background: k === "productive" ? "#3fb950" : "#d29922",
        height: "10px", width: `${a ? Math.min(100, (100 * v) / a) : 0}%` } }))))));
  }

  function rankChart(el, ranks) {
    const box = h("div", { class: "chart", id: "rank-steptime" }, h("div", { class: "title" }, "Step time p50 per rank (s), slow ranks in red"));
    el.append(box);
    box.append(h("div", { class: "keys" }, ranks.map((r) => h("span", { class: r.slow ? "slow" : "" },
      h("i", { style: { background: r.slow ? "#f85149" : "#58a6ff" } }), `rank ${r.rank}${r.host ? ` · ${r.host}` : ""}${r.gpu ? ` GPU ${r.gpu}` : ""}`))));
    if (typeof uPlot === "undefined" || !ranks.length) return;
    const xs = [...new Set(ranks.flatMap((r) => r.t))].sort((a, b) => a - b);
    const data = [xs, ...ranks.map((r) => { const m = new Map(r.t.map((t, i) => [t, r.step_time_p50_s[i]])); return xs.map((t) => m.get(t) ?? null); })];
    const series = [{}, ...ranks.map((r) => ({ label: `rank ${r.rank}`, stroke: r.slow ? "#f85149" : "#58a6ff", width: r.slow ? 2.5 : 1,
      points: { show: xs.length < 30 } }))];
    // eslint-disable-next-line no-new
    new uPlot({ width: Math.max(320, box.clientWidth || 640), height: 200, series, legend: { show: false },
      axes: [{ stroke: "#8b949e", values: window.gpufleetFmt.TIME_AXIS }, { stroke: "#8b949e", size: 56 }] }, data, box);
  }

  // ``ledger``: the job's GPU-time ledger summary (job.js); when there is one, the ETTR and where
  // the time went are the ledger's (one model), and this panel adds what only progress knows.
  window.gpufleetGoodput = async (el, base, cluster, job, ledger) => {
    const g = job.goodput;
    if (!g || g.source !== "progress") {
      el.append(h("p", { class: "muted", id: "goodput-view", "data-source": "hardware" },
        ledger ? "This job reports no progress of its own (gpufleet.progress): the ledger above judges its GPU time from telemetry alone."
          : "Hardware view: this job reports no progress of its own (gpufleet.progress), so goodput above is the hardware estimate."));
      return;
    }
    el.append(h("p", { class: "muted", id: "goodput-view", "data-source": "progress" },
      `From the job's own progress: ${g.ranks} rank${g.ranks === 1 ? "" : "s"}, ${g.steps} steps, allocation from ${g.allocation_source}.`));
    el.append(h("div", { class: "kpis" },
      ledger ? kpi("ETTR", pct(ledger.ettr), "productive / allocated GPU time (the job's ledger)")
        : kpi("ETTR", pct(g.ettr), "productive step time / allocated time"),
      ledger ? null : kpi("Productive", secs(g.productive_s), `of ${secs(g.allocated_s)} allocated`),
      kpi("Tokens/s", num(g.tokens_per_s, 0), g.tokens_per_gpu_s === null ? "" : `${num(g.tokens_per_gpu_s, 0)} per GPU`),
      kpi("MFU", pct(g.mfu), g.achieved_tflops === null ? "FLOPs per step not reported" : `${num(g.achieved_tflops, 2)} TFLOP/s achieved`),
      kpi("Step time", g.step_time_p50_s === null ? dash : `${num(g.step_time_p50_s, 3)} s`, `p95 ${num(g.step_time_p95_s, 3)} s`),
      kpi("Restarts", `${g.restarts}`, g.lost_steps ? `${window.gpufleetFmt.plural(g.lost_steps, "step", "steps")} redone` : "")));
    if (!ledger) el.append(h("h3", {}, "Where the allocated time went"), badputBars(g));  // else the ledger's, above
    const finds = g.findings || [];
    // titles, labels and units from the registry (evidence.js); a kind it lacks shows its name
    const E = window.gpufleetEvidence;
    const reg = finds.length ? await E.registry().catch(() => ({ kinds: [] })) : { kinds: [] };
    const title = (kind) => ((reg.kinds || []).find((k) => k.name === kind) || {}).title || kind;
    if (finds.length) el.append(h("ul", { id: "progress-findings" }, finds.map((f) => h("li", { class: `flag ${f.severity}`, "data-kind": f.kind },
      h("b", {}, title(f.kind)), f.scope !== "progress" ? ` (${f.scope.replace("progress:", "")})` : "", ": ",
      E.line(f.kind, f.evidence, 6)))));
    let p;
    try {
      p = await (await fetch(`${base}/progress?${new URLSearchParams({ cluster })}`, { credentials: "same-origin" })).json();
    } catch (e) { el.append(h("p", { class: "muted" }, `per-rank series unavailable: ${e}`)); return; }
    rankChart(el, p.ranks || []);
  };

  window.gpufleetFleetEttr = (s) => {
    const g = s.goodput;
    if (!g || g.ettr === null || g.ettr === undefined) return [dash, "no job reports progress (hardware view only)"];
    return [pct(g.ettr), `${g.jobs} job${g.jobs === 1 ? "" : "s"} reporting progress`];
  };
})();
