// On every dashboard page: who is signed in (GET /api/v1/auth/me), a sign-out button, a redirect
// to /signin when nobody is, and the CSRF header for changes. Elements marked
// data-needs="silence" (operator) or data-needs="tokens" (admin) are removed for roles that may
// not use them: the same rule the API enforces, so the UI never offers what would be refused.
"use strict";
(function () {
  const csrf = () => {
    const m = document.cookie.match(/(?:^|;\s*)gpufleet_csrf=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  };
  // fetch with the session's CSRF token on state-changing requests
  window.gpufleetFetch = (path, opts = {}) => {
    const method = (opts.method || "GET").toUpperCase();
    const headers = Object.assign({ Accept: "application/json" }, opts.headers || {});
    if (!["GET", "HEAD", "OPTIONS"].includes(method)) headers["X-CSRF-Token"] = csrf();
    return fetch(path, Object.assign({}, opts, { method, headers, credentials: "same-origin" }));
  };
  // Run fn with the session now if it is known, else when it is. A page's own script loads after
  // this one, and /api/v1/auth/me can answer before that script has run (a slow static fetch, a
  // busy box): a plain listener would then miss the one event and the page never load.
  window.gpufleetOnSession = (fn) => {
    if (window.gpufleetSession) fn(window.gpufleetSession);
    else document.addEventListener("gpufleet:session", (ev) => fn(ev.detail), { once: true });
  };
  function apply(me) {
    window.gpufleetSession = me;
    document.documentElement.dataset.role = me.role;
    for (const el of document.querySelectorAll("[data-needs]")) {
      if (!me.can[el.dataset.needs]) el.remove();
    }
    const header = document.querySelector("header");
    if (!header) return;
    const box = document.createElement("span");
    box.id = "who";
    box.className = "muted";
    box.textContent = `${me.name} (${me.role})`;
    if (!document.getElementById("status")) box.style.marginLeft = "auto"; // pages without the status slot
    if (me.source !== "anonymous") {
      const out = document.createElement("button");
      out.id = "signout";
      out.type = "button";
      out.textContent = "Sign out";
      out.addEventListener("click", async () => {
        await window.gpufleetFetch("/api/v1/auth/signout", { method: "POST" });
        location.assign("/signin");
      });
      box.append(" ", out);
    }
    header.append(box);
    document.dispatchEvent(new CustomEvent("gpufleet:session", { detail: me }));
  }
  fetch("/api/v1/auth/me", { headers: { Accept: "application/json" }, credentials: "same-origin" }).then(async (r) => {
    if (r.status === 401) {
      location.assign(`/signin?next=${encodeURIComponent(location.pathname + location.search)}`);
      return;
    }
    if (r.ok) apply(await r.json());
  });
})();
