/* gpufleet job page: the collectives and fabric panels (GET /api/v1/jobs/{id}/collectives,
 * docs/nccl.md). Plain script, no build step, loaded before app.js, which calls
 * window.gpufleetCollectives(el, apiBase, cluster) on the job page. Strings from the API go
 * into the DOM as text nodes only. */
"use strict";
(() => {
  const dash = "–";
  const { h } = window.gpufleetDom; // api/static/dom.js
  const num = (v, d = 0) => (v === null || v === undefined ? dash : Number(v).toFixed(d));
  const size = (b) => {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; let x = b;
    while (x >= 1024 && i < u.length - 1) { x /= 1024; i++; }
    return `${x.toFixed(0)} ${u[i]}`;
  };
  const COLORS = ["#58a6ff", "#3fb950", "#d29922", "#f778ba", "#a371f7", "#79c0ff", "#56d364", "#e3b341"];
  const label = (s) => `${s.collective} ${size(s.size_bucket)} · ${s.comm}${s.n_nodes ? ` (${s.n_nodes} nodes)` : ""}`;

  function busbwChart(el, series) {
    const shown = series.slice(0, 6);
    const box = h("div", { class: "chart", id: "coll-busbw" }, h("div", { class: "title" }, "Bus bandwidth p50 (GB/s) per communicator"));
    el.append(box);
    const keys = h("div", { class: "keys" }, shown.map((s, i) => h("span", {}, h("i", { style: { background: COLORS[i % COLORS.length] } }), label(s))));
    box.append(keys);
    if (typeof uPlot === "undefined" || !shown.length) return;
    // one x axis: the union of every shown series' minutes
    const xs = [...new Set(shown.flatMap((s) => s.t))].sort((a, b) => a - b);
    const data = [xs, ...shown.map((s) => { const m = new Map(s.t.map((t, i) => [t, s.busbw_gbs_p50[i]])); return xs.map((t) => m.get(t) ?? null); })];
    const opts = { width: Math.max(320, (el.clientWidth || 900) - 20), height: 220, legend: { show: false },
      series: [{}, ...shown.map((s, i) => ({ label: label(s), stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false }))],
      axes: [{ stroke: "#8b949e", values: window.gpufleetFmt.TIME_AXIS }, { stroke: "#8b949e", size: 56 }] };
    new uPlot(opts, data, box);
  }

  function heatmap(el, d) {
    const ranks = d.ranks || [];
    const box = h("div", { class: "chart", id: "coll-heatmap" }, h("div", { class: "title" },
      d.ranks_of ? `Exec time per rank and minute, against the minute's median · ${d.ranks_of.collective} ${size(d.ranks_of.size_bucket)} · ${d.ranks_of.comm}` : "Exec time per rank"));
    el.append(box);
    if (!ranks.length || !d.ranks_of) { box.append(h("p", { class: "muted" }, "No per-rank timings.")); return; }
    const cols = d.ranks_of.t.length, rows = ranks.length;
    const cw = Math.max(2, Math.floor(((el.clientWidth || 900) - 160) / cols)), rh = Math.max(3, Math.min(12, Math.floor(360 / rows)));
    const canvas = h("canvas", { width: cw * cols, height: rh * rows, id: "coll-heatmap-canvas" });
    const ctx = canvas.getContext("2d");
    for (let c = 0; c < cols; c++) {
      const vals = ranks.map((r) => r.exec_us[c]).filter((v) => v !== null && v !== undefined).sort((a, b) => a - b);
      const med = vals.length ? vals[Math.floor(vals.length / 2)] : null;
      ranks.forEach((r, i) => {
        const v = r.exec_us[c];
        // blue = waits least (shorter than peers), red = waits most; grey = no data
        let color = "#30363d";
        if (v !== null && v !== undefined && med) {
          // a rank at half its peers' time is full blue; normal jitter stays near grey
          const x = Math.max(-1, Math.min(1, Math.log2(v / med) / 0.5)), m = Math.abs(x);
          color = `hsl(${x < 0 ? 210 : 0} ${Math.round(m * 85)}% ${Math.round(22 + m * 28)}%)`;
        }
        ctx.fillStyle = color;
        ctx.fillRect(c * cw, i * rh, cw, rh);
      });
    }
    const names = h("div", { class: "heat-ranks" }, ranks.map((r) => h("div", { style: { height: `${rh}px`, lineHeight: `${rh}px`, fontSize: `${Math.min(11, rh)}px` }, class: r.degraded ? "degraded" : "" },
      `${r.node}/${r.rank}${r.degraded ? ` ◀ ${r.nic ?? "degraded"}` : ""}`)));
    box.append(h("div", { style: { display: "flex", gap: "6px" } }, names, canvas));
    const marked = ranks.filter((r) => r.degraded);
    box.append(h("p", { class: "muted", id: "coll-degraded" }, marked.length
      ? `Flagged: ${marked.map((r) => `rank ${r.rank} on ${r.node} (GPU ${r.gpu ?? dash}, NIC ${r.nic ?? dash})`).join("; ")}: it waits least, its peers wait for its link.`
      : "No rank flagged."));
  }

  function fabricTable(el, nics) {
    el.append(h("h3", {}, "Fabric: the job's NICs"));
    if (!nics.length) { el.append(h("p", { class: "muted" }, "No NIC samples from the job's nodes.")); return; }
    const last = (a) => { for (let i = a.length - 1; i >= 0; i--) if (a[i] !== null && a[i] !== undefined) return a[i]; return null; };
    const max = (a) => a.reduce((m, v) => (v === null || v === undefined ? m : m === null ? v : Math.max(m, v)), null);
    const sum = (a) => a.reduce((m, v) => (v === null || v === undefined ? m : (m ?? 0) + v), null);
    const rows = nics.map((n) => {
      const rate = last(n.rate_gbps), top = max(n.rate_gbps);
      const bad = (rate !== null && top !== null && rate < 0.9 * top) || (last(n.state) && last(n.state) !== "ACTIVE");
      return h("tr", { class: bad ? "bad" : "" },
        h("td", {}, n.node), h("td", {}, n.nic), h("td", {}, n.gpus.length ? n.gpus.join(", ") : dash),
        h("td", { class: "n" }, rate === null ? dash : `${window.gpufleetFmt.linkRate(rate)}${top !== null && rate < top ? ` (was ${window.gpufleetFmt.linkRate(top)})` : ""}`),
        h("td", {}, last(n.state) ?? dash), h("td", { class: "n" }, num(max(n.xmit_wait_per_s))),
        h("td", { class: "n" }, num(sum(n.errors))));
    });
    el.append(h("table", { id: "coll-nics" }, h("thead", {}, h("tr", {}, ["Node", "NIC", "GPUs (rail)", "Link rate", "State", "Max xmit wait /s", "Errors"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)));
  }

  window.gpufleetNodeNics = async function (el, node, cluster) {
    const q = cluster ? `?cluster=${encodeURIComponent(cluster)}` : "";
    const r = await fetch(`/api/v1/nodes/${encodeURIComponent(node)}/nics${q}`, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!r.ok) { el.append(h("p", { class: "muted" }, `NICs unavailable (${r.status}).`)); return; }
    const d = await r.json();
    if (!d.nics.length) { el.append(h("p", { class: "muted" }, "No InfiniBand/RoCE ports reported by this node.")); return; }
    const last = (a) => { for (let i = (a || []).length - 1; i >= 0; i--) if (a[i] !== null && a[i] !== undefined) return a[i]; return null; };
    const max = (a) => (a || []).reduce((m, v) => (v === null || v === undefined ? m : m === null ? v : Math.max(m, v)), null);
    const errs = (c) => Object.entries(c || {}).filter(([k, v]) => v > 0 && k !== "port_xmit_wait").map(([k, v]) => `${k} ${v}`).join(", ");
    el.append(h("table", { id: "node-nics-table" }, h("thead", {}, h("tr", {}, ["NIC", "Layer", "GPUs (rail)", "Link rate", "State", "TX", "Max xmit wait /s", "Errors"].map((t) => h("th", {}, t)))),
      h("tbody", {}, d.nics.map((n) => {
        const rate = last(n.rate_gbps), top = max(n.rate_gbps);
        const bad = (rate !== null && top !== null && rate < 0.9 * top) || (last(n.state) && last(n.state) !== "ACTIVE") || errs(n.counters_total);
        return h("tr", { class: bad ? "bad" : "" }, h("td", {}, n.nic), h("td", {}, n.link_layer ?? dash),
          h("td", {}, (n.gpus || []).map((g) => `GPU ${g.index}`).join(", ") || dash),
          h("td", { class: "n" }, rate === null ? dash : `${window.gpufleetFmt.linkRate(rate)}${top !== null && rate < top ? ` (was ${window.gpufleetFmt.linkRate(top)})` : ""}`),
          h("td", {}, last(n.state) ?? dash), h("td", { class: "n" }, last(n.tx_bytes_s) === null ? dash : `${num(last(n.tx_bytes_s) / 1e9, 1)} GB/s`),
          h("td", { class: "n" }, num(max(n.xmit_wait_per_s))), h("td", {}, errs(n.counters_total) || "0"));
      }))));
  };

  window.gpufleetCollectives = async function (el, apiBase, cluster) {
    const q = cluster ? `?cluster=${encodeURIComponent(cluster)}` : "";
    const r = await fetch(`${apiBase}/collectives${q}`, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!r.ok) { el.append(h("p", { class: "muted" }, `Collectives unavailable (${r.status}).`)); return; }
    const d = await r.json();
    if (!d.series.length && !d.nics.length) {
      el.append(h("p", { class: "muted" }, "No NCCL Inspector data for this job (run it with the Inspector plugin and the agent's --nccl-inspector-dir)."));
      return;
    }
    if (d.comm_share_p50 !== null && d.comm_share_p50 !== undefined) {
      el.append(h("p", { id: "coll-share" }, "Time inside collectives (median rank): ", h("b", {}, `${(d.comm_share_p50 * 100).toFixed(1)}%`),
        h("span", { class: "muted" }, " of wall time; overlapped communication counts too, so it bounds what communication costs the step")));
    }
    busbwChart(el, d.series);
    heatmap(el, d);
    fabricTable(el, d.nics);
  };
})();
