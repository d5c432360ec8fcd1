"""The wake engine's planners (``aiogpu._wait._policy``): functions of numbers, tested without a
loop, a thread or a driver."""

from __future__ import annotations

import itertools
import random

import pytest

from aiogpu._wait import _policy

MODES = ("auto", "poll", "thread", "callback")


def test_a_long_precise_park_wakes_the_loop_warm_span_early_then_every_beat() -> None:
    span, beat = _policy.WARM_SPAN, _policy.WARM_BEAT
    now, wake_at = 0.0, 0.05
    beats = []
    while now < wake_at:
        now = _policy.warm_beat(now, wake_at)
        beats.append(now)
    assert beats[0] == pytest.approx(wake_at - span)
    assert beats[-1] == wake_at
    gaps = [later - earlier for earlier, later in itertools.pairwise(beats)]
    assert all(gap <= 1.5 * beat + 1e-12 for gap in gaps), gaps  # never a long sleep near the end
    assert all(gap >= beat - 1e-12 for gap in gaps[:-1]), gaps  # beats no closer than a beat
    assert gaps[-1] >= beat / 2 - 1e-12, gaps  # the last one is no sliver


def test_a_short_precise_park_wakes_the_loop_once_at_its_time() -> None:
    beat = _policy.WARM_BEAT
    assert _policy.warm_beat(1.0, 1.0 + beat) == 1.0 + beat
    assert _policy.warm_beat(1.0, 1.0 + 1.5 * beat) == 1.0 + 1.5 * beat
    assert _policy.warm_beat(1.0, 1.0) == 1.0


def test_warm_beats_follow_the_module_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_policy, "WARM_SPAN", 0.0)  # a benchmark switching the beats off
    assert _policy.warm_beat(0.0, 1.0) == 1.0


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


def _watch(mode: str, estimate: float, lateness: float) -> tuple[float, float]:
    """When the close watch of a head whose work started at 0 starts and ends."""
    watch_from, watch_until, *_ = _policy.plan_head(mode, 0.0, estimate, lateness, 0.0, False)  # type: ignore[arg-type]
    return watch_from, watch_until


def test_auto_starts_its_watch_earlier_by_its_lateness_up_to_a_share_of_the_work() -> None:
    lead, share = _policy.LEAD["auto"], _policy.LATENESS_SHARE
    assert _watch("auto", 10e-3, 0.0)[0] == pytest.approx(10e-3 - lead)
    assert _watch("auto", 10e-3, 100e-6)[0] == pytest.approx(10e-3 - lead - 100e-6)  # below the cap
    assert _watch("auto", 1e-3, 1e-3)[0] == pytest.approx(1e-3 - lead - share * 1e-3)  # capped
    for mode in ("poll", "thread", "callback"):
        assert _watch(mode, 10e-3, 1e-3)[0] == pytest.approx(10e-3 - _policy.LEAD[mode])  # lateness is auto's


def test_a_close_watch_goes_on_past_the_prediction_by_a_share_of_it_and_a_minimum() -> None:
    assert _watch("auto", 1e-6, 0.0)[1] == pytest.approx(1e-6 + _policy.WATCH_PAST_MIN)
    assert _watch("auto", 10e-3, 0.0)[1] == pytest.approx(10e-3 * (1 + _policy.WATCH_PAST_SHARE))


def test_the_planners_read_the_tunables_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(_policy.LEAD, "auto", 0.0)  # a benchmark switching a heuristic off
    monkeypatch.setattr(_policy, "LATENESS_SHARE", 0.0)
    assert _watch("auto", 10e-3, 1e-3)[0] == 10e-3


@pytest.mark.parametrize("mode", MODES)
def test_an_unpredicted_head_is_watched_from_now(mode: str) -> None:
    now = 5.0
    watch_from, watch_until, momentum, next_poll, backoff = _policy.plan_head(mode, 4.0, None, 0.0, now, False)  # type: ignore[arg-type]
    assert (watch_from, watch_until) == (now, now + _policy.WATCH_UNPREDICTED[mode])
    assert momentum == 0.0
    assert backoff == _policy.COLD_POLL[mode][0]
    assert next_poll == watch_until + backoff  # the back-off starts once the watch is over


