/* Synced time charts on uPlot for the job page (job.js; docs/web.md). Plain script, no build
 * step. window.gpufleetCharts:
 *   timeline(min, max)  one time range shared by every chart of a page: a picker, a drag-zoom
 *                       or a double-click reset on any chart sets it on all (uPlot's cursor
 *                       sync moves their cursors together);
 *   chart(el, spec)     a uPlot chart that joins a timeline, with horizontal capacity lines,
 *                       event markers and an optional band painted above the plot;
 *   lazy(el, build)     build a chart only when it scrolls near the viewport; flush() builds
 *                       every pending one (a promise: a builder may wait for its data).
 * Data arrays go to uPlot as the API sent them (nulls are gaps): no copy per point. */
"use strict";
(() => {
  const AXIS = { stroke: "#8b949e", grid: { stroke: "#21262d", width: 1 }, ticks: { stroke: "#30363d", width: 1 } };
  const EVENT_COLORS = { xid: "#f85149", ecc_dbe: "#d29922", ecc_sbe: "#d29922", row_remap_failure: "#a371f7",
    nvlink_error: "#db61a2", fell_off_bus: "#f85149", other: "#8b949e" };
  const eventColor = (kind) => EVENT_COLORS[kind] || EVENT_COLORS.other;

  function timeline(min, max) {
    const members = new Set();
    const listeners = [];
    const t = { full: [min, max], range: [min, max] };
    t.set = (lo, hi, from) => {
      lo = Math.max(t.full[0], lo); hi = Math.min(t.full[1], hi);
      if (!(hi > lo)) { lo = t.full[0]; hi = t.full[1]; }
      if (lo === t.range[0] && hi === t.range[1]) return;
      t.range = [lo, hi];
      for (const m of members) if (m !== from) m.setRange(lo, hi);
      for (const fn of listeners) fn(lo, hi);
    };
    t.reset = () => t.set(t.full[0], t.full[1]);
    t.join = (m) => { members.add(m); if (t.range[0] !== t.full[0] || t.range[1] !== t.full[1]) m.setRange(...t.range); };
    t.onChange = (fn) => listeners.push(fn);
    t.members = members;
    return t;
  }

  // Ticks that read: a y axis from 0 (or the data's floor) to a round top with 4-6 labels,
  // never the single tick a flat series gets from an auto range around its one value.
  function niceRange(lo, hi, floorZero) {
    if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [0, 1];
    if (floorZero) lo = Math.min(0, lo);
    if (hi - lo < 1e-9) hi = lo + Math.max(1, Math.abs(lo) * 0.1);
    const step = 10 ** Math.floor(Math.log10((hi - lo) / 4));
    const m = [1, 2, 2.5, 5, 10].find((k) => (hi - lo) / (k * step) <= 6) * step;
    return [Math.floor(lo / m) * m, Math.ceil(hi / m) * m];
  }

  // Paint the band rows, capacity lines and event markers after uPlot draws its series.
  function overlay(u, spec) {
    const ctx = u.ctx, { left, top, width, height } = u.bbox, pr = devicePixelRatio || 1;
    ctx.save();
    ctx.beginPath(); ctx.rect(left, top, width, height); ctx.clip();
    ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";  // uPlot leaves its axis labels' alignment set
    for (const c of spec.capacities || []) {
      const y = u.valToPos(c.value, "y", true);
      ctx.strokeStyle = c.color || "#f85149"; ctx.lineWidth = pr; ctx.setLineDash([6 * pr, 4 * pr]);
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + width, y); ctx.stroke();
      ctx.setLineDash([]); ctx.fillStyle = c.color || "#f85149"; ctx.font = `${10 * pr}px sans-serif`;
      ctx.fillText(c.label, left + 4 * pr, y - 3 * pr);
    }
    if (spec.band) {
      const { rows, t, step } = spec.band, rh = 5 * pr;
      rows.forEach((row, r) => {
        ctx.fillStyle = row.color;
        for (let i = 0; i < t.length; i++) {
          if (!row.on[i]) continue;
          const x0 = u.valToPos(t[i], "x", true), x1 = u.valToPos(t[i] + step, "x", true);
          ctx.fillRect(x0, top + r * (rh + pr), Math.max(pr, x1 - x0), rh);
        }
      });
    }
    const [xmin, xmax] = [u.scales.x.min, u.scales.x.max];
    ctx.font = `${10 * pr}px sans-serif`;
    // Labels of events close in time stack upwards instead of printing over each other: each
    // goes on the lowest row whose last label ends left of it; past MAX_ROWS only the line is
    // drawn (the events table below the charts lists every one).
    const MAX_ROWS = 4, rowEnd = [];
    const shown = (spec.events || []).filter((e) => e.ts >= xmin && e.ts <= xmax).sort((a, b) => a.ts - b.ts);
    for (const e of shown) {
      const x = u.valToPos(e.ts, "x", true);
      ctx.strokeStyle = ctx.fillStyle = eventColor(e.kind); ctx.lineWidth = 1.5 * pr;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
      const x0 = x + 3 * pr, w = ctx.measureText(e.short).width;
      let row = rowEnd.findIndex((end) => x0 > end + 4 * pr);
      if (row < 0 && rowEnd.length < MAX_ROWS) row = rowEnd.push(-Infinity) - 1;
      if (row < 0) continue;
      rowEnd[row] = x0 + w;
      ctx.fillText(e.short, x0, top + height - (4 + 12 * row) * pr);
    }
    ctx.restore();
  }

  /* spec: { t, lines: [{label, values, color (string or fn), width}], height, fmt (y labels),
   *   yRange: [lo, hi] | "zero" | "auto", capacities, events, band, timeline, onCursor(i), width } */
  function chart(el, spec) {
    const few = spec.t.length < 40;  // a job that just started: draw its points or nothing shows
    const series = [{}, ...spec.lines.map((l) => ({ label: l.label, stroke: l.color, width: l.width || 1, spanGaps: false,
      points: { show: few, size: 4, fill: typeof l.color === "string" ? l.color : undefined } }))];
    let lo = Infinity, hi = -Infinity;
    if (spec.yRange === "zero" || spec.yRange === undefined) {
      for (const l of spec.lines) for (const v of l.values) if (v !== null) { if (v < lo) lo = v; if (v > hi) hi = v; }
      for (const c of spec.capacities || []) hi = Math.max(hi, c.value * 1.05);
    }
    const yr = Array.isArray(spec.yRange) ? spec.yRange : niceRange(lo, hi, true);
    let applying = true;  // until built: uPlot sets its own initial scale, which is no user's choice
    const member = { setRange: (a, b) => { applying = true; u.setScale("x", { min: a, max: b }); applying = false; } };
    const opts = {
      // spec.width: the caller measured once for a grid of equal charts (each measurement after
      // another chart went in forces a layout of the whole page)
      width: spec.width || Math.max(300, (el.getBoundingClientRect().width || 560) - 12), height: spec.height || 170,
      legend: { show: false },
      cursor: { points: { show: false }, sync: { key: "job" }, drag: { x: true, y: false } },
      scales: { x: { time: true }, y: { range: () => yr } },
      axes: [{ ...AXIS, space: 70, values: window.gpufleetFmt.TIME_AXIS }, { ...AXIS, size: spec.axisSize || 60, values: (u, vals) => vals.map(spec.fmt) }],
      series,
      hooks: {
        setScale: [(u, key) => { if (key === "x" && !applying && spec.timeline) spec.timeline.set(u.scales.x.min, u.scales.x.max, member); }],
        setCursor: [(u) => { if (spec.onCursor) spec.onCursor(u.cursor.idx); }],
        draw: [(u) => overlay(u, spec)],
      },
    };
    const u = new uPlot(opts, [spec.t, ...spec.lines.map((l) => l.values)], el);
    applying = false;
    if (spec.timeline) {
      spec.timeline.join(member);
      // a double-click resets every chart, not only this one (uPlot's own reset is per chart)
      u.over.addEventListener("dblclick", () => spec.timeline.reset());
    }
    return u;
  }

  // Build when the element comes within a screen of the viewport; tests and the benchmark can
  // force every pending chart with window.gpufleetCharts.flush().
  const pending = new Set();
  const io = typeof IntersectionObserver === "undefined" ? null : new IntersectionObserver((entries) => {
    for (const en of entries) if (en.isIntersecting) { io.unobserve(en.target); run(en.target); }
  }, { rootMargin: "100% 0px" });
  const builders = new WeakMap();
  function run(el) { const b = builders.get(el); if (b) { builders.delete(el); pending.delete(el); return b(); } return null; }
  function lazy(el, build) {
    if (!io) { build(); return; }
    builders.set(el, build); pending.add(el); io.observe(el);
  }
  // a builder may return a promise (its data still on the way): flush resolves when all are built
  function flush() { return Promise.all([...pending].map((el) => { if (io) io.unobserve(el); return run(el); })); }

  window.gpufleetCharts = { timeline, chart, lazy, flush, niceRange, eventColor, AXIS };
})();
