"""HandleLifetime: a handle is destroyed exactly once, never while a wait still uses it, also when
releases, retains and ``close()`` race on several threads (``release`` takes no lock while the
handle is open)."""

from __future__ import annotations

import subprocess
import sys
import threading
import weakref

import pytest

from aiogpu import ClosedResourceError, _lifetime
from aiogpu._lifetime import HandleLifetime


class Owner:
    pass


def test_close_waits_for_the_last_release_and_destroys_once() -> None:
    destroyed: list[int] = []
    owner = Owner()
    lifetime = HandleLifetime(owner, "event", 7, destroyed.append)
    lifetime.acquire()
    lifetime.acquire()
    lifetime.close()
    assert destroyed == []
    lifetime.retain()  # a waiter thread joining a wait that is still pending: allowed
    with pytest.raises(ClosedResourceError, match="this event is closed"):
        lifetime.acquire()  # a new wait is not
    lifetime.release()
    lifetime.release()
    assert destroyed == []
    lifetime.release()
    assert destroyed == [7]
    with pytest.raises(ClosedResourceError, match="this event is closed"):
        lifetime.retain()
    lifetime.close()
    del owner
    assert destroyed == [7]


def test_a_released_open_handle_is_destroyed_by_close_alone() -> None:
    destroyed: list[int] = []
    owner = Owner()  # alive throughout: its garbage collection would destroy the handle too
    lifetime = HandleLifetime(owner, "stream", 3, destroyed.append)
    lifetime.acquire()
    lifetime.release()
    assert destroyed == []
    lifetime.close()
    assert destroyed == [3]
    del owner
    assert destroyed == [3]


class PausingUses(list):  # type: ignore[type-arg]
    """A lifetime's list of uses whose ``pop`` lets the test run ``close()`` right before or
    right after it: the two interleavings that a lock-free ``release`` must get right."""

    def __init__(self, uses: list[None], close_before_pop: bool) -> None:
        super().__init__(uses)
        self.close_before_pop = close_before_pop
        self.popping = threading.Event()
        self.closed = threading.Event()

    def pop(self, *args: int) -> None:
        if self.close_before_pop:
            self.popping.set()
            assert self.closed.wait(10)
            return super().pop(*args)  # type: ignore[no-any-return]
        result = super().pop(*args)
        self.popping.set()  # popped: only now may the test close
        assert self.closed.wait(10)
        return result  # type: ignore[no-any-return]


@pytest.mark.parametrize("close_before_pop", [True, False], ids=["close-before-pop", "close-after-pop"])
def test_close_during_the_last_release_destroys_the_handle_once(close_before_pop: bool) -> None:
    # The release saw the handle open and is about to drop its use (or just dropped it) when
    # ``close()`` runs on another thread: the handle is destroyed once, after the use is gone.
    destroyed: list[int] = []
    owner = Owner()
    lifetime = HandleLifetime(owner, "event", 5, destroyed.append)
    lifetime.acquire()
    uses = lifetime._uses = PausingUses(lifetime._uses, close_before_pop)
    releasing = threading.Thread(target=lifetime.release)
    releasing.start()
    assert uses.popping.wait(10)
    lifetime.close()
    assert destroyed == ([5] if not close_before_pop else [])  # a use was left only before the pop
    uses.closed.set()
    releasing.join(10)
    assert not releasing.is_alive()
    assert destroyed == [5]


def _race_releases_retains_and_close(users: int) -> tuple[list[int], list[str]]:
    """``users`` threads release their use (every other one retains and releases a second use
    first) while this thread closes: what was destroyed, and what went wrong."""
    in_use = [users]
    guard = threading.Lock()
    errors: list[str] = []
    destroyed: list[int] = []

    def destroy(handle: int) -> None:
        with guard:
            if in_use[0]:
                errors.append(f"destroyed with {in_use[0]} uses left")
        destroyed.append(handle)

    owner = Owner()
    lifetime = HandleLifetime(owner, "event", 1, destroy)
    for _ in range(users):
        lifetime.acquire()
    start = threading.Barrier(users + 1)

    def user(joins_again: bool) -> None:
        start.wait()
        if joins_again:
            try:
                lifetime.retain()  # allowed while this thread's own use is held
            except ClosedResourceError as exc:
                errors.append(f"retain with a use held: {exc}")
            else:
                lifetime.release()
        with guard:
            in_use[0] -= 1
        lifetime.release()

    threads = [threading.Thread(target=user, args=(n % 2 == 0,)) for n in range(users)]
    for thread in threads:
        thread.start()
    start.wait()
    lifetime.close()
    for thread in threads:
        thread.join()
    return destroyed, errors


