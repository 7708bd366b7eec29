/* Fleet page helpers app.js calls when present: the time range (?window=1h|6h|24h|7d, a
 * picker next to the title) and the waste KPI with its denominator and cost ("7.0 of 102.4
 * allocated GPU-h · $17.50 at $2.50/GPU-h"). The price comes from the settings model
 * (cost.gpu_hour_price, per cluster in cost.gpu_hour_price_by_cluster), handed to the page in
 * its data-config. Unknown stays unknown: no price set, no cost shown; no allocation, no ratio.
 * And the waste split by workload (training / serving, with the serving causes). */
(function () {
  "use strict";
  const RANGES = [["1h", "1 h"], ["6h", "6 h"], ["24h", "24 h"], ["7d", "7 d"]];
  const dash = "–";
  const cfg = JSON.parse(document.getElementById("app").dataset.config || "{}");
  const cost = cfg.cost || {};

  function range() {
    const key = new URLSearchParams(location.search).get("window");
    const hit = RANGES.find(([k]) => k === key) || RANGES[2];
    return { key: hit[0], label: hit[1] };
  }

  function rangePicker(current) {
    const sel = document.createElement("select");
    sel.id = "range";
    sel.setAttribute("aria-label", "time range");
    for (const [k, label] of RANGES) {
      const o = document.createElement("option");
      o.value = k;
      o.textContent = `last ${label}`;
      if (k === current.key) o.selected = true;
      sel.append(o);
    }
    sel.addEventListener("change", () => {
      const p = new URLSearchParams(location.search);
      p.set("window", sel.value);
      location.search = p.toString();
    });
    return sel;
  }

  const gh = (v) => window.gpufleetFmt.gh(v);  // one rounding rule (fmt.js)

  function money(v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return null;
    try {
      return new Intl.NumberFormat("en-US", { style: "currency", currency: cost.currency || "USD",
        maximumFractionDigits: v >= 1000 ? 0 : 2 }).format(v);
    } catch (e) {
      return `${v.toFixed(2)} ${cost.currency || ""}`.trim();
    }
  }

  // The price for the page's data: a cluster's own when the page shows one cluster, else
  // the default. Null when none is configured.
  function price(cluster) {
    const by = cost.by_cluster || {};
    if (cluster && Object.prototype.hasOwnProperty.call(by, cluster)) return by[cluster];
    return cost.price ?? null;
  }

  // [label, value, title] for app.js's kpi(): waste "of" allocated, and the cost when priced.
  function wasteKpi(s, W, cluster) {
    const wasted = s.wasted_gpu_hours_total;
    const alloc = s.allocated_gpu_hours;
    const p = price(cluster);
    const value = alloc === null || alloc === undefined ? gh(wasted) : `${gh(wasted)} of ${gh(alloc)}`;
    const parts = [`GPU-hours wasted of GPU-hours allocated to jobs, last ${W.label}`];
    if (alloc) parts.push(`${window.gpufleetFmt.pct((wasted || 0) / alloc, 1)} of allocated`);
    if (p !== null && wasted !== null && wasted !== undefined) parts.push(`${money(wasted * p)} at ${money(p)}/GPU-h`);
    const el = document.createElement("span");
    el.className = "waste-of";
    el.textContent = value;
    const label = `Wasted GPU-h ${W.label}` + (alloc !== null && alloc !== undefined ? " (of allocated)" : "");
    const costLine = p !== null && wasted !== null && wasted !== undefined ? money(wasted * p) : null;
    if (costLine) {
      const c = document.createElement("span");
      c.className = "cost";
      c.textContent = ` · ${costLine}`;
      el.append(c);
    }
    return [label, el, parts.join(" · ")];
  }

  // The summary's waste by workload (wasted_by_workload: "training", every job that is not a
  // serving replica, and "serving", the jobs with serving replica-minutes in the range): jobs,
  // allocated, productive and wasted GPU-h, and each one's causes, biggest first (those that round
  // to 0.0 left out, as the bars do). Null when the server has no split (an older server).
  function workloadTable(s, { h, table, title }) {
    const w = s.wasted_by_workload;
    if (!w) return null;
    const rows = ["training", "serving"].filter((k) => w[k]).map((k) => ({ key: k, ...w[k] }));
    const causes = (r) => {
      const big = Object.entries(r.wasted_gpu_hours || {}).filter(([, v]) => gh(v) !== "0.0")
        .sort((a, b) => b[1] - a[1]);
      if (!big.length) return h("span", { class: "muted" }, dash);
      return h("span", {}, big.map(([k, v], i) => [i ? " · " : null,
        h("span", { class: "cause", "data-kind": k, title: k }, `${title(k)} `, h("b", {}, gh(v)))]));
    };
    return table([
      { label: "Workload", get: (r) => h("span", { "data-workload": r.key }, r.key) },
      { label: "Jobs", n: true, get: (r) => String(r.jobs) },
      { label: "Allocated GPU-h", n: true, get: (r) => gh(r.allocated_gpu_hours) },
      { label: "Productive GPU-h", n: true, get: (r) => gh(r.productive_gpu_hours) },
      { label: "Wasted GPU-h", n: true, get: (r) => gh(r.wasted_gpu_hours_total) },
      { label: "Causes (GPU-h)", wrap: true, get: causes },
    ], rows, { class: "workloads" });
  }

  window.gpufleetFleet = { range, rangePicker, wasteKpi, price, money, workloadTable };
})();
