/* XID decoding for the pages that show events: NVIDIA's meaning, the first action and whose
 * problem it usually is, from gpufleet/xid.toml (GET /web/xid). A code the table lacks says so
 * instead of guessing. window.gpufleetXid.ready resolves once the table is loaded (or failed:
 * then codes show undecoded, the page still draws). */
(function () {
  "use strict";
  let table = {};
  const ready = fetch("/web/xid", { headers: { Accept: "application/json" }, credentials: "same-origin" })
    .then((r) => (r.ok ? r.json() : { data: {} }))
    .then((j) => { table = j.data || {}; })
    .catch(() => {});

  function decode(code) {
    if (code === null || code === undefined) return null;
    return table[String(code)] || null;
  }

  // "XID 79: GPU has fallen off the bus · hardware · reboot the node"
  function describe(kind, code) {
    if (kind !== "xid" || code === null || code === undefined) return null;
    const d = decode(code);
    return d ? `XID ${code}: ${d.meaning} · ${d.origin} · ${d.action}` : `XID ${code} (not in gpufleet's table)`;
  }

  window.gpufleetXid = { ready, decode, describe };
})();
