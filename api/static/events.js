/* Health events (XID, ECC, row remap, NVLink, fell off the bus) as people read them: one table
 * with NVIDIA's meaning, whose problem it usually is and the first thing to do (xid.js, from
 * gpufleet/xid.toml), and the short marker text the charts draw. Used by the node page; any
 * page with an events list can call it. window.gpufleetEvents = { short, describe, table }. */
(function () {
  "use strict";
  const dash = "–";
  const words = (s) => String(s).replace(/_/g, " ");
  const X = () => window.gpufleetXid;

  // the marker label on a chart: "XID 79", "ecc dbe"
  const short = (e) => (e.kind === "xid" && e.code !== null && e.code !== undefined ? `XID ${e.code}` : words(e.kind));
  // { meaning, origin, action } for an XID the table knows; null otherwise
  const decoded = (e) => (e.kind === "xid" && X() ? X().decode(e.code) : null);

  function describe(e) {
    const d = decoded(e);
    if (d) return d.meaning;
    if (e.kind === "xid") return e.code === null || e.code === undefined ? "XID without a code" : `XID ${e.code} (not in gpufleet's table)`;
    return words(e.kind);
  }

  const when = (ts) => window.gpufleetFmt.when(ts, true);  // one date format on every page (fmt.js)

  /* events: [{ts, kind, code, message, gpu_uuid, gpu_index, node?}]; opts: { id, gpuColumn,
   * nodeColumn, empty } */
  function table(events, opts = {}) {
    const { h } = window.gpufleetDom;
    if (!events.length) return h("p", { class: "muted", id: opts.id || null }, opts.empty || "No events.");
    const cols = [
      ["Time", (e) => when(e.ts)],
      opts.nodeColumn ? ["Node", (e) => e.node ?? dash] : null,
      opts.gpuColumn === false ? null : ["GPU", (e) => (e.gpu_uuid ? h("a", { href: `/gpus/${encodeURIComponent(e.gpu_uuid)}`, title: e.gpu_uuid }, `GPU ${e.gpu_index ?? "?"}`) : "node")],
      ["Event", (e) => h("span", { class: `evk evk-${e.kind}` }, short(e))],
      ["Meaning (NVIDIA)", (e) => describe(e)],
      ["Whose", (e) => (decoded(e) ? decoded(e).origin : dash)],
      ["First action", (e) => (decoded(e) ? decoded(e).action : dash)],
      ["Message", (e) => e.message || dash],
    ].filter(Boolean);
    return h("div", { class: "tw" }, h("table", { class: "events", id: opts.id || null },
      h("thead", {}, h("tr", {}, cols.map(([l]) => h("th", {}, l)))),
      h("tbody", {}, events.map((e) => h("tr", { "data-kind": e.kind, "data-code": e.code ?? "" },
        cols.map(([l, get]) => h("td", { class: l === "Meaning (NVIDIA)" || l === "Message" ? "wrap" : "" }, get(e))))))));
  }

  window.gpufleetEvents = { short, describe, table };
})();
