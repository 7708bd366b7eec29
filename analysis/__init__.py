"""gpufleet.analysis: the goodput engine (docs/goodput.md).

Public entry points: ``runner.run_analysis(engine, now=, job_pks=)`` (the DB wrapper),
``report.analyze(meta, features, histograms)`` (pure), ``features.minute_features`` (pure),
``config.load_thresholds()`` and the Celery tasks in ``tasks``."""
