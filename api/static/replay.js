/* "replaying history: N%": while `gpufleet up` replays its simulated past, a banner under the
 * header says how far it is, so the first seconds do not look like an empty, broken page.
 * Reads /web/replay (absent work = nothing shown); stops polling once the replay is done.
 * Nodes are built with textContent only. */
(function () {
  "use strict";
  const POLL_MS = 1000;
  let banner = null;

  function show(text, done) {
    if (!banner) {
      banner = document.createElement("div");
      banner.id = "replay";
      banner.setAttribute("role", "status");
      const header = document.querySelector("header");
      if (header && header.parentNode) header.parentNode.insertBefore(banner, header.nextSibling);
      else document.body.prepend(banner);
    }
    banner.textContent = text;
    banner.classList.toggle("done", !!done);
  }

  async function poll() {
    let s;
    try {
      const r = await fetch("/web/replay", { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (!r.ok) return; // an older server, or signed out: the page itself says so
      s = await r.json();
    } catch (e) {
      setTimeout(poll, POLL_MS * 5); // the server restarting: try again, quietly
      return;
    }
    if (s.active) {
      show(`replaying history: ${Math.floor(s.percent || 0)}% · charts and flags fill in as it lands`, false);
      setTimeout(poll, POLL_MS);
    } else if (banner) {
      show("history replayed · flags appear after the next analysis pass · reload to see them", true);
    }
  }
  poll();
})();
