"""A Celery worker that kills its own process once at a chosen point: the crash injection for the
end-to-end tests, kept out of the product (which offers only the hook lists it installs into).

    python tests/support/crash_worker.py analysis MARKER -- worker --beat ...
    python tests/support/crash_worker.py alerts:after_sent MARKER -- worker ...
    python tests/support/crash_worker.py analysis:record LOG analysis:stall MARKER -- worker ...

``analysis``: after the first analyzed job (``analysis.tasks.job_done_hooks``); ``alerts:STAGE``:
at that delivery stage (``alerts.tasks.delivery_hooks``). The marker file records the crash, so it
happens once: the process Celery starts in its place runs normally. ``analysis:stall``: after the
first analyzed job, write the marker and hang (for the test to SIGKILL the whole worker there);
``analysis:record``: append "pid job_pk" to the file after every analyzed job; ``progress:stall``
and ``progress:record`` the same after each job a progress shard synced. Several KIND MARKER
pairs may come before the ``--``. Settings come from the
environment the test gives this process (``make_celery(Settings.from_env())``)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def crash_once(marker: Path, what: str) -> None:
    if marker.exists():
        return
    marker.write_text(f"{what} {time.time()}")
    os._exit(1)  # no cleanup, no ack: what a SIGKILLed worker process leaves behind


def stall_once(marker: Path, what: str) -> None:
    if marker.exists():
        return
    marker.write_text(f"{what} {time.time()}")
    while True:  # holding the task (and its lock) until the test kills this worker
        time.sleep(1)


def record(log: Path, job_pk: int) -> None:
    with log.open("a") as fh:
        fh.write(f"{os.getpid()} {job_pk}\n")


def install(kind: str, marker: Path) -> None:
    if kind == "analysis":
        from gpufleet.analysis import tasks

        tasks.job_done_hooks.append(lambda job_pk: crash_once(marker, f"job {job_pk}"))
        return
    if kind in ("analysis:stall", "analysis:record", "progress:stall", "progress:record"):
        from gpufleet.analysis import tasks

        hooks = tasks.progress_done_hooks if kind.startswith("progress") else tasks.job_done_hooks
        if kind.endswith(":stall"):
            hooks.append(lambda job_pk: stall_once(marker, f"job {job_pk}"))
        else:
            hooks.append(lambda job_pk: record(marker, job_pk))
        return
    part, _, stage = kind.partition(":")
    if part != "alerts" or not stage:
        raise SystemExit(f"unknown crash point {kind!r}: use analysis or alerts:STAGE")
    from gpufleet.alerts import tasks as alert_tasks

    alert_tasks.delivery_hooks.append(lambda at: crash_once(marker, at) if at == stage else None)


def main(argv: list[str]) -> None:
    assert "--" in argv, "usage: crash_worker.py KIND MARKER [KIND MARKER ...] -- CELERY ARGS"
    cut = argv.index("--")
    points, celery_argv = argv[:cut], argv[cut + 1:]
    assert points and len(points) % 2 == 0, "usage: crash_worker.py KIND MARKER [KIND MARKER ...] -- CELERY ARGS"
    from gpufleet.celery_app import make_celery
    from gpufleet.settings import Settings

    app = make_celery(Settings.from_env())
    for kind, marker in zip(points[::2], points[1::2], strict=True):
        install(kind, Path(marker))
    app.worker_main(celery_argv)


if __name__ == "__main__":
    main(sys.argv[1:])
