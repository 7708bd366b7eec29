"""A scenario library of GPU workloads written from first principles, independent of
``agent/simulator.py``, and a runner that scores the goodput engine on it through the
product's public path (protocol batches / NDJSON -> storage -> ``run_analysis`` -> flags).

Modules: ``hardware`` (device specs), ``signals`` (per-second truth: activity, physics,
counters), ``render`` (sampling at an interval into catalog fields), ``model`` (job spec,
labels, registry), ``scenarios_*`` (the library), ``feed`` (into a database), ``score``
(precision/recall, pure), ``run`` (the command). See docs/evaluation.md."""
