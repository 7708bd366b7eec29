/* The header's search box on every page: a job id, node name, GPU UUID or user goes straight
 * to its page (GET /web/search answers exact matches); several matches are listed, none is
 * said. Nodes are built with textContent only. */
(function () {
  "use strict";
  const header = document.querySelector("header");
  if (!header) return;
  const form = document.createElement("form");
  form.id = "search";
  form.setAttribute("role", "search");
  const input = document.createElement("input");
  input.type = "search";
  input.name = "q";
  input.placeholder = "job id, user, node, GPU UUID";
  input.setAttribute("aria-label", "search jobs, users, nodes");
  input.maxLength = 255;
  const out = document.createElement("div");
  out.id = "search-results";
  out.hidden = true;
  form.append(input, out);
  const status = document.getElementById("status");
  header.insertBefore(form, status || null);

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const q = input.value.trim();
    if (!q) return;
    let r;
    try {
      const resp = await fetch(`/web/search?${new URLSearchParams({ q })}`, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      r = await resp.json();
      if (!resp.ok) throw new Error(r.detail || `HTTP ${resp.status}`);
    } catch (e) {
      out.hidden = false;
      out.textContent = `search failed: ${e.message || e}`;
      return;
    }
    if (r.href) { location.href = r.href; return; }
    out.replaceChildren();
    out.hidden = false;
    if (!r.matches.length) { out.textContent = `nothing named “${q}”: a job id, user, node or GPU UUID, exactly`; return; }
    for (const m of r.matches) {
      const a = document.createElement("a");
      a.href = m.href;
      a.textContent = m.label;
      out.append(a);
    }
  });
  document.addEventListener("click", (e) => { if (!form.contains(e.target)) out.hidden = true; });
})();
