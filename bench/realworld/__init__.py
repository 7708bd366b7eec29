"""A scenario library of GPU workloads written from first principles, independent of
``agent/simulator.py``, and a runner that scores the goodput engine on it through the
product's public path (protocol batches / NDJSON -> storage -> ``run_analysis`` -> flags).

Modules: ``hardware`` (device specs), ``signals`` (per-second truth: activity, physics,
counters), ``render`` (sampling at an interval into catalog fields), ``model`` (job spec,
labels, registry), ``builders`` (slots, scheduler metadata, phase schedules, common levels),
``scenarios_*`` (the library; ``library`` imports them all), ``feed`` (into a database and
back), ``reference`` (the GPU_UTIL rules beside the engine), ``score`` (precision/recall and
checks, pure), ``run`` (the command). See docs/evaluation.md."""
