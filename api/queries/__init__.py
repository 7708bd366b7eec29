"""Read-side queries behind the REST API and dashboard: plain functions of (engine, args)
returning dicts/lists, so handlers stay thin and the bench can call them directly."""
