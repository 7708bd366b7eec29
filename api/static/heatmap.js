/* GPU x time heatmap for the job page (job.js; docs/web.md). One cell per GPU and time bucket,
 * painted as one pixel of an offscreen ImageData (a 64-GPU x 24 h job is 64 x 360 pixels) and
 * scaled onto the visible canvas without smoothing, so a redraw for a new time range is one
 * drawImage. Grey = no data (unknown is not zero). Plain script, no build step.
 *   window.gpufleetHeatmap(el, { gpus: [{label, node, flagged}], t, step, timeline, events,
 *     onPick(i) }) -> { show(rows, scale) }   rows: one array per GPU; scale: {lo, hi, fmt}
 * Hover names the GPU, the time and the value; a click picks the GPU (job.js highlights it). */
"use strict";
(() => {
  const { h } = window.gpufleetDom;
  // viridis, 9 stops, interpolated into a 256-entry table once
  const STOPS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141], [39, 173, 129],
    [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  const LUT = new Uint8Array(256 * 3);
  for (let i = 0; i < 256; i++) {
    const x = (i / 255) * (STOPS.length - 1), k = Math.min(STOPS.length - 2, Math.floor(x)), f = x - k;
    for (let c = 0; c < 3; c++) LUT[i * 3 + c] = Math.round(STOPS[k][c] + f * (STOPS[k + 1][c] - STOPS[k][c]));
  }
  const hhmm = (ts) => window.gpufleetFmt.when(ts);  // one date format on every page (fmt.js)

  window.gpufleetHeatmap = function (el, o) {
    const G = o.gpus.length, n = o.t.length;
    const rh = Math.max(6, Math.min(16, Math.floor(420 / Math.max(1, G))));
    const W = Math.max(300, (el.getBoundingClientRect().width || 900) - 150);
    const canvas = h("canvas", { id: "heatmap-canvas", width: W, height: rh * G, style: { width: `${W}px`, height: `${rh * G}px`, cursor: "crosshair" } });
    const off = document.createElement("canvas");
    off.width = Math.max(1, n); off.height = Math.max(1, G);
    const octx = off.getContext("2d"), img = octx.createImageData(off.width, off.height);
    const readout = h("span", { class: "rd", id: "heatmap-readout" });
    const rampLo = h("span", { class: "muted" }), rampHi = h("span", { class: "muted" });
    // row names: every GPU when rows are tall enough to read, else each node at its first GPU
    const names = h("div", { class: "heat-names" }, o.gpus.map((g, i) => {
      const first = i === 0 || o.gpus[i - 1].node !== g.node;
      const text = rh >= 10 ? g.label : first ? g.node : "";
      return h("div", { class: `${g.flagged ? "flagged" : ""}${first && i ? " first" : ""}`, title: g.label,
        // a node's name on rows too short for it runs down over its node's next (empty) rows
        style: { height: `${rh}px`, lineHeight: `${Math.max(rh, 12)}px`, fontSize: `${Math.min(11, Math.max(9, rh))}px`, overflow: "visible" } },
        g.flagged ? `${text} ◀` : text);
    }));
    el.append(h("div", { class: "heat-wrap" }, names, canvas),
      h("div", { class: "heat-scale" }, rampLo, h("span", { class: "ramp viridis" }), rampHi, h("span", { class: "muted" }, " · grey = no data · click a row to highlight that GPU"), readout));
    let rows = [], scale = { lo: 0, hi: 1, fmt: String };

    function paint() {
      const px = img.data, span = scale.hi - scale.lo || 1;
      for (let g = 0; g < G; g++) {
        const r = rows[g] || [];
        for (let i = 0; i < n; i++) {
          const v = r[i], p = (g * n + i) * 4;
          if (v === null || v === undefined) { px[p] = 48; px[p + 1] = 54; px[p + 2] = 61; px[p + 3] = 255; continue; }
          const k = Math.max(0, Math.min(255, Math.round(((v - scale.lo) / span) * 255))) * 3;
          px[p] = LUT[k]; px[p + 1] = LUT[k + 1]; px[p + 2] = LUT[k + 2]; px[p + 3] = 255;
        }
      }
      octx.putImageData(img, 0, 0);
      rampLo.textContent = scale.fmt(scale.lo); rampHi.textContent = scale.fmt(scale.hi);
      draw();
    }
    const cols = () => {
      const [lo, hi] = o.timeline.range, t0 = o.t[0];
      const i0 = Math.max(0, Math.floor((lo - t0) / o.step)), i1 = Math.min(n, Math.ceil((hi - t0) / o.step));
      return [i0, Math.max(i0 + 1, i1)];
    };
    function draw() {
      const ctx = canvas.getContext("2d"), [i0, i1] = cols();
      ctx.imageSmoothingEnabled = false;
      ctx.clearRect(0, 0, canvas.width, canvas.height);
      ctx.drawImage(off, i0, 0, i1 - i0, G, 0, 0, canvas.width, canvas.height);
      ctx.fillStyle = "#0d1117";  // node boundaries
      for (let g = 1; g < G; g++) if (o.gpus[g].node !== o.gpus[g - 1].node) ctx.fillRect(0, g * rh - 1, canvas.width, 1);
      const [lo, hi] = o.timeline.range;
      for (const e of o.events || []) {
        if (e.ts < lo || e.ts > hi) continue;
        const x = ((e.ts - lo) / (hi - lo)) * canvas.width;
        ctx.fillStyle = window.gpufleetCharts.eventColor(e.kind);
        ctx.fillRect(x - 1, 0, 2, canvas.height);
      }
    }
    const cellAt = (ev) => {
      const b = canvas.getBoundingClientRect(), [i0, i1] = cols();
      const g = Math.floor((ev.clientY - b.top) / rh), i = i0 + Math.floor(((ev.clientX - b.left) / b.width) * (i1 - i0));
      return g >= 0 && g < G && i >= 0 && i < n ? [g, i] : null;
    };
    canvas.addEventListener("mousemove", (ev) => {
      const c = cellAt(ev);
      if (!c) { readout.textContent = ""; return; }
      const v = (rows[c[0]] || [])[c[1]];
      readout.textContent = `  ${o.gpus[c[0]].label} · ${hhmm(o.t[c[1]])} · ${v === null || v === undefined ? "no data" : scale.fmt(v)}`;
    });
    canvas.addEventListener("click", (ev) => { const c = cellAt(ev); if (c && o.onPick) o.onPick(c[0]); });
    o.timeline.onChange(draw);
    return { show(r, s) { rows = r; scale = s; paint(); }, canvas };
  };
})();
