// Sign-in page: exchange a token for a session cookie (POST /api/v1/auth/signin), then go back
// to the page that sent us here. The token never goes into storage or the URL.
"use strict";
(function () {
  const main = document.getElementById("signin");
  const form = document.getElementById("signin-form");
  const err = document.getElementById("signin-error");
  const next = main.dataset.next || "/";
  // The server already checked next (api/auth/redirects.py); this is the same rule again, in the
  // browser's own URL parser: a path whose resolved origin is this page's, else "/".
  function sameOrigin(target) {
    if (!target.startsWith("/") || target.startsWith("//") || /[\u0000-\u0020\u007f\\]/.test(target)) return "/";
    try {
      const u = new URL(target, location.origin);
      return u.origin === location.origin ? u.pathname + u.search + u.hash : "/";
    } catch { return "/"; }
  }
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    const token = document.getElementById("token").value.trim();
    try {
      const r = await fetch("/api/v1/auth/signin", {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ token }),
      });
      if (!r.ok) {
        let detail = `${r.status} ${r.statusText}`;
        try { const j = await r.json(); if (j.detail) detail = typeof j.detail === "string" ? j.detail : JSON.stringify(j.detail); } catch { /* not JSON */ }
        err.textContent = `Sign-in failed: ${detail}`;
        return;
      }
      location.assign(sameOrigin(next));
    } catch (e) {
      err.textContent = `Sign-in failed: ${e.message}`;
    }
  });
})();
