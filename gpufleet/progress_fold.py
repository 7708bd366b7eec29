"""Fold a process's progress events into 10 s windows (docs/progress.md, "Windows").

Standard library only: the node agent's relay and the client's http mode (hosts without an
agent) both use it. Input: the datagrams ``gpufleet.progress`` sends (a header naming the
stream, events with the sender's CLOCK_MONOTONIC times). Output: plain dicts shaped like
``protocol.ProgressWindow``, one per stream and 10 s of wall time.

Time accounting, per stream: every second after the process announced itself is either
productive step time, inside an outermost span of a kind, a stall (no step for far longer
than the stream's own step time, no span open), or unfinished (the part of a step the process
was in when it disappeared). The split happens as steps arrive: the gap since the previous
step, minus span time inside it, is that step's time.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

WINDOW_S = 10.0
CLOSE_GRACE_S = 1.5  # clients flush every 0.2 s: a window is complete this long after its end
EXPIRE_S = 10.0  # no datagram (heartbeats every 2 s) for this long: the process is gone
STALL_MIN_S = 30.0  # never call fewer seconds without a step a stall
STALL_FACTOR = 10.0  # ... nor fewer than this many typical step times
FIRST_STEP_LIMIT_S = 300.0  # before any step (no span open): setup this long is a stall
MAX_EVENTS_PER_WINDOW = 20
MAX_STREAMS = 4096
MAX_TIMES_PER_WINDOW = 4096  # step times kept for a window's quantiles (the histogram counts them all)
# A stream's clock moving on this far in one go is no training loop between datagrams (a relay
# started under a long-running process, a forged clock): the gap is unknown, not hours of empty
# windows. A process silent past the expiry resumes in Folder.feed instead.
MAX_ROLL_S = 600.0
HIST_BASE = 1.1  # step-time histogram buckets: 10% wide, mergeable across windows and ranks
_LOG_BASE = math.log(HIST_BASE)
# The buckets a step time can land in (1 us .. 1e7 s): what the intake stores and readers trust.
HIST_MIN_BUCKET = math.floor(math.log(1e-6) / _LOG_BASE)
HIST_MAX_BUCKET = math.floor(math.log(1e7) / _LOG_BASE)


def hist_bucket(seconds: float) -> int:
    return min(HIST_MAX_BUCKET, math.floor(math.log(min(max(seconds, 1e-6), 1e7)) / _LOG_BASE))


def hist_value(bucket: int) -> float:
    """The bucket's geometric middle, in seconds."""
    return float(HIST_BASE ** (bucket + 0.5))  # float ** float is typed Any (it may be complex)


def hist_quantile(hist: dict[int, int], q: float) -> float | None:
    n = sum(hist.values())
    if n == 0:
        return None
    target = q * (n - 1)
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen > target:
            return hist_value(b)
    return hist_value(max(hist))


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


class _Window:
    __slots__ = (
        "alive",
        "events",
        "events_dropped",
        "first_step",
        "hist",
        "last_step",
        "last_step_ts",
        "lost_steps",
        "max_step",
        "productive_s",
        "restarts",
        "samples",
        "span_counts",
        "spans",
        "stall_s",
        "start",
        "started",
        "steps",
        "times",
        "tokens",
        "unfinished_s",
    )

    def __init__(self, start: float) -> None:
        self.start = start
        self.steps = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.max_step: int | None = None
        self.restarts = 0
        self.lost_steps = 0
        self.tokens: int | None = None
        self.samples: int | None = None
        self.productive_s = 0.0
        self.stall_s = 0.0
        self.unfinished_s = 0.0
        self.spans: dict[str, float] = {}
        self.span_counts: dict[str, int] = {}
        self.times: list[float] = []
        self.hist: dict[int, int] = {}
        self.last_step_ts: float | None = None
        self.alive = False
        self.started: float | None = None
        self.events: list[dict[str, Any]] = []
        self.events_dropped = 0


