/* Evidence for people: the one formatter every page uses to show a flag's evidence (job page
 * flag cards, the flags page's one-line summary, the goodput panel's findings). Labels, units
 * and one-line meanings come from the flag registry (gpufleet/flagkinds.toml, served at
 * GET /api/v1/flag-kinds), never from this file, so a new evidence key needs no change here.
 *
 * Rules: a number carries its unit in the registry's words (ratios as percentages, bytes/s as
 * GB/s, durations as s/min/h, integers without decimals, three significant digits otherwise);
 * null reads "not measured" (unknown is not zero); a key the registry lacks reads as words,
 * never as snake_case; a list longer than three is folded ("8 GPUs", expandable); GPU UUIDs are
 * shortened links to their GPU page; XIDs are decoded with NVIDIA's meaning (xid.js).
 * Loaded after dom.js and xid.js, before app.js and goodput.js. Text nodes only. */
"use strict";
(() => {
  const { h } = window.gpufleetDom; // api/static/dom.js
  const FOLD = 3; // list items shown before folding
  const dash = "–";
  let registryReq = null;
  let REG = { kinds: [], common_evidence: {}, item_evidence: {} };

  // The registry, fetched once per page (app.js and goodput.js share this request).
  function registry() {
    if (!registryReq) {
      registryReq = fetch("/api/v1/flag-kinds", { headers: { Accept: "application/json" }, credentials: "same-origin" })
        .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`${r.status} ${r.statusText}`))))
        .then((r) => { REG = { item_evidence: {}, common_evidence: {}, ...r }; return REG; });
    }
    return registryReq;
  }

  // ---- numbers ------------------------------------------------------------------------
  const trim = (s) => (s.includes(".") ? s.replace(/\.?0+$/, "") : s);
  function number(v) {
    if (!Number.isFinite(v)) return String(v);
    if (Number.isInteger(v)) return v.toLocaleString("en-US");
    const a = Math.abs(v);
    if (a >= 1000) return Math.round(v).toLocaleString("en-US");
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return trim(v.toFixed(1));
    if (a >= 0.001) return trim(v.toPrecision(3));
    return v.toExponential(1);
  }
  function scaled(v, base, units) {
    let x = Math.abs(v); let i = 0;
    while (x >= base && i < units.length - 1) { x /= base; i++; }
    return `${v < 0 ? "-" : ""}${number(Number(x.toPrecision(3)))} ${units[i]}`;
  }
  function percent(v) {
    const p = v * 100;
    if (p !== 0 && Math.abs(p) < 0.1) return p > 0 ? "<0.1%" : "-<0.1%";
    return `${trim(p.toFixed(1))}%`;
  }
  function seconds(v) {
    const a = Math.abs(v);
    if (a < 1 && a > 0) return `${number(Number((v * 1000).toPrecision(3)))} ms`;
    if (a < 120) return `${number(Number(v.toPrecision(3)))} s`;
    if (a < 7200) return `${number(Number((v / 60).toPrecision(3)))} min`;
    if (a < 172800) return `${number(Number((v / 3600).toPrecision(3)))} h`;
    return `${number(Number((v / 86400).toPrecision(3)))} d`;
  }
  const FORMAT = {
    ratio: percent,
    count: number,
    minutes: (v) => (Math.abs(v) < 1 ? seconds(v * 60) : Math.abs(v) < 120 ? `${number(Number(v.toPrecision(3)))} min` : seconds(v * 60)),
    seconds,
    MHz: (v) => `${Math.round(v).toLocaleString("en-US")} MHz`,
    W: (v) => `${Math.round(v).toLocaleString("en-US")} W`,
    GiB: (v) => `${number(Number(v.toPrecision(3)))} GiB`,
    bytes: (v) => scaled(v, 1024, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]),
    "bytes/s": (v) => scaled(v, 1000, ["B/s", "KB/s", "MB/s", "GB/s", "TB/s"]),
    per_minute: (v) => `${number(v)} /min`,
    xid: (v) => xidText(v),
  };
  // A key the registry lacks: its unit guessed from the name's suffix, its label in words.
  const SUFFIX_UNITS = [[/_bytes_s$/, "bytes/s"], [/_bytes$/, "bytes"], [/_mhz$/, "MHz"], [/_w$/, "W"], [/_gib$/, "GiB"],
    [/_minutes$/, "minutes"], [/_s$/, "seconds"], [/_(fraction|share|util)$/, "ratio"]];
  const words = (key) => String(key).replace(/_/g, " ");
  function guess(key) {
    const hit = SUFFIX_UNITS.find(([re]) => re.test(key));
    return { label: words(key), unit: hit ? hit[1] : "", meaning: "" };
  }

  function xidText(code) {
    const x = window.gpufleetXid;
    const d = x && x.decode ? x.decode(code) : null;
    return d ? `XID ${code}: ${d.meaning}` : `XID ${code}`;
  }

  // ---- specs --------------------------------------------------------------------------
  const kindOf = (kind) => (REG.kinds || []).find((k) => k.name === kind) || null;
  function spec(kind, key) {
    const k = kindOf(kind);
    return (k && k.evidence && k.evidence[key]) || (REG.common_evidence || {})[key] || null;
  }
  const itemSpec = (key) => (REG.item_evidence || {})[key] || guess(key);

  // ---- values -------------------------------------------------------------------------
  const isUuid = (v) => typeof v === "string" && /^(GPU|MIG)-[0-9a-f-]{8,}/i.test(v);
  const shortUuid = (u) => (u.length > 20 ? `${u.slice(0, 12)}…${u.slice(-4)}` : u);
  const plain = (v) => v === null || typeof v !== "object";

  // One scalar as text ("450 GB/s", "87.3%", "not measured").
  function text(s, v) {
    if (v === null || v === undefined) return "not measured";
    if (typeof v === "boolean") return v ? "yes" : "no";
    const unit = s ? s.unit : "";
    if (typeof v === "number") {
      const f = FORMAT[unit] || (unit === "list" || unit === "map" ? FORMAT[s.of] : null);
      return f ? f(v) : number(v);
    }
    if (typeof v === "string") return unit === "xid" ? xidText(v) : v;
    return Array.isArray(v) ? v.map((x) => text(s, x)).join(", ") : JSON.stringify(v);
  }
  // the same, as a node: a GPU UUID is a shortened link to its page
  function scalarNode(s, v) {
    if (isUuid(v)) return h("a", { class: "uuid", href: `/gpus/${encodeURIComponent(v)}`, title: v }, shortUuid(v));
    return h("span", {}, text(s && s.unit === "list" ? { unit: s.of || "" } : s, v));
  }
  // an object (a faulty GPU, a port, a stuck rank): "label value · label value"
  function objectNode(o) {
    const parts = Object.entries(o).filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => {
      const s = itemSpec(k);
      const value = plain(v) ? scalarNode(s, v) : Array.isArray(v) ? h("span", {}, v.map((x) => text(s, x)).join(", ")) : mapNode(s, v);
      // a UUID and a decoded XID say what they are; every other value gets its label
      const bare = k === "gpu_uuid" || s.unit === "xid";
      return h("span", { class: "ev-part", title: s.meaning || null }, bare ? null : `${s.label} `, value);
    });
    return h("span", { class: "ev-item" }, parts.flatMap((p, i) => (i ? [" · ", p] : [p])));
  }
  function mapNode(s, m) {
    const parts = Object.entries(m).map(([k, v]) => {
      const inner = REG.item_evidence && REG.item_evidence[k] ? REG.item_evidence[k] : { ...guess(k), unit: (s && s.of) || guess(k).unit };
      const unit = s && s.of ? { unit: s.of } : inner;
      return h("span", { class: "ev-part", title: inner.meaning || null }, `${inner.label} `, plain(v) ? scalarNode(unit, v) : objectNode(v));
    });
    return h("span", { class: "ev-item" }, parts.flatMap((p, i) => (i ? [" · ", p] : [p])));
  }
  // What a folded list counts: GPUs, XIDs, ports, ranks, else items.
  function noun(list, s) {
    if (list.every(isUuid) || list.every((x) => x && typeof x === "object" && isUuid(x.gpu_uuid))) return "GPUs";
    if (s && s.of === "xid") return "XIDs";
    if (list.every((x) => x && typeof x === "object" && "nic" in x)) return "ports";
    if (list.every((x) => x && typeof x === "object" && "rank" in x)) return "ranks";
    return "items";
  }
  function listNode(s, list) {
    if (!list.length) return h("span", { class: "muted" }, "none");
    // names in a list (signals judged from, NVIDIA's clock reasons) read as words
    const one = (x) => (typeof x === "string" && !isUuid(x) ? h("span", {}, words(x)) : plain(x) ? scalarNode(s, x) : objectNode(x));
    const n = noun(list, s);
    const objects = list.some((x) => !plain(x));
    if (list.length <= FOLD && !(objects && list.length > 1)) {
      return h("span", { class: "ev-list" }, list.map((x, i) => [i ? ", " : null, one(x)]));
    }
    const label = list.length === 1 && n !== "items" ? n.replace(/s$/, "") : n;
    return h("details", { class: "ev-fold" }, h("summary", {}, `${list.length} ${label}`),
      h(objects ? "ul" : "div", { class: "ev-items" }, list.map((x) => (objects ? h("li", {}, one(x)) : one(x)))));
  }
  function valueNode(s, v, key) {
    if (key === "cause" && typeof v === "string") return h("b", {}, words(v));
    if (Array.isArray(v)) return listNode(s, v);
    if (v && typeof v === "object") return mapNode(s, v);
    return scalarNode(s, v);
  }

  // ---- what the pages call ------------------------------------------------------------
  // The rows of a flag card: label | value | its one-line meaning.
  function table(kind, evidence, opts = {}) {
    const rows = Object.entries(evidence || {}).map(([k, v]) => {
      const s = spec(kind, k) || guess(k);
      return h("tr", { "data-key": k }, h("td", { class: "ev-label" }, s.label),
        h("td", { class: "ev-value" }, valueNode(s, v, k)),
        opts.meanings === false ? null : h("td", { class: "ev-meaning muted" }, s.meaning || ""));
    });
    return h("table", { class: "evidence" }, h("tbody", {}, rows));
  }
  // One line: the first n labelled scalars (or short lists), "label value · label value".
  function line(kind, evidence, n = 3) {
    const entries = Object.entries(evidence || {})
      .filter(([k, v]) => v !== null && v !== undefined && k !== "cause" && (plain(v) || (Array.isArray(v) && v.every(plain) && v.length)))
      .map(([k, v]) => [spec(kind, k), k, v]).sort(([a], [b]) => (b ? 1 : 0) - (a ? 1 : 0)).slice(0, n);
    const parts = entries.map(([s, k, v]) => {
      const sp = s || guess(k);
      // a long list: "11 GPUs" when it counts GPUs, else its first two and how many more
      const more = (l) => (noun(l, sp) === "items" ? `${text({ unit: sp.of || "" }, l.slice(0, 2))} +${l.length - 2}` : `${l.length} ${noun(l, sp)}`);
      const names = Array.isArray(v) && v.every((x) => typeof x === "string" && !isUuid(x));  // signals: words, not nic_counters
      const value = Array.isArray(v) ? (v.length > 2 ? more(v) : names ? v.map(words).join(", ") : text({ unit: sp.of || "" }, v))
        : isUuid(v) ? shortUuid(v) : text(sp, v);
      // "8 GPUs", not "GPUs 8 GPUs": a count that names its noun needs no label before it
      const counted = Array.isArray(v) && v.length > 2 && noun(v, sp) !== "items";
      return counted && sp.label.toLowerCase() === noun(v, sp).toLowerCase() ? value : `${sp.label} ${value}`;
    });
    const cause = evidence && typeof evidence.cause === "string" ? [`cause ${words(evidence.cause)}`] : [];
    return [...cause, ...parts].join(" · ") || dash;
  }

  window.gpufleetEvidence = { registry, spec, text, table, line, number, percent, seconds, words };
})();
