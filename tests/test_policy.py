"""The wake engine's planners (``aiogpu._wait._policy``): functions of numbers, tested without a
loop, a thread or a driver."""

from __future__ import annotations

import itertools
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
    assert _watch(mode, 1e-3)[0] == pytest.approx(1e-3 - _policy.LEAD[mode])


@pytest.mark.parametrize("mode", MODES)
def test_a_long_prediction_is_watched_from_a_share_of_it_before_up_to_a_cap(mode: str) -> None:
    share, cap = _policy.LEAD_SHARE[mode], _policy.LEAD_MAX
    for estimate in (1e-3, 4e-3, 10e-3, 1.0):
        lead = max(_policy.LEAD[mode], min(share * estimate, cap))
        assert _watch(mode, estimate)[0] == pytest.approx(estimate - lead)
    if share:  # auto: a quarter of a millisecond before 2 ms of work, half a millisecond before 5 ms and 1 s
        assert [round(estimate - _watch(mode, estimate)[0], 6) for estimate in (2e-3, 5e-3, 1.0)] == [250e-6, 500e-6, cap]


def test_a_close_watch_goes_on_past_the_prediction_by_a_share_of_it_and_a_minimum() -> None:
    assert _watch("auto", 1e-6)[1] == pytest.approx(1e-6 + _policy.WATCH_PAST_MIN)
    assert _watch("auto", 10e-3)[1] == pytest.approx(10e-3 * (1 + _policy.WATCH_PAST_SHARE))


def test_the_planners_read_the_tunables_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(_policy.LEAD, "auto", 0.0)  # a benchmark switching a heuristic off
    monkeypatch.setitem(_policy.LEAD_SHARE, "auto", 0.0)
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
    assert watch_from == pytest.approx(expected - _policy.LEAD_MAX)  # a tenth of 5 ms, the cap
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


def test_before_a_predicted_poll_watch_a_back_off_query_comes_first_unless_it_could_delay_the_watch() -> None:
    slack = _policy.EARLY_POLL_SLACK
    assert _policy.early_look(1.0, 1.0 + 2 * slack) == 1.0
    assert _policy.early_look(1.0, 1.0 + slack / 2) == 1.0 + slack / 2


def _auto_looks(estimate: float, ends: float, beat: float = 1e-6) -> list[float]:
    """The times ``auto_look`` has a head queried whose work, started at 0 and predicted to take
    ``estimate``, ends at ``ends``: each query is made when due (at each beat when due now)."""
    watch = _watch("auto", estimate)
    now, last_query, looks = 0.0, 0.0, []
    while True:
        look, _ = _policy.auto_look(now, estimate, estimate, watch, last_query)
        now = max(look, now + beat)
        looks.append(now)
        if now >= ends:
            return looks
        last_query = now


def test_auto_looks_before_the_watch_at_halves_of_the_time_left_then_watches() -> None:
    estimate = 8e-3
    watch = _watch("auto", estimate)
    looks = _auto_looks(estimate, ends=estimate)
    # half the prediction, then half of what was left, until the slack of a loop timer is left
    assert looks[:3] == pytest.approx([4e-3, 6e-3, watch[0]])
    # on loop timers, but for the watch's start
    assert _policy.auto_look(0.0, estimate, estimate, watch, 0.0) == (4e-3, False)
    assert _policy.auto_look(4e-3, estimate, estimate, watch, 4e-3) == (6e-3, True)  # a late one would delay the watch
    assert _policy.auto_look(6e-3, estimate, estimate, watch, 6e-3) == (watch[0], True)
    long = 400e-3  # a twentieth of the prediction is more than the slack
    early = [look for look in _auto_looks(long, ends=long) if look < _watch("auto", long)[0]]
    assert long - early[-1] >= _policy.EARLY_UNTIL * long > long - (early[-1] + (long - early[-1]) / 2)


def test_auto_looks_no_further_apart_than_the_back_off_cap_before_the_watch() -> None:
    cap = _policy.COLD_POLL["auto"][1]
    looks = _auto_looks(1.0, ends=0.1)  # predicted far too long: the work ends at a tenth
    assert looks[0] == pytest.approx(cap)
    assert max(later - earlier for earlier, later in itertools.pairwise(looks)) <= cap + 1e-9
    assert looks[-1] - 0.1 <= cap


@pytest.mark.parametrize("estimate", [200e-6, 5e-3])
def test_short_work_is_watched_at_every_beat_around_its_prediction(estimate: float) -> None:
    watch_from, watch_until = _watch("auto", estimate)
    spaced_from = _policy.spaced_from(estimate, estimate, watch_from)
    assert spaced_from == estimate + _policy.SPACED_MIN / _policy.OVERDUE_SPACING
    beats_until = min(watch_until, spaced_from)  # then a query every SPACED_MIN at least
    for now in (watch_from, estimate, beats_until - 1e-6):
        assert _policy.auto_look(now, estimate, estimate, (watch_from, watch_until), last_query=now) == (now, True)
    after = beats_until + 1e-6
    assert _policy.auto_look(after, estimate, estimate, (watch_from, watch_until), last_query=after)[0] > after