class Stream:
    """One process (job, rank, host, pid): its clocks, its accounting, its open window."""

    def __init__(self, key: tuple[Any, ...], header: dict[str, Any], seen_mono: float) -> None:
        self.key = key
        self.wall0 = float(header["wall0"])
        self.mono0 = float(header["mono0"])
        self.ident: dict[str, Any] = dict(header.get("id") or {})
        self.meta: dict[str, Any] = dict(header.get("meta") or {})
        self.dropped = int(header.get("dropped") or 0)
        self.cursor = self.mono0  # everything before it is classified
        self.spans_since = 0.0  # outermost span seconds after the cursor
        self.depth: list[tuple[str, float]] = []
        self.recent: deque[float] = deque(maxlen=64)
        self.stalled = False
        self.max_step: int | None = None
        self.last_step_mono: float | None = None
        self.last_seen = seen_mono
        self.last_now = self.mono0  # the sender's clock in its latest datagram
        self.exited_at: float | None = None  # a clean exit: what follows the last step is teardown
        self.window = _Window(self.floor(self.wall0))
        self.window.started = self.wall0
        self.window.alive = True

    @staticmethod
    def floor(wall: float) -> float:
        return math.floor(wall / WINDOW_S) * WINDOW_S

    def wall(self, mono: float) -> float:
        return self.wall0 + (mono - self.mono0)

    def mono(self, wall: float) -> float:
        return self.mono0 + (wall - self.wall0)

    def typical_step(self) -> float | None:
        return _quantile(list(self.recent), 0.5) if self.recent else None

    def stall_limit(self) -> float:
        t = self.typical_step()
        return FIRST_STEP_LIMIT_S if t is None else max(STALL_MIN_S, STALL_FACTOR * t)

    # --- events ------------------------------------------------------------------------

    def roll_to(self, wall: float, out: list[dict[str, Any]]) -> None:
        """Close windows that end at or before ``wall`` (the stream's own time moved on)."""
        if wall - self.window.start > MAX_ROLL_S:
            end = self.window.start + WINDOW_S
            self._check_stall(self.mono(end))
            out.append(self.export(self.window, ended=False))
            self.window = _Window(self.floor(wall))
            self.cursor = max(self.cursor, self.mono(self.window.start))
            self.spans_since = 0.0
        while wall >= self.window.start + WINDOW_S:
            end = self.window.start + WINDOW_S
            self._check_stall(self.mono(end))
            out.append(self.export(self.window, ended=False))
            self.window = _Window(end)

    def _check_stall(self, at_mono: float) -> None:
        if self.depth:  # inside a span (a long checkpoint): not a stall
            return
        pending = at_mono - self.cursor - self.spans_since
        if pending > self.stall_limit():
            self.window.stall_s += pending
            self.cursor = at_mono
            self.spans_since = 0.0
            self.stalled = True

    def on_step(self, t: float, step: int, tokens: Any, samples: Any) -> None:
        w = self.window
        gap = max(0.0, t - self.cursor - self.spans_since)
        typical = self.typical_step()
        if self.stalled or gap > self.stall_limit():
            prod = min(gap, typical) if typical is not None else gap
            w.stall_s += gap - prod
            self.stalled = False
        else:
            prod = gap
        w.productive_s += prod
        if len(w.times) < MAX_TIMES_PER_WINDOW:
            w.times.append(prod)
        b = hist_bucket(prod)
        w.hist[b] = w.hist.get(b, 0) + 1
        self.recent.append(prod)
        w.steps += 1
        if isinstance(tokens, int) and tokens >= 0:
            w.tokens = (w.tokens or 0) + tokens
        if isinstance(samples, int) and samples >= 0:
            w.samples = (w.samples or 0) + samples
        if self.max_step is not None and step <= self.max_step:
            # The counter went back inside one process (an in-process restart from a checkpoint).
            w.restarts += 1
            w.lost_steps += self.max_step - step + 1
            self.max_step = step  # the counter restarts here: later steps are new work again
        else:
            self.max_step = step
        if w.first_step is None:
            w.first_step = step
        w.last_step = step
        w.max_step = step if w.max_step is None else max(w.max_step, step)
        w.last_step_ts = self.wall(t)
        self.last_step_mono = t
        self.cursor = t
        self.spans_since = 0.0

    def on_span_begin(self, t: float, kind: str) -> None:
        if len(self.depth) < 32:
            self.depth.append((kind, t))

    def on_span_end(self, t: float, kind: str, dur: float) -> None:
        for i in range(len(self.depth) - 1, -1, -1):
            if self.depth[i][0] == kind:
                del self.depth[i:]
                break
        if self.depth:  # nested: the outer span already accounts for this time
            return
        overlap = max(0.0, min(float(dur), t - self.cursor))
        self.spans_since += overlap
        w = self.window
        w.spans[kind] = w.spans.get(kind, 0.0) + overlap
        w.span_counts[kind] = w.span_counts.get(kind, 0) + 1

    def on_event(self, t: float, name: str, fields: Any) -> None:
        w = self.window
        if len(w.events) >= MAX_EVENTS_PER_WINDOW:
            w.events_dropped += 1
            return
        w.events.append({"ts": self.wall(t), "name": name, "fields": fields if isinstance(fields, dict) else {}})

    def finish(self) -> dict[str, Any]:
        """The process is gone: what it was doing since its last step did not complete."""
        seen = max(self.cursor, self.last_now)
        if self.depth:  # died inside a span: that span's time so far is its kind's
            kind, t0 = self.depth[0]
            d = max(0.0, seen - max(t0, self.cursor))
            self.window.spans[kind] = self.window.spans.get(kind, 0.0) + d
            self.spans_since += d
            self.depth = []
        pending = max(0.0, seen - self.cursor - self.spans_since)
        if self.exited_at is not None:  # a clean exit: nothing was lost, the process wound down
            self.window.spans["shutdown"] = self.window.spans.get("shutdown", 0.0) + pending
        elif pending > self.stall_limit():
            self.window.stall_s += pending
        else:
            self.window.unfinished_s += pending
        self.cursor = seen
        self.spans_since = 0.0
        return self.export(self.window, ended=True)

    def export(self, w: _Window, *, ended: bool) -> dict[str, Any]:
        ident = self.ident
        open_span = self.depth[0] if self.depth else None
        end = w.start + WINDOW_S
        end_mono = self.mono(end)
        since = None
        if self.last_step_mono is not None:
            since = max(0.0, end_mono - self.last_step_mono)
        return {
            "job_id": str(ident.get("job") or ""), "rank": int(ident.get("rank") or 0),
            "world_size": ident.get("world"), "local_rank": ident.get("local_rank"), "gpu": ident.get("gpu"),
            "host": ident.get("host"), "pid": int(self.key[-1]), "start": w.start, "end": end,
            "steps": w.steps, "first_step": w.first_step, "last_step": w.last_step, "max_step": w.max_step,
            "restarts": w.restarts, "lost_steps": w.lost_steps, "tokens": w.tokens, "samples": w.samples,
            "productive_s": w.productive_s, "stall_s": w.stall_s, "unfinished_s": w.unfinished_s,
            "spans": w.spans, "span_counts": w.span_counts,
            "step_time_p50_s": _quantile(w.times, 0.5), "step_time_p95_s": _quantile(w.times, 0.95),
            "step_time_max_s": max(w.times) if w.times else None,
            "step_hist": {str(k): v for k, v in sorted(w.hist.items())},
            "last_step_ts": w.last_step_ts, "since_step_s": since,
            "open_span": open_span[0] if open_span else None,
            "open_span_s": max(0.0, end_mono - open_span[1]) if open_span else None,
            "alive": w.alive and not ended, "ended": ended, "process_start": w.started,
            "flops_per_step": self.meta.get("flops_per_step"), "params": self.meta.get("params"),
            "dropped": self.dropped, "events": w.events, "events_dropped": w.events_dropped,
        }


