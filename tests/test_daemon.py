"""The one helper every aiogpu thread goes through (``aiogpu._daemon``): threads start on
demand, run their jobs in order, outlive a job that raises, exit when idle, start again on the
next demand, and a forked child starts without the parent's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

from aiogpu import _daemon
from aiogpu._daemon import Daemon, Executor
from aiogpu._wait import _timer

TIMEOUT = 20.0


def threads_named(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == name]


def run_on(executor: Executor) -> threading.Thread:
    """Run a job on ``executor``; return the thread that ran it."""
    ran: list[threading.Thread] = []
    done = threading.Event()
    executor.submit(lambda: (ran.append(threading.current_thread()), done.set()))
    assert done.wait(TIMEOUT)
    return ran[0]


def test_an_idle_thread_exits_and_the_next_job_starts_another() -> None:
    executor = Executor("aiogpu-test-idle", idle_seconds=0.05)
    assert not threads_named("aiogpu-test-idle")  # made, not started: no job yet
    first = run_on(executor)
    assert first.name == "aiogpu-test-idle" and first.daemon
    first.join(TIMEOUT)  # nothing more to do: it exits
    assert not first.is_alive()
    assert executor._daemon.threads == 0 and not threads_named("aiogpu-test-idle")
    second = run_on(executor)
    assert second is not first and second.name == "aiogpu-test-idle"
    second.join(TIMEOUT)
    assert not second.is_alive()


def test_jobs_run_in_order_on_one_thread() -> None:
    executor = Executor("aiogpu-test-order")
    started, release = threading.Event(), threading.Event()
    order: list[int] = []
    threads: set[threading.Thread] = set()
    executor.submit(lambda: (started.set(), release.wait(TIMEOUT)))
    assert started.wait(TIMEOUT)
    for index in range(20):  # queued behind the blocked job
        executor.submit(lambda index=index: (order.append(index), threads.add(threading.current_thread())))
    release.set()
    run_on(executor)
    assert order == list(range(20)) and len(threads) == 1
    executor._daemon.stop_idle(lambda: executor._daemon.threads == 0, TIMEOUT)


def test_a_job_that_raises_is_reported_and_the_thread_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", reported.append)
    executor = Executor("aiogpu-test-raises")

    def fails() -> None:
        raise ValueError("a bug in a job")

    executor.submit(fails)
    after = run_on(executor)
    assert [(args.exc_type, str(args.exc_value), args.thread) for args in reported] == [(ValueError, "a bug in a job", after)]
    assert after.is_alive() and executor._daemon.threads == 1
    executor._daemon.stop_idle(lambda: executor._daemon.threads == 0, TIMEOUT)


def test_a_timer_callback_that_raises_does_not_stop_later_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", reported.append)
    timer = _timer.Timer()
    fired = threading.Event()

    def fails() -> None:
        raise RuntimeError("a bug in a callback")

    timer.call_at(0.0, fails)
    cancelled = timer.call_at(0.0, fired.set)
    timer.cancel(cancelled)
    timer.call_at(0.0, fired.set)
    assert fired.wait(TIMEOUT)
    assert [args.exc_type for args in reported] == [RuntimeError]
    timer._daemon.stop_idle(lambda: timer._daemon.threads == 0, TIMEOUT)


def test_numbered_threads_up_to_the_owners_bound_and_stop_idle() -> None:
    release = threading.Event()
    jobs: list[object] = [lambda: release.wait(TIMEOUT)] * 3
    daemon = Daemon("aiogpu-test-pool", lambda: jobs.pop() if jobs else None, numbered=True)
    with daemon.lock:
        for _ in range(3):
            daemon.start()
    assert sorted(thread.name for thread in threading.enumerate() if thread.name.startswith("aiogpu-test-pool-")) == [
        "aiogpu-test-pool-1",
        "aiogpu-test-pool-2",
        "aiogpu-test-pool-3",
    ]
    release.set()
    assert daemon.stop_idle(lambda: daemon.threads == 0, TIMEOUT)  # without waiting out idle_seconds
    assert daemon.waiting == 0


def test_a_float_from_take_is_a_wait_that_wake_cuts_short() -> None:
    # The timer's shape: a job once its deadline comes, or sooner if woken with a new one.
    state: dict[str, Any] = {"delay": TIMEOUT * 10, "job": None}
    ran, deadline_given = threading.Event(), threading.Event()

    def take() -> Any:
        if state["job"] is not None:
            job, state["job"] = state["job"], None
            return job
        deadline_given.set()
        return state["delay"]

    daemon = Daemon("aiogpu-test-deadline", take)
    with daemon.lock:
        daemon.wake()  # starts it: it waits for the far deadline
    assert deadline_given.wait(TIMEOUT)
    with daemon.lock:  # held: the thread is in its wait (it gave the deadline under the lock)
        assert daemon.waiting == 1
        state["job"] = ran.set
        daemon.wake()
    assert ran.wait(TIMEOUT)
    with daemon.lock:
        state["delay"] = None  # nothing more: idle
    assert daemon.stop_idle(lambda: daemon.threads == 0, TIMEOUT)


def test_precise_sleeps_set_the_timer_slack() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("timer slack is a Linux setting")
    import ctypes

    slack: list[int] = []
    executor = Executor("aiogpu-test-slack")
    executor._daemon._precise = True
    done = threading.Event()
    executor.submit(lambda: (slack.append(ctypes.CDLL(None).prctl(30, 0, 0, 0, 0)), done.set()))
    assert done.wait(TIMEOUT)
    assert slack == [_daemon.TIMER_SLACK_NS]
    executor._daemon.stop_idle(lambda: executor._daemon.threads == 0, TIMEOUT)


@pytest.mark.slow
def test_a_forked_child_starts_its_own_threads_not_the_parents() -> None:
    script = textwrap.dedent(
        """
        import os, threading
        from aiogpu._daemon import Executor
        from aiogpu._per_process import PerProcess

        executor = PerProcess(lambda: Executor("aiogpu-test-fork")).get
        parent = executor()
        started, release = threading.Event(), threading.Event()
        parent.submit(lambda: (started.set(), release.wait(20)))
        assert started.wait(20)              # the parent's thread is busy as it forks
        pid = os.fork()
        if pid == 0:
            child = executor()
            ok = child is not parent and child._daemon.threads == 0
            ran = threading.Event()
            child.submit(ran.set)            # the child's own thread runs it
            ok = ok and ran.wait(20)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        release.set()
        print(os.waitstatus_to_exitcode(status))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
