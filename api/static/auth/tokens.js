// Tokens page (admin): list, create (the raw value is shown once), revoke. Non-admins get the
// page without its section (session.js removes data-needs="tokens") and a line saying why.
"use strict";
(function () {
  const err = () => document.getElementById("token-error");
  const detail = async (r) => {
    try { const j = await r.json(); return typeof j.detail === "string" ? j.detail : JSON.stringify(j.detail); }
    catch { return `${r.status} ${r.statusText}`; }
  };
  // local time, YYYY-MM-DD HH:MM: the dashboard's one date format (api/static/fmt.js)
  const when = (t) => (t ? ((t) => { const d = new Date(t * 1000), p = (n) => String(n).padStart(2, "0"); return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}`; })(t) : "");
  function cell(text) { const td = document.createElement("td"); td.textContent = text == null ? "" : String(text); return td; }
  async function load() {
    const tbody = document.querySelector("table.tokens tbody");
    const r = await fetch("/api/v1/tokens", { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!r.ok) { err().textContent = await detail(r); return; }
    const rows = await r.json();
    tbody.replaceChildren();
    for (const t of rows) {
      const tr = document.createElement("tr");
      tr.append(cell(t.name), cell(t.role), cell(t.cluster), cell(t.node), cell(when(t.created_at)), cell(when(t.revoked_at)));
      const td = document.createElement("td");
      if (!t.revoked_at) {
        const b = document.createElement("button");
        b.type = "button"; b.className = "revoke"; b.textContent = "Revoke";
        b.addEventListener("click", async () => {
          const x = await window.gpufleetFetch(`/api/v1/tokens/${encodeURIComponent(t.name)}`, { method: "DELETE" });
          if (!x.ok) err().textContent = await detail(x); else load();
        });
        td.append(b);
      }
      tr.append(td);
      tbody.append(tr);
    }
    document.getElementById("tokens").dataset.loaded = String(rows.length);
  }
  window.gpufleetOnSession((me) => {
    if (!me.can.tokens) { document.getElementById("tokens-denied").hidden = false; return; }
    const form = document.getElementById("token-form");
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      err().textContent = "";
      const body = {};
      for (const [k, v] of new FormData(form).entries()) if (String(v).trim()) body[k] = String(v).trim();
      const r = await window.gpufleetFetch("/api/v1/tokens", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
      if (!r.ok) { err().textContent = `Not created: ${await detail(r)}`; return; }
      const t = await r.json();
      document.getElementById("token-new").textContent = `Token for ${t.name} (shown once): ${t.token}`;
      form.reset();
      load();
    });
    load();
  });
})();
