"""Goodput from the job's own progress (docs/progress.md): pure functions over the 10 s
windows the agents' relays folded (``model``), the job's goodput/ETTR and badput by cause
(``goodput``), the findings (``detect``), and the thin database readers (``load``)."""
