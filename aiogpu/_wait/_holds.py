"""How a pending wait keeps its event's handle alive through a ``close()``, at no cost when it
completes.

The first loop that waits for an event becomes its home (``HandleLifetime.claim_home``): it
holds one use of the handle for all of its waits, which count themselves on the event itself
(``_home_uses``) with no lock, since only the home loop's thread ever touches that count. A
wait of any other loop holds a use of the handle's lifetime of its own.

Completing a home wait then touches only the event, which the sweep has at hand anyway. A use
of the lifetime is two objects more (the lifetime and its list of uses), each cold by the time
the work completes: a use per wait would cost two cache misses per completed wait, which a
fan-out of thousands of waits on events of their own pays in its sweeps
(``benchmarks/wake.py``'s fan-outs time this path).

Closing hands the home's use back once the home's waits are over, decided on the home loop's
thread (``closed``): at once when ``close()`` runs there, else on the loop's next iteration; if
the loop is gone (closed, or its trio run over), none of its waits can ask about the handle any
more and the use goes back at once, as it does when the home's watcher was collected with its loop
(the event refers to it weakly). An event closed after its loop stopped, before the loop closed
without running again, keeps its handle until the event is collected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from ._recording import Recording
    from ._watcher import Watcher

#: What a wait holds: nothing (any more), a count on its event (a home wait), or a use of the
#: event's handle lifetime (a wait of another loop).
NOTHING = 0
HOME = 1
LIFETIME = 2


def hold(target: Recording, watcher: Watcher) -> int:
    """Keep ``target``'s handle alive for a wait of ``watcher``'s loop (its thread). Raises
    ``ClosedResourceError`` if the event is closed."""
    lifetime = target._lifetime
    home = lifetime.home
    if home is None:
        home = lifetime.claim_home(watcher.weak_self)
    if home is watcher.weak_self:
        target._home_uses += 1
        # Counted first, then checked: a close() that ran before the count, on this very thread
        # (a finalizer, a ``__del__``), may have let go of the home's use already.
        if lifetime.closed:
            let_go(target, HOME)
            lifetime.check_open()
        return HOME
    lifetime.acquire()
    return LIFETIME


def let_go(target: Recording, held: int) -> None:
    """End what ``hold`` returned (the holding loop's thread). The watcher's sweep writes this
    out where it completes thousands of waits at once (``Sweep._complete_oldest``)."""
    if held == HOME:
        uses = target._home_uses - 1
        target._home_uses = uses
        if not uses and target._home_closing:
            leave_home(target)
    elif held == LIFETIME:
        target._lifetime.release()


def leave_home(target: Recording) -> None:
    """The event is closed and its home's waits are over: the home lets go of its use."""
    target._home_closing = False
    target._lifetime.release()


def closed(target: Recording) -> None:
    """``target`` was just closed (any thread): its home lets go of its use once its waits are
    over. Called once, by the ``close()`` that closed it."""
    home_reference = target._lifetime.home
    if home_reference is None:
        return
    home = cast("Watcher | None", home_reference())
    if home is None:  # collected with its loop: none of its waits asks about the handle any more
        leave_home(target)
    elif home.runs_here():
        _settle(target)
    elif not home.call_soon_threadsafe(lambda: _settle(target)):
        leave_home(target)  # its loop is gone: no wait of it asks about the handle any more


def _settle(target: Recording) -> None:
    """On the home loop's thread: let go now, or once the last pending home wait ends."""
    if target._home_uses:
        target._home_closing = True
    else:
        leave_home(target)
