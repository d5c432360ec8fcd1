"""Properties of the wake engine, driven by hypothesis on the simulated device.

Whatever the order in which work is recorded on streams, waits start and held work is released,
every waiter wakes once its own work is done and not before, and nothing is left behind.
"""

from __future__ import annotations

import math
from collections import deque

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aiogpu
from aiogpu._wait import _predict
from aiogpu.testing import SimulatedDriver

STREAMS = 3


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], str]:
    """Work items on streams (in record order), the order waits start, the order releases happen."""
    streams = draw(st.lists(st.integers(0, STREAMS - 1), min_size=1, max_size=12))
    wait_order = draw(st.permutations(range(len(streams))))
    release_order = draw(st.permutations(range(len(streams))))
    strategy = draw(st.sampled_from(["auto", "poll", "thread"]))
    return streams, list(wait_order), list(release_order), strategy


@pytest.mark.slow
@pytest.mark.anyio
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
async def test_every_waiter_wakes_exactly_when_its_work_is_done(scenario: tuple[list[int], list[int], list[int], str]) -> None:
    on_stream, wait_order, release_order, strategy = scenario
    sim = SimulatedDriver()
    device = sim.device(0)
    streams = [aiogpu.Stream(device) for _ in range(STREAMS)]
    works = []
    events = []
    for index in on_stream:
        works.append(sim.launch(streams[index]))
        events.append(streams[index].record())
    woke: list[int] = []
    woken = [anyio.Event() for _ in events]

    async def waiter(item: int) -> None:
        await events[item].wait(strategy=strategy)
        woke.append(item)
        woken[item].set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for item in wait_order:
                tg.start_soon(waiter, item)
            await anyio.wait_all_tasks_blocked()
            for item in release_order:
                works[item].release()
                # Done: every item whose own and earlier work on its stream is released.
                done = {i for i in range(len(events)) if events[i].is_done}
                assert set(woke) <= done  # nobody woke before their work completed
                with anyio.fail_after(10):  # and everybody whose work is done wakes
                    for item in done:
                        await woken[item].wait()
    assert sorted(woke) == list(range(len(events)))
    for stream in streams:
        stream.close()
    assert sim.statistics().lifetime_violations == 0


@given(brackets=st.lists(st.tuples(st.floats(0, 1e-2), st.floats(0, 1e-2)), min_size=1, max_size=50))
def test_predictions_stay_within_what_was_observed(brackets: list[tuple[float, float]]) -> None:
    predictor = _predict.Predictor()
    observed = [(min(a, b), max(a, b)) for a, b in brackets]
    for lower, upper in observed:
        predictor.observe(lower, upper)
        assert predictor.estimate is not None
        assert 0 <= predictor.estimate <= max(upper for _, upper in observed)


class _FakeTarget:
    def __init__(self, done: bool, asked: list[int], position: int) -> None:
        self._generation = 0
        self._handle = position
        self._done = done
        self._asked = asked

    @property
    def _driver(self) -> _FakeTarget:
        return self

    def event_query(self, handle: int) -> bool:
        self._asked.append(handle)
        return self._done


class _FakeEntry:
    def __init__(self, target: _FakeTarget, waited: bool, rerecorded: bool) -> None:
        self.target = target
        self.waiters = 1 if waited else 0
        self.generation = -1 if rerecorded else 0


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(["valid", "valid", "valid", "abandoned", "rerecorded"]), min_size=3, max_size=300),
    done_fraction=st.floats(0, 1),
    newest_first=st.booleans(),
)
def test_the_newest_done_wait_is_found_in_few_queries(kinds: list[str], done_fraction: float, newest_first: bool) -> None:
    # Work on a stream completes in order: the oldest ``done`` entries are done. The search
    # must return the newest position whose valid entries are all done, with no done valid
    # entry after it, and the next valid entry if it asked it, asking only valid entries, in
    # O(log n) queries.
    from aiogpu._wait._sweep import last_done

    kinds[0] = "valid"  # the sweep calls it with a valid head known done
    done = max(1, round(done_fraction * len(kinds)))
    asked: list[int] = []
    entries = deque(
        _FakeEntry(_FakeTarget(position < done, asked, position), kind != "abandoned", kind == "rerecorded")
        for position, kind in enumerate(kinds)
    )
    found, pending = last_done(entries, newest_first)  # type: ignore[arg-type]
    valid = [position for position, kind in enumerate(kinds) if kind == "valid"]
    assert all(position < done for position in valid if position <= found)
    assert not [position for position in valid if found < position < done]
    if pending is not None:  # the first valid entry after the found one, asked and not done
        assert pending == min(position for position in valid if position > found)
        assert pending >= done and pending in asked
    assert all(kinds[position] == "valid" for position in asked)
    assert len(asked) <= 2 * math.log2(len(kinds)) + 3, f"{len(asked)} queries for {len(kinds)} entries"
    if not newest_first:  # a burst of a few done ahead of a long queue costs a few queries
        assert len(asked) <= 2 * math.log2(done + 1) + 3, f"{len(asked)} queries for {done} done of {len(kinds)}"