def test_racing_releases_retains_and_close_destroy_once_and_never_in_use() -> None:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows
    try:
        for _ in range(100):
            assert _race_releases_retains_and_close(users=4) == ([1], [])
    finally:
        sys.setswitchinterval(interval)


def test_loops_claiming_a_home_at_once_make_one_that_holds_one_use() -> None:
    destroyed: list[int] = []
    owner = Owner()
    for _ in range(50):
        lifetime = HandleLifetime(owner, "event", 5, destroyed.append)
        claimants = [Owner() for _ in range(4)]
        start = threading.Barrier(len(claimants))
        homes: list[weakref.ref[object]] = []

        def claim(claimant: object, lifetime: HandleLifetime, start: threading.Barrier, homes: list[weakref.ref[object]]) -> None:
            start.wait()
            homes.append(lifetime.claim_home(weakref.ref(claimant)))

        threads = [threading.Thread(target=claim, args=(claimant, lifetime, start, homes)) for claimant in claimants]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(map(id, homes))) == 1 and homes[0]() in claimants
        assert lifetime.home is homes[0]
        lifetime.close()
        assert destroyed == []  # the home's use
        lifetime.release()  # the home lets go
        assert destroyed == [5]
        destroyed.clear()
    with pytest.raises(ClosedResourceError, match="this event is closed"):
        lifetime.claim_home(weakref.ref(claimants[0]))


def test_exit_leaves_a_handle_in_use_to_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    # weakref.finalize calls the remaining finalizers at exit, owners alive or not, while a
    # daemon waiter thread may still be blocked in the driver on the handle.
    destroyed: list[int] = []
    owners = [Owner(), Owner()]
    in_use = HandleLifetime(owners[0], "event", 1, destroyed.append)
    unused = HandleLifetime(owners[1], "event", 2, destroyed.append)
    in_use.acquire()
    monkeypatch.setattr(_lifetime, "_exiting", True)  # what its exit hook sets
    for lifetime in (in_use, unused):
        assert lifetime._finalizer is not None
        lifetime._finalizer()  # what weakref.finalize's exit hook does
    assert destroyed == [2]
    for lifetime in (in_use, unused):  # no wait starts on either any more (a daemon thread's)
        with pytest.raises(ClosedResourceError):
            lifetime.acquire()
    with pytest.raises(ClosedResourceError):
        unused.retain()  # nor does a waiter thread's job on the destroyed one
    in_use.retain()  # one on the handle still in use may join it, as after a close()
    in_use.release()
    in_use.release()  # the waiter thread is back from the driver: the handle stays with it
    assert destroyed == [2]


def test_a_handle_collected_while_counted_in_use_is_destroyed() -> None:
    # Outside exit only a wait collected in a cycle with its event (or a fork child's copy of
    # one) leaves a use: no thread is in the driver on the handle then; leaving it would leak it.
    destroyed: list[int] = []
    owner = Owner()
    lifetime = HandleLifetime(owner, "event", 3, destroyed.append)
    lifetime.acquire()
    assert lifetime._finalizer is not None
    lifetime._finalizer()  # what the collector does
    assert destroyed == [3]


@pytest.mark.parametrize("first", [True, False], ids=["first-finalizer", "after-another"])
@pytest.mark.slow
def test_finalizers_run_at_exit_know_it_is_exit(first: bool) -> None:
    # atexit runs hooks last in, first out: the flag must be set before weakref.finalize's hook
    # runs, whether or not a finalizer (and so that hook) existed before aiogpu's first one.
    script = (
        "import weakref\n"
        "from aiogpu import _lifetime\n"
        "class Owner: pass\n"
        "owners = [Owner(), Owner()]\n"
        + ("assert not weakref.finalize._registered_with_atexit\n" if first else "")
        + ("" if first else "weakref.finalize(owners[1], print, 'another')\n")
        + "_lifetime.HandleLifetime(owners[0], 'event', 1, lambda handle: print('exiting', _lifetime._exiting))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert "exiting True" in result.stdout.splitlines(), result.stdout
