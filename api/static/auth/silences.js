// Silences page: list (viewer), create and expire (operator). Changes go through
// window.gpufleetFetch, which adds the session's CSRF token. Every value is set as text.
"use strict";
// local time, YYYY-MM-DD HH:MM: the dashboard's one date format (api/static/fmt.js)
const localWhen = ((t) => { const d = new Date(t * 1000), p = (n) => String(n).padStart(2, "0"); return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}`; });
(function () {
  const tbody = document.querySelector("table.silences tbody");
  const err = document.getElementById("silence-error");
  const form = document.getElementById("silence-form");
  const detail = async (r) => {
    try { const j = await r.json(); return typeof j.detail === "string" ? j.detail : JSON.stringify(j.detail); }
    catch { return `${r.status} ${r.statusText}`; }
  };
  function cell(text) { const td = document.createElement("td"); td.textContent = text == null ? "" : String(text); return td; }
  async function load() {
    const r = await fetch("/api/v1/alerts/silences", { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!r.ok) { err.textContent = await detail(r); return; }
    const rows = await r.json();
    tbody.replaceChildren();
    const can = window.gpufleetSession && window.gpufleetSession.can.silence;
    for (const s of rows) {
      const tr = document.createElement("tr");
      tr.dataset.id = s.id;
      tr.append(cell(s.id), cell(s.job), cell(s.user), cell(s.kind), cell(s.cluster), cell(s.reason),
        cell(s.created_by), cell(localWhen(s.expires_at)));
      const td = document.createElement("td");
      if (can) {
        const b = document.createElement("button");
        b.type = "button"; b.className = "expire"; b.textContent = "Expire"; b.dataset.needs = "silence";
        b.addEventListener("click", async () => {
          const x = await window.gpufleetFetch(`/api/v1/alerts/silences/${s.id}`, { method: "DELETE" });
          if (!x.ok) err.textContent = await detail(x); else load();
        });
        td.append(b);
      }
      tr.append(td);
      tbody.append(tr);
    }
    document.getElementById("silences").dataset.loaded = String(rows.length);
  }
  if (form) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      err.textContent = "";
      const body = {};
      for (const [k, v] of new FormData(form).entries()) if (String(v).trim()) body[k] = String(v).trim();
      const r = await window.gpufleetFetch("/api/v1/alerts/silences", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
      if (!r.ok) { err.textContent = `Not silenced: ${await detail(r)}`; return; }
      form.reset();
      load();
    });
  }
  window.gpufleetOnSession(load);
})();