def test_a_predicted_head_is_watched_around_its_predicted_completion() -> None:
    start, estimate, lateness, now = 1.0, 5e-3, 300e-6, 1.001
    watch_from, watch_until, momentum, next_poll, backoff = _policy.plan_head("auto", start, estimate, lateness, now, False)
    expected = start + estimate
    assert watch_from == pytest.approx(expected - _policy.LEAD["auto"] - lateness)
    assert watch_until == pytest.approx(expected + _policy.WATCH_PAST_SHARE * estimate)
    assert momentum == 0.0
    assert next_poll == pytest.approx(watch_until + backoff)


def test_a_head_after_progress_is_watched_a_while_whatever_the_prediction() -> None:
    now = 2.0
    watch_from, watch_until, momentum, next_poll, backoff = _policy.plan_head("auto", 1.99, 1.0, 0.0, now, True)
    assert watch_from > now + 0.5  # the prediction alone would park it
    assert momentum == now + _policy.WATCH_AFTER_PROGRESS["auto"]
    assert next_poll == pytest.approx(max(watch_until, momentum) + backoff)
    _, _, momentum, _, _ = _policy.plan_head("thread", 1.99, 1.0, 0.0, now, True)
    assert momentum == now  # ``thread`` never watches on the loop


def test_before_a_predicted_watch_a_back_off_query_comes_first_unless_it_could_delay_the_watch() -> None:
    slack = _policy.EARLY_POLL_SLACK
    assert _policy.early_look(1.0, 1.0 + 2 * slack, "auto") == (1.0, False)
    assert _policy.early_look(1.0, 1.0 + slack / 2, "auto") == (1.0 + slack / 2, True)  # precisely
    assert _policy.early_look(1.0, 1.0 + slack / 2, "poll") == (1.0 + slack / 2, False)  # loop timers only


def test_a_loop_is_busy_from_the_share_of_its_time_it_ran() -> None:
    share = _policy.BUSY_SHARE
    assert _policy.loop_was_busy(0.010, 0.010 * share)
    assert not _policy.loop_was_busy(0.010, 0.010 * share * 0.9)
    assert not _policy.loop_was_busy(0.0, 0.0)  # no time passed: nothing to say


def test_a_head_queued_behind_earlier_work_is_looked_at_once_a_slack_after_its_prediction() -> None:
    share, most = _policy.QUEUED_SLACK_SHARE, _policy.QUEUED_SLACK_MAX
    queued = 2 * _policy.LEAD["auto"] / share  # a slack of twice the lead, below the cap
    assert share * queued < most
    watch_from, watch_until, _, next_poll, backoff = _policy.plan_head("auto", 1.0, 5e-3, 0.0, 1.0, False, queued=queued)
    assert watch_from == watch_until == pytest.approx(1.0 + 5e-3 + share * queued)  # no close watch
    assert backoff == max(_policy.COLD_POLL["auto"][0], share * queued)
    assert next_poll == pytest.approx(watch_until + backoff)
    far_behind = _policy.plan_head("auto", 1.0, 5e-3, 0.0, 1.0, False, queued=100 * most / share)
    assert far_behind[0] == pytest.approx(1.0 + 5e-3 + most)  # the slack's cap


def test_a_head_queued_too_briefly_for_its_slack_to_pass_the_lead_keeps_its_close_watch() -> None:
    for mode in ("auto", "poll", "thread"):
        queued = 0.5 * _policy.LEAD[mode] / _policy.QUEUED_SLACK_SHARE  # type: ignore[index]
        queued_watch = _policy.plan_head(mode, 1.0, 5e-3, 0.0, 1.0, False, queued=queued)  # type: ignore[arg-type]
        lone_watch = _policy.plan_head(mode, 1.0, 5e-3, 0.0, 1.0, False)  # type: ignore[arg-type]
        assert queued_watch == lone_watch
        assert lone_watch[0] < 1.0 + 5e-3 < lone_watch[1]  # closely, around the prediction
