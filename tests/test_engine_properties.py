"""Properties of the wake engine, driven by hypothesis on the simulated device.

Whatever the order in which work is recorded on streams, waits start and held work is released,
every waiter wakes once its own work is done and not before, and nothing is left behind.
"""

from __future__ import annotations

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
