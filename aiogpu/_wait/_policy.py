"""The wake engine's tuning: every table and constant, and the pure planners that read them.

Rules this file keeps:

1. Policy is pure: each planner is a function of numbers (times in ``time.perf_counter()``
   seconds, a strategy name), with no loop, thread, driver or queue in sight, so it is tested
   on its own (``tests/test_policy.py``). The watcher only executes its plans.
2. Every tunable is a module attribute, read through the module at call time
   (``_policy.IDLE_SPIN``, or bound inside a function), never imported by name elsewhere: a
   benchmark or a test switches a heuristic off by setting the attribute here.
3. Each heuristic earns its place by measurement (``benchmarks/wake.py``, old against new;
   ``benchmarks/ablation.py`` switches each off in turn); the comment on each table says what
   it trades.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._strategy import WaitStrategy

#: After a wait starts with nothing predicted: how long to watch closely before parking.
WATCH_UNPREDICTED = {"auto": 100e-6, "poll": 2e-3, "thread": 0.0, "callback": 0.0}
#: How long before the predicted completion close watching starts (covers wake-up jitter:
#: the timer thread's ~50-100 µs, the loop timers' ~1 ms).
LEAD = {"auto": 250e-6, "poll": 1.5e-3, "thread": 150e-6, "callback": 0.0}
#: On longer predictions the watch starts earlier still: ``LEAD_SHARE`` of the prediction, at most
#: ``LEAD_MAX``, where that is more than ``LEAD``. A loop thread woken from a sleep of milliseconds
#: sometimes runs hundreds of µs late, and those wake-ups set a long wait's p99
#: (``benchmarks/results/engine_compare.md``); the watch they buy costs CPU in proportion.
LEAD_SHARE = {"auto": 0.1, "poll": 0.0, "thread": 0.0, "callback": 0.0}
LEAD_MAX = 0.5e-3
#: Parked queues are queried at least this often (first, then doubling to the cap). For
#: ``callback`` this is the watchdog: host functions never run after a sticky context error.
COLD_POLL = {"auto": (1e-3, 10e-3), "poll": (0.25e-3, 2e-3), "thread": (1e-3, 10e-3), "callback": (1e-3, 10e-3)}
#: Each back-off interval is stretched or shrunk at random by up to this share, so that a wait
#: left pending does not wake the loop in lockstep with another periodic timer. Without it,
#: anyio's ``wait_all_tasks_blocked`` (which looks every 100 ms, the loop waking on whole
#: milliseconds) can find the watcher just woken, poll after poll, for seconds on end.
COLD_POLL_JITTER = 0.2
#: A back-off query before a predicted completion is made only this long before the close watch
#: at the latest: the loop's timers fire late (asyncio rounds a timeout up to whole ms), and one
#: that fires past the watch's start delays the wake-up by as much (``benchmarks/wake.py``'s p99).
EARLY_POLL_SLACK = 2e-3
#: A close watch goes on past the predicted completion for this share of the prediction, and
#: at least ``WATCH_PAST_MIN``, before the head parks again.
WATCH_PAST_SHARE = 0.25
WATCH_PAST_MIN = 100e-6

#: How ``auto`` watches a head whose completion is predicted (``auto_look``). Before its close
#: watch, it looks when ``EARLY_SHARE`` of the time left to the prediction has passed (at half the
#: prediction first, then at three quarters...; ``COLD_POLL``'s cap apart at most, in case the
#: prediction is far too long), on the loop's timers, until less than ``EARLY_UNTIL`` of the
#: prediction or ``EARLY_POLL_SLACK`` is left: work that ends early is noticed within that share of
#: how early it ended, or that much. From the close watch on, it queries at every beat while that
#: is precise enough, and otherwise spaces its queries by ``PRECISION`` of the prediction or, once
#: the prediction has passed, by ``OVERDUE_SPACING`` of the time the work is overdue (whichever is
#: longer, up to ``COLD_POLL``'s cap), parked precisely in between: work that ends late is noticed
#: within a tenth of how late it ended. A pause under ``SPACED_MIN`` is not worth a park. A long
#: wait so costs a few dozen queries however far its work runs from the prediction (work whose
#: length varies by milliseconds: two streams sharing the GPU), where a query every beat would keep
#: the loop busy for as long as the work outruns the prediction.
EARLY_SHARE = 0.5
EARLY_UNTIL = 0.05
PRECISION = 0.005
OVERDUE_SPACING = 0.1
SPACED_MIN = 50e-6
#: A wait that was queued behind other work on its stream before its own work began may be seen
#: done ``LATE_SHARE`` of that time late, ``LATE_MAX`` at most (``late_allowed``): ``auto`` starts
#: its close watch that much later (its lead covers less), spaces the watch's queries by that
#: much, on the loop's timers from ``LOOP_TIMER_SLACK`` on, instead of asking at every beat, and
#: does not look again at the next beat after a completion; ``thread``'s waiter thread spaces
#: its close watch's queries by that much instead of spinning, and does not rouse the loop
#: before the completion. Under a sustained load, where every stream keeps work queued, the
#: heads of many streams are in their close watch at once, and a query of each at every beat is
#: most of the loop's work (``auto``) or keeps a thread per stream spinning (``thread``); a wait
#: whose work began as it started is watched as closely as ever.
LATE_SHARE = {"auto": 0.01, "poll": 0.0, "thread": 0.01, "callback": 0.0}
LATE_MAX = 1e-3

#: ``auto`` parks the unpredicted heads of at most this many streams on its one waiter thread;
#: the others are queried on the back-off schedule (the thread's wake-up makes the loop sweep
#: them all). A round of queries costs a few µs a stream, up to a round a millisecond while the
#: work stays pending: the cap bounds that thread's CPU. One thread, not one per stream: work
#: released on many streams at once completes on several at once, and as many threads, each
#: seeing its own completion, fight the waking loop for the GIL and delay the first wake-up
#: (``benchmarks/wake.py``'s fan-outs time this path).
AUTO_WATCH_MAX = 16
#: Queues of streams with nothing pending kept for their next wait (a stream's queue holds its
#: predictor and when its last work finished).
KEEP_IDLE_QUEUES = 64

#: During a close watch, when the loop came back from a yield within ``IDLE_BEAT`` (nothing else
#: was ready to run), the head is queried again and again for up to ``IDLE_SPIN`` before the
#: next yield: a loop iteration costs a few µs (``select(0)`` and the loop's bookkeeping), which
#: a lone wait would otherwise add to its wake-up, half an iteration on average. Other tasks
#: wait at most ``IDLE_SPIN`` for their turn, and only when none was ready a moment ago.
IDLE_BEAT = 15e-6
IDLE_SPIN = 20e-6
#: A wait that starts while the watcher is idle, on a stream whose work is predicted to finish
#: within ``SPIN_AHEAD``, yields once (its checkpoint) and is then watched right there, query
#: after query until ``IDLE_SPIN`` past the prediction, instead of through an entry, a plan and
#: a first yield: for ~20 µs of work, setting those up costs more than the work has left.
SPIN_AHEAD = 50e-6
#: A sweep that has woken this many waiting tasks leaves the queues it has not reached for the
#: next beat (they go first then) and yields: the woken tasks run while the GPU finishes the
#: rest. Without it, a released fan-out of thousands of waits completes everything in one
#: sweep that lasts as long as the GPU work, and the first task resumes only after it.
#: Large enough that one sweep takes in several streams that a loop behind the GPU completes
#: whole: the more it takes in, the nearer the tasks it wakes oldest first lie to each other in
#: memory (``Sweep._wake_oldest_first``).
SWEEP_WAKE_BUDGET = 1024
#: The loop's own timers due within this while the watcher parks are kept on time
#: (``Watcher._keep_loop_timer``); one due later is at most a tenth of its wait late.
KEEP_TIMER_HORIZON = 10e-3
#: A kept timer's wake-up is asked for this long after it is due: asyncio runs a timer only once
#: its clock has reached it, and sleeps a whole millisecond more if woken a moment before.
KEEP_TIMER_MARGIN = 10e-6
#: A park on a loop timer asks to be woken this much later than it wants to look: the loop's
#: timers fire up to a whole millisecond late, and an application timer due before that is
#: kept on time (``Watcher._keep_loop_timer``).
LOOP_TIMER_SLACK = 1e-3
#: While the loop thread runs Python without a pause, a thread that saw a completion (a waiter
#: thread, the timer) waits for the GIL before it can poke the loop: up to the interpreter's
#: switch interval (5 ms by default), since the busy thread takes the GIL straight back after
#: each ``select(0)``; and a loop timer joins the ready queue behind the tasks already there. So
#: while ``auto`` waits are parked on a loop that was at least ``BUSY_SHARE`` busy, the loop
#: looks at them itself once per iteration (``_busy``), querying them at most every
#: ``BUSY_LOOK``; it stops once an iteration takes less than ``BUSY_MIN_ITERATION`` (a loop with
#: little else to do can sleep, and a sleeping loop lets a thread's poke in at once).
BUSY_SHARE = 0.5
BUSY_LOOK = 50e-6
BUSY_MIN_ITERATION = 30e-6


def back_off(now: float, backoff: float, mode: WaitStrategy) -> tuple[float, float]:
    """The next back-off query (``backoff`` from now, jittered by ``COLD_POLL_JITTER``) and
    the pause after it (doubled, up to ``mode``'s cap in ``COLD_POLL``)."""
    jitter = COLD_POLL_JITTER
    return now + backoff * random.uniform(1 - jitter, 1 + jitter), min(2 * backoff, COLD_POLL[mode][1])


def plan_head(
    mode: WaitStrategy, start: float, estimate: float | None, now: float, late: float = 0.0
) -> tuple[float, float, float, float]:
    """How to watch a stream's new oldest wait, whose work started at ``start`` and which may be
    seen done ``late`` late (``late_allowed``).

    Returns ``(watch_from, watch_until, next_poll, backoff)``: the close watch (from now when
    nothing is predicted; around the predicted completion otherwise), the first back-off query
    after it and the pause before it.

    A predicted watch starts ``LEAD`` before the predicted completion (``LEAD_SHARE`` of the
    prediction, up to ``LEAD_MAX``, where that is more), less the lateness allowed, and goes on
    past it by ``WATCH_PAST_SHARE`` of the prediction, at least ``WATCH_PAST_MIN``.
    Runs for every new head (written out: a call more is a share of a wait's cost).
    """
    backoff = COLD_POLL[mode][0]
    if estimate is None:
        watch_from, watch_until = now, now + WATCH_UNPREDICTED[mode]
    else:
        expected = start + estimate
        watch_from = expected - max(0.0, max(LEAD[mode], min(LEAD_SHARE[mode] * estimate, LEAD_MAX)) - late)
        watch_until = expected + max(WATCH_PAST_MIN, WATCH_PAST_SHARE * estimate)
    next_poll = max(now, watch_until) + backoff
    return watch_from, watch_until, next_poll, backoff


def late_allowed(queued: float, mode: WaitStrategy) -> float:
    """How late a ``mode`` wait queued for ``queued`` seconds before its work began may be seen done."""
    return min(LATE_SHARE[mode] * queued, LATE_MAX) if queued > 0 else 0.0


def auto_look(
    now: float, expected: float, estimate: float, watch: tuple[float, float], last_query: float, late: float = 0.0
) -> tuple[float, bool]:
    """When ``auto`` next queries a head predicted to take ``estimate`` and end at ``expected``
    (``<= now``: at every beat from now on) and whether precisely (else on a loop timer, which
    may fire up to ``LOOP_TIMER_SLACK`` off). ``watch`` is its close watch (``plan_head``);
    ``last_query`` when it was last seen pending (the head's start at the earliest); ``late``
    how late it may be seen done (``late_allowed``)."""
    watch_from, watch_until = watch
    precisely = late < LOOP_TIMER_SLACK
    if now < watch_from:
        look = last_query + min(EARLY_SHARE * (expected - last_query), COLD_POLL["auto"][1])
        if expected - look < max(EARLY_UNTIL * estimate, EARLY_POLL_SLACK) or watch_from - look < SPACED_MIN:
            return watch_from, precisely
        return look, precisely and look + EARLY_POLL_SLACK >= watch_from  # a late loop timer must not delay the watch
    pause = max(PRECISION * estimate, OVERDUE_SPACING * (now - expected), late)
    if pause < SPACED_MIN:
        if now <= watch_until:
            return now, True
        pause = SPACED_MIN
    return last_query + min(pause, COLD_POLL["auto"][1]), precisely


def spaced_from(expected: float, estimate: float, watch_from: float, late: float = 0.0) -> float:
    """When ``auto_look`` starts to space the close watch's queries (its pause reaches
    ``SPACED_MIN``): a lone stream's close watch leaves its beats then."""
    if max(PRECISION * estimate, late) >= SPACED_MIN:
        return watch_from
    return expected + SPACED_MIN / OVERDUE_SPACING


def early_look(early_poll: float, watch_from: float) -> float:
    """Before a predicted ``poll`` head's close watch (on loop timers): when to look next. A
    back-off query (``early_poll``) comes first unless a late loop timer could then delay the
    watch (``EARLY_POLL_SLACK``); else the watch's start. (``auto``: ``auto_look``.)"""
    return early_poll if early_poll + EARLY_POLL_SLACK < watch_from else watch_from


def loop_was_busy(elapsed: float, cpu: float) -> bool:
    """Whether a loop thread that spent ``cpu`` seconds running in ``elapsed`` seconds was busy
    enough that other threads' pokes wait for the GIL (``BUSY_SHARE``)."""
    return elapsed > 0 and cpu >= BUSY_SHARE * elapsed