class Folder:
    """All streams of a host. ``feed`` each datagram; ``close_due`` returns finished windows.
    Bounded: at most MAX_STREAMS streams (a new one beyond that is refused and counted)."""

    def __init__(self, expire_s: float = EXPIRE_S) -> None:
        self.expire_s = expire_s
        self.streams: dict[tuple[Any, ...], Stream] = {}
        self.expired: dict[tuple[Any, ...], Stream] = {}  # silent ones, in case they speak again
        self.ready: list[dict[str, Any]] = []
        self.refused = 0  # datagrams from streams beyond MAX_STREAMS
        self.bad = 0  # datagrams that were not progress datagrams

    def feed(self, msg: dict[str, Any], seen_mono: float) -> bool:
        try:
            ident = msg.get("id") or {}
            key = (ident.get("job"), ident.get("rank"), ident.get("host"), int(msg["pid"]))
            s = self.streams.get(key)
            if s is None and key in self.expired and abs(self.expired[key].mono0 - float(msg["mono0"])) <= 1e-6:
                # The same process, silent for a while (an import holding the GIL, a stopped
                # process resumed): it continues where its last window left off.
                s = self.streams[key] = self.expired.pop(key)
                s.window = _Window(max(s.window.start + WINDOW_S, s.floor(s.wall(float(msg.get("now") or s.cursor)))))
                s.window.alive = True
            if s is None or abs(s.mono0 - float(msg["mono0"])) > 1e-6:
                if s is not None:  # the pid was reused by a new process: the old one ended
                    self.ready.append(s.finish())
                elif len(self.streams) >= MAX_STREAMS:
                    self.refused += 1
                    return False
                s = self.streams[key] = Stream(key, msg, seen_mono)
            s.last_seen = seen_mono
            s.ident = dict(ident)
            s.meta = dict(msg.get("meta") or {})
            s.dropped = int(msg.get("dropped") or 0)
            now_c = float(msg.get("now") or s.cursor)
            for ev in msg.get("ev") or ():
                self._apply(s, ev)
            s.roll_to(s.wall(now_c), self.ready)
            s.window.alive = True
            s.last_now = max(s.last_now, now_c)
            return True
        except (KeyError, TypeError, ValueError, IndexError):
            self.bad += 1
            return False

    def _apply(self, s: Stream, ev: list[Any]) -> None:
        kind, t = ev[0], float(ev[1])
        s.roll_to(s.wall(t), self.ready)
        if kind == "s":
            s.on_step(t, int(ev[2]), ev[3] if len(ev) > 3 else None, ev[4] if len(ev) > 4 else None)
        elif kind == "b":
            s.on_span_begin(t, str(ev[2]))
        elif kind == "e":
            s.on_span_end(t, str(ev[2]), float(ev[3]))
        elif kind == "v":
            s.on_event(t, str(ev[2]), ev[3] if len(ev) > 3 else {})
        elif kind == "x":  # the process is exiting normally (atexit / shutdown())
            s.exited_at = t

    def close_due(self, now_wall: float, now_mono: float) -> list[dict[str, Any]]:
        """Windows complete by now (their end is CLOSE_GRACE_S past); streams that exited, or
        were silent for ``expire_s``, end with a final window."""
        for key, s in list(self.streams.items()):
            if now_mono - s.last_seen > self.expire_s or s.exited_at is not None:
                self.ready.append(s.finish())
                del self.streams[key]
                if s.exited_at is None:
                    self.expired[key] = s
                    while len(self.expired) > MAX_STREAMS:
                        self.expired.pop(next(iter(self.expired)))
                continue
            # one call: roll_to skips a gap past MAX_ROLL_S (a window per step of a stream whose
            # clock reads years ago would take the agent's loop that many iterations)
            s.roll_to(now_wall - CLOSE_GRACE_S, self.ready)
        out, self.ready = self.ready, []
        return out

    def close_all(self, now_wall: float, now_mono: float) -> list[dict[str, Any]]:
        """Shutting down: every open window goes now (streams that continue later resume in
        a new window; nothing is counted twice). A stream whose process said it exits ends
        here as ``close_due`` would end it: the HTTP sink closes right after the exit record,
        and a window sent as still alive would read as a rank that stopped stepping (hung)."""
        for key, s in list(self.streams.items()):
            if s.exited_at is not None:
                self.ready.append(s.finish())
                del self.streams[key]
                continue
            self.ready.append(s.export(s.window, ended=False))
            s.window = _Window(s.window.start + WINDOW_S)
        out, self.ready = self.ready, []
        return out
