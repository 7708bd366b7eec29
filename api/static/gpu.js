/* The GPU page (/gpus/{uuid}): what the GPU does now, how often it was slowed in 24 h, which
 * jobs held it, and its XID / ECC / health events decoded with NVIDIA's meanings (xid.js).
 * app.js hands its helpers over (one DOM builder, one fetch wrapper, one number format). */
(function () {
  "use strict";
  window.gpufleetGpuPage = async function (t) {
    const { root, cfg, h, fill, api, table, kpi, when, pct, num, dash, enc, jobHref, nodeHref } = t;
    const g = await api(`/api/v1/gpus/${enc(cfg.args.uuid)}`);
    if (window.gpufleetXid) await window.gpufleetXid.ready;
    const c = g.current || null;
    const thr = g.throttle || null;
    const unit = (v, d, u) => (v === null || v === undefined ? dash : `${num(v, d)} ${u}`);
    const describe = (e) => (window.gpufleetXid && window.gpufleetXid.describe(e.kind, e.code)) || dash;
    const gib = (b) => (b ? `${(b / 2 ** 30).toFixed(0)} GiB` : dash);
    fill(root,
      h("h1", {}, `GPU ${g.index} on `, h("a", { href: nodeHref(g.cluster, g.node) }, g.node)),
      h("div", { class: "meta" },
        h("span", {}, "UUID ", h("b", { class: "uuid" }, g.uuid)),
        h("span", {}, "model ", h("b", {}, g.model ?? dash)),
        h("span", {}, "memory ", h("b", {}, gib(g.memory_total_bytes))),
        g.mig_profile ? h("span", {}, "MIG ", h("b", {}, g.mig_profile)) : null,
        g.parent_uuid ? h("span", {}, "parent ", h("a", { href: `/gpus/${enc(g.parent_uuid)}` }, g.parent_uuid)) : null,
        h("span", {}, "cluster ", h("b", {}, g.cluster)),
        h("span", {}, "last seen ", h("b", {}, when(g.last_seen)))),
      h("div", { class: "kpis" },
        kpi("SM active now", pct(c?.sm_active)),
        kpi("Tensor active now", pct(c?.tensor_active)),
        kpi("Power now", unit(c?.power_w, 0, "W")),
        kpi("Temperature now", unit(c?.temp_c, 0, "°C")),
        kpi("SM clock now", unit(c?.sm_clock_mhz, 0, "MHz")),
        kpi("Throttled 24 h", thr ? `${pct(thr.throttled_fraction)} (${thr.throttled_minutes} min)` : dash,
          "minutes slowed by power / thermal / hardware clock reasons"),
        kpi("Job now", g.job ? h("a", { href: jobHref(g.job.cluster, g.job.job_id) }, g.job.job_id) : "unallocated")),
      c && (c.clock_event_reasons || []).length
        ? h("p", {}, "Clock reasons now: ", c.clock_event_reasons.map((r) => h("span", { class: "chip" }, r))) : null,
      h("h2", {}, "Jobs on this GPU (newest first)"),
      g.jobs.length ? table([
        { label: "Job", get: (j) => h("a", { href: jobHref(j.cluster, j.job_id) }, j.job_id) },
        { label: "Name", get: (j) => h("span", { class: "trunc" }, j.name ?? "") },
        { label: "User", get: (j) => j.user ?? dash },
        { label: "From", get: (j) => when(j.start_ts) },
        { label: "Until", get: (j) => (j.end_ts ? when(j.end_ts) : "running") },
      ], g.jobs, { class: "gpujobs" }) : h("p", { class: "muted" }, "No job has held this GPU."),
      h("h2", {}, "XID / ECC / health events (7 days)"),
      g.events.length ? table([
        { label: "Time", get: (e) => when(e.ts) },
        { label: "Kind", get: (e) => e.kind },
        { label: "Code", n: true, get: (e) => e.code ?? dash },
        { label: "Meaning (NVIDIA)", wrap: true, get: describe },
        { label: "Message", wrap: true, get: (e) => e.message },
      ], g.events, { class: "events" }) : h("p", { class: "muted" }, "No events."));
  };
})();
