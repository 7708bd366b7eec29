/* gpufleet web pages: the one set of number, unit and date formats every page uses (loaded after
 * dom.js), so a number reads the same on every page and matches the API's (docs/web.md, "Numbers").
 * Rounding: half away from zero on the number's shortest decimal form (what the API's JSON
 * carries), so 0.2795 shows 28.0% (toFixed alone gives 27.9%: 0.2795 * 100 is 27.949999...).
 * The Python mirror is tests/web/webpage.py (rounded, pct) and alerts/render.py (pct_text).
 * Rates are bytes per second in decimal units (GB/s) everywhere; a link's trained rate, which
 * InfiniBand states in Gb/s, is converted to GB/s for the same axis. Dates are local time,
 * YYYY-MM-DD HH:MM. Unknown (null) reads as a dash, never as zero. */
"use strict";
(() => {
  const dash = "–";
  const missing = (v) => v === null || v === undefined || (typeof v === "number" && !Number.isFinite(v));
  // v x 10^shift rounded half away from zero to d decimals, as text, done on the decimal digits
  // of v's shortest form (what the API's JSON carries): exact, no binary error from the shift,
  // so a ratio 0.1505 is 15.1% (multiplying first gives 15.049999999999999, which reads 15.0%)
  function decimal(v, shift, d) {
    const [m, e] = String(Math.abs(v)).split("e");
    const [ip, fp = ""] = m.split(".");
    let digits = (ip + fp).replace(/^0+(?=\d)/, "");
    let point = ip.replace(/^0+(?=\d)/, "").length + Number(e || 0) + shift;  // digits before the point
    if (ip.replace(/^0+/, "") === "") { point = Number(e || 0) + shift; digits = fp; }  // 0.xxx
    if (point + d < 0) { digits = "0".repeat(-(point + d)) + digits; point = -d; }
    const keep = point + d;
    digits = digits.padEnd(keep + 1, "0");
    let head = BigInt(digits.slice(0, keep) || "0");
    if (Number(digits[keep]) >= 5) head += 1n;
    const t = head.toString().padStart(d + 1, "0");
    const out = d ? `${t.slice(0, t.length - d)}.${t.slice(t.length - d)}` : t;
    return v < 0 && /[1-9]/.test(out) ? `-${out}` : out;
  }
  const fixed = (v, d = 0) => decimal(Number(v), 0, d);
  const round = (v, d = 0) => Number(fixed(v, d));
  const pct = (v, d = 0) => (missing(v) ? dash : `${decimal(v, 2, d)}%`);
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
