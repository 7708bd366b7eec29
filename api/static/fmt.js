/* gpufleet web pages: the one set of number, unit and date formats every page uses (loaded after
 * dom.js), so a number reads the same on every page and matches the API's (docs/web.md, "Numbers").
 * Rounding: half away from zero on the number's shortest decimal form (what the API's JSON
 * carries), so 0.2795 shows 28.0% (toFixed alone gives 27.9%: 0.2795 * 100 is 27.949999...).
 * Rates are bytes per second in decimal units (GB/s) everywhere; a link's trained rate, which
 * InfiniBand states in Gb/s, is converted to GB/s for the same axis. Dates are local time,
 * YYYY-MM-DD HH:MM. Unknown (null) reads as a dash, never as zero. */
"use strict";
(() => {
  const dash = "–";
  const missing = (v) => v === null || v === undefined || (typeof v === "number" && !Number.isFinite(v));
  // round half away from zero at d decimals, on the shortest decimal form of v
  function round(v, d = 0) {
    const [m, e] = String(Math.abs(v)).split("e");
    const x = Math.round(Number(`${m}e${Number(e || 0) + d}`));
    return Math.sign(v) * Number(`${x}e${-d}`);
  }
  const fixed = (v, d = 0) => round(v, d).toFixed(d);
  const pct = (v, d = 0) => (missing(v) ? dash : `${fixed(v * 100, d)}%`);
  const num = (v, d = 1) => (missing(v) ? dash : fixed(Number(v), d));
  // GPU-hours: one decimal under 100, none above
  const gh = (v) => (missing(v) ? dash : Math.abs(v) >= 100 ? fixed(v, 0) : fixed(v, 1));
  function scaled(v, base, units) {
    let x = Math.abs(v), i = 0;
    while (x >= base && i < units.length - 1) { x /= base; i++; }
    return `${v < 0 ? "-" : ""}${fixed(x, x < 10 ? 1 : 0)} ${units[i]}`;
  }
  const rate = (v) => (missing(v) ? dash : scaled(v, 1000, ["B/s", "KB/s", "MB/s", "GB/s", "TB/s"]));
  const linkRate = (gbps) => (missing(gbps) ? dash : rate((gbps * 1e9) / 8));  // Gb/s -> bytes/s
  const gib = (v) => (missing(v) ? dash : `${fixed(v / 2 ** 30, 1)} GiB`);
  const pad = (n) => String(n).padStart(2, "0");
  function when(ts, seconds = false) {
    if (!ts) return dash;
    const d = new Date(ts * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`
      + (seconds ? `:${pad(d.getSeconds())}` : "");
  }
  const clock = (ts) => { const d = ts ? new Date(ts * 1000) : new Date(); return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`; };
  // "1 restart", "3 restarts"
  const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;
  // uPlot time-axis labels in the same 24-hour, year-month-day form as every table (uPlot's own
  // default is "3:00pm" over "12/7/26"): [tick step s, label, first-of-its-year, -month, -day, ...]
  const TIME_AXIS = [
    [86400 * 365, "{YYYY}", null, null, null, null, null, null, 1],
    [86400 * 28, "{YYYY}-{MM}", null, null, null, null, null, null, 1],
    [86400, "{MM}-{DD}", "\n{YYYY}", null, null, null, null, null, 1],
    [3600, "{HH}:{mm}", "\n{YYYY}-{MM}-{DD}", null, "\n{YYYY}-{MM}-{DD}", null, null, null, 1],
    [60, "{HH}:{mm}", "\n{YYYY}-{MM}-{DD}", null, "\n{YYYY}-{MM}-{DD}", null, null, null, 1],
    [1, "{HH}:{mm}:{ss}", "\n{YYYY}-{MM}-{DD}", null, "\n{YYYY}-{MM}-{DD}", null, null, null, 1],
  ];
  window.gpufleetFmt = { dash, round, fixed, pct, num, gh, rate, linkRate, gib, when, clock, plural, TIME_AXIS };
})();