def test_long_work_is_queried_a_share_of_the_prediction_apart_in_its_watch() -> None:
    estimate = 24e-3
    watch = _watch("auto", estimate)
    pause = _policy.PRECISION * estimate
    assert pause >= _policy.SPACED_MIN
    assert _policy.spaced_from(estimate, estimate, watch[0]) == watch[0]
    assert _policy.auto_look(watch[0], estimate, estimate, watch, last_query=watch[0]) == (pytest.approx(watch[0] + pause), True)


@pytest.mark.parametrize("overdue", [1e-3, 10e-3, 50e-3])
def test_overdue_work_is_queried_a_tenth_of_its_lateness_apart_up_to_the_cap(overdue: float) -> None:
    estimate = 24e-3
    now = estimate + overdue
    look, precisely = _policy.auto_look(now, estimate, estimate, _watch("auto", estimate), last_query=now)
    assert precisely
    expected_pause = min(max(_policy.OVERDUE_SPACING * overdue, _policy.PRECISION * estimate), _policy.COLD_POLL["auto"][1])
    assert look == pytest.approx(now + expected_pause)


@pytest.mark.parametrize("mode", ["auto", "thread"])
def test_a_wait_queued_behind_other_work_may_be_seen_done_a_share_of_that_time_late_up_to_a_cap(mode: str) -> None:
    assert _policy.late_allowed(0.0, mode) == 0.0  # its work began as it started: no lateness allowed
    assert _policy.late_allowed(-1e-3, mode) == 0.0  # (recorded after an earlier wait on the stream ended)
    assert _policy.LATE_SHARE[mode] > 0
    assert _policy.late_allowed(10e-3, mode) == pytest.approx(_policy.LATE_SHARE[mode] * 10e-3)
    assert _policy.late_allowed(10.0, mode) == _policy.LATE_MAX


@pytest.mark.parametrize("mode", ["poll", "callback"])
def test_strategies_that_do_not_space_their_queries_allow_no_lateness(mode: str) -> None:
    assert _policy.late_allowed(10.0, mode) == 0.0


@pytest.mark.parametrize("late", [100e-6, 1e-3])
def test_a_queued_wait_is_queried_its_allowed_lateness_apart_in_its_watch(late: float) -> None:
    estimate = 5e-3  # watched at every beat, were it not queued (``test_short_work_is_watched_at_every_beat...``)
    watch = _watch("auto", estimate)
    assert _policy.spaced_from(estimate, estimate, watch[0], late) == watch[0]  # no beats at all
    look, precisely = _policy.auto_look(watch[0], estimate, estimate, watch, watch[0], late)
    assert look == pytest.approx(watch[0] + late)
    assert precisely == (late < _policy.LOOP_TIMER_SLACK)  # a loop timer's lateness is within what is allowed
    before = _policy.auto_look(0.0, estimate, estimate, watch, 0.0, late)
    assert before[1] == (late < _policy.LOOP_TIMER_SLACK)
    overdue = estimate + 50e-3  # far overdue: spaced by a tenth of the lateness, as any wait
    assert _policy.auto_look(overdue, estimate, estimate, watch, overdue, late)[0] == pytest.approx(overdue + 5e-3)


def test_queued_waits_cost_a_few_queries_where_a_lone_one_is_asked_at_every_beat() -> None:
    estimate = 5e-3
    watch = _watch("auto", estimate)

    def looks(late: float) -> int:
        now, last_query, count = 0.0, 0.0, 0
        while now < estimate + 200e-6:  # the work ends a little late
            look, _ = _policy.auto_look(now, estimate, estimate, watch, last_query, late)
            now = last_query = max(look, now + 1e-6)
            count += 1
        return count

    assert looks(_policy.LATE_MAX) <= 3 < 100 < looks(0.0)


def test_work_far_behind_its_prediction_costs_queries_that_grow_with_the_log_of_its_lateness() -> None:
    estimate = 24e-3
    few = len(_auto_looks(estimate, ends=estimate + 5e-3))
    many = len(_auto_looks(estimate, ends=estimate + 50e-3))
    assert few < 40
    assert many < 2 * few
    # and it is noticed at most a tenth of its lateness (or the spacing in its watch) late
    for late in (2e-3, 5e-3, 20e-3):
        ends = estimate + late
        noticed = _auto_looks(estimate, ends=ends)[-1]
        assert noticed - ends <= max(_policy.OVERDUE_SPACING * (noticed - estimate), _policy.PRECISION * estimate) + 1e-9
