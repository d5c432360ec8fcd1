"""The wake engine's planners (``aiogpu._wait._policy``): functions of numbers, tested without a
loop, a thread or a driver."""

from __future__ import annotations

import random

import pytest

from aiogpu._wait import _policy

MODES = ("auto", "poll", "thread", "callback")


@pytest.mark.parametrize("mode", MODES)
def test_back_off_doubles_to_its_cap_within_the_jitter(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_policy, "random", random.Random(1234))
    first, cap = _policy.COLD_POLL[mode]
    jitter = _policy.COLD_POLL_JITTER
    now, backoff, pauses = 10.0, first, []
    for _ in range(12):
        at, following = _policy.back_off(now, backoff, mode)  # type: ignore[arg-type]
        assert now + backoff * (1 - jitter) <= at <= now + backoff * (1 + jitter), (at, now, backoff)
        assert following == min(2 * backoff, cap)
        pauses.append(at - now)
        now, backoff = at, following
    assert backoff == cap
    assert len({round(pause / first, 6) for pause in pauses}) > 3, "the pauses are not jittered"


def _watch(mode: str, estimate: float) -> tuple[float, float]:
    """When the close watch of a head whose work started at 0 starts and ends."""
    watch_from, watch_until, *_ = _policy.plan_head(mode, 0.0, estimate, 0.0)  # type: ignore[arg-type]
    return watch_from, watch_until


@pytest.mark.parametrize("mode", MODES)
def test_a_predicted_watch_starts_its_lead_before_the_prediction(mode: str) -> None:
    assert _watch(mode, 10e-3)[0] == pytest.approx(10e-3 - _policy.LEAD[mode])


def test_a_close_watch_goes_on_past_the_prediction_by_a_share_of_it_and_a_minimum() -> None:
    assert _watch("auto", 1e-6)[1] == pytest.approx(1e-6 + _policy.WATCH_PAST_MIN)
    assert _watch("auto", 10e-3)[1] == pytest.approx(10e-3 * (1 + _policy.WATCH_PAST_SHARE))


def test_the_planners_read_the_tunables_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(_policy.LEAD, "auto", 0.0)  # a benchmark switching a heuristic off
    assert _watch("auto", 10e-3)[0] == 10e-3


@pytest.mark.parametrize("mode", MODES)
def test_an_unpredicted_head_is_watched_from_now(mode: str) -> None:
    now = 5.0
    watch_from, watch_until, next_poll, backoff = _policy.plan_head(mode, 4.0, None, now)  # type: ignore[arg-type]
    assert (watch_from, watch_until) == (now, now + _policy.WATCH_UNPREDICTED[mode])
    assert backoff == _policy.COLD_POLL[mode][0]
    assert next_poll == watch_until + backoff  # the back-off starts once the watch is over


def test_a_predicted_head_is_watched_around_its_predicted_completion() -> None:
    start, estimate, now = 1.0, 5e-3, 1.001
    watch_from, watch_until, next_poll, backoff = _policy.plan_head("auto", start, estimate, now)
    expected = start + estimate
    assert watch_from == pytest.approx(expected - _policy.LEAD["auto"])
    assert watch_until == pytest.approx(expected + _policy.WATCH_PAST_SHARE * estimate)
    assert next_poll == pytest.approx(watch_until + backoff)


def test_a_head_predicted_far_ahead_is_parked_until_its_watch() -> None:
    now = 2.0
    watch_from, watch_until, next_poll, backoff = _policy.plan_head("auto", 1.99, 1.0, now)
    assert watch_from > now + 0.5  # nothing is watched closely before the prediction's lead
    assert next_poll == pytest.approx(watch_until + backoff)


def test_a_loop_is_busy_from_the_share_of_its_time_it_ran() -> None:
    share = _policy.BUSY_SHARE
    assert _policy.loop_was_busy(0.010, 0.010 * share)
    assert not _policy.loop_was_busy(0.010, 0.010 * share * 0.9)
    assert not _policy.loop_was_busy(0.0, 0.0)  # no time passed: nothing to say


def test_before_a_predicted_watch_a_back_off_query_comes_first_unless_it_could_delay_the_watch() -> None:
    slack = _policy.EARLY_POLL_SLACK
    assert _policy.early_look(1.0, 1.0 + 2 * slack, "auto") == (1.0, False)
    assert _policy.early_look(1.0, 1.0 + slack / 2, "auto") == (1.0 + slack / 2, True)  # precisely
    assert _policy.early_look(1.0, 1.0 + slack / 2, "poll") == (1.0 + slack / 2, False)  # loop timers only
