"""Ownership of one driver handle: idempotent close, deferred destroy, a GC safety net.

Invariants:

- The handle is destroyed at most once: by ``close()`` when no wait is using it, by the last
  ``release()`` after a ``close()``, or by the garbage collector's ``weakref.finalize`` if the
  owner object was dropped without closing. Never in ``__del__``. Only interpreter exit leaves
  one undestroyed (below).
- A wait that uses the handle (``acquire``/``release``) keeps it alive even if the user closes
  the object meanwhile (``cuEventDestroy`` of an event a waiter thread is blocked on would be
  undefined).
- Destroying never raises: at interpreter shutdown or after a sticky context error the driver
  may refuse, and there is nobody left to tell.
- Interpreter exit closes every owned handle and destroys only those nobody uses:
  ``weakref.finalize`` runs the remaining finalizers at exit, while a daemon waiter thread may
  still be blocked in the driver on the handle; the driver frees it with the process.
- A handle may have a home (``claim_home``): one user that holds a single use on behalf of
  many, counted elsewhere without a lock (an event's home loop counts its waits on the event:
  ``aiogpu._wait._holds``), and lets go of it once the handle is closed and they are over. So
  exit leaves the handle of an event that a loop awaited and nobody closed to the driver too.
  The home is held through a weak reference.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import TYPE_CHECKING, Any

from ._errors import AiogpuError, ClosedResourceError

if TYPE_CHECKING:
    from collections.abc import Callable


_exiting = False  # set by ``_note_exit`` as the interpreter starts to exit
_exit_hook_registered = False


def _note_exit() -> None:
    global _exiting
    _exiting = True


def _register_exit_hook() -> None:
    # After a weakref.finalize exists, so its exit hook is registered already: atexit runs hooks
    # last in, first out, so this one runs before that one runs the remaining finalizers.
    global _exit_hook_registered
    _exit_hook_registered = True
    atexit.register(_note_exit)


def _finalize_handle(lifetime: HandleLifetime, destroy: Callable[[int], None], handle: int) -> None:
    # At exit a daemon waiter thread may still be blocked in the driver on the handle: destroying
    # it under that thread can crash the process. Outside exit a handle still counted in
    # use belongs to a wait collected in a cycle with its event, or to a fork child's copy of the
    # parent's threads' waits: no thread is in the driver on it, so it is destroyed.
    if _exiting and not lifetime._close_at_exit():
        return
    try:
        destroy(handle)
    except (AiogpuError, RuntimeError):  # context lost, driver unloading, interpreter exiting
        pass


class HandleLifetime:
    """Tracks whether ``owner``'s handle is closed and in use, and destroys it when both allow."""

    __slots__ = ("_closed", "_finalizer", "_home", "_kind", "_lock", "_uses")

    def __init__(self, owner: object, kind: str, handle: int, destroy: Callable[[int], None] | None) -> None:
        self._kind = kind
        self._lock = threading.Lock()
        # One item per user: ``list.pop`` is atomic, so ``release`` needs the lock only once the
        # handle is closed (every waiter thread's job releases one, and every wait of a loop
        # other than the home).
        self._uses: list[None] = []
        self._closed = False
        # ``claim_home``: holds one of ``_uses`` until it lets go of it. A weak reference: a loop's
        # watcher must not outlive its loop for as long as an event it once awaited stays open.
        self._home: weakref.ref[Any] | None = None
        # A borrowed handle (destroy is None) is never destroyed by aiogpu.
        # Its arguments must never reach ``owner``, or the owner would never be collected.
        self._finalizer = weakref.finalize(owner, _finalize_handle, self, destroy, handle) if destroy else None
        if destroy is not None and not _exit_hook_registered:
            _register_exit_hook()

    @property
    def owns_handle(self) -> bool:
        return self._finalizer is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise ClosedResourceError(f"this {self._kind} is closed")

    def acquire(self) -> None:
        """Mark the handle in use by a wait; raise ``ClosedResourceError`` if closed."""
        with self._lock:
            self.check_open()
            self._uses.append(None)

    @property
    def home(self) -> weakref.ref[Any] | None:
        """The home's weak reference (dead once the home is collected), ``None`` if none."""
        return self._home

    def claim_home(self, home: weakref.ref[Any]) -> weakref.ref[Any]:
        """Make ``home``'s referent the handle's home unless it has one, holding one use on its
        behalf (let go of with ``release``); returns the home's weak reference. The home passes
        the one reference it always uses, so that it knows itself by identity, with no call.
        ``ClosedResourceError`` if closed."""
        with self._lock:
            self.check_open()
            if self._home is None:
                self._home = home
                self._uses.append(None)
            return self._home

    def retain(self) -> None:
        """One more user, allowed after ``close()`` while someone still uses the handle: a
        pending wait's waiter thread keeps it alive through a ``close()`` that came after the
        wait started. ``ClosedResourceError`` only once it is closed and unused (destroyed)."""
        with self._lock:
            if self._closed and not self._uses:
                self.check_open()
            self._uses.append(None)

    def release(self) -> None:
        self._uses.pop()  # atomic: no lock while the handle is open
        if not self._closed:
            return
        with self._lock:  # closed: ``close`` may have counted this use, and left the handle to us
            destroy_now = not self._uses
        if destroy_now and self._finalizer is not None:
            self._finalizer()  # ``weakref.finalize`` runs once, however often it is called

    def _close_at_exit(self) -> bool:
        """Close as the interpreter exits (a wait a daemon thread starts later gets
        ``ClosedResourceError``); whether the handle may be destroyed now: nobody uses it."""
        with self._lock:
            self._closed = True
            return not self._uses

    def close(self) -> bool:
        """Close; destroy the handle if nobody uses it. Whether this call closed it (once)."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            destroy_now = not self._uses
        if destroy_now and self._finalizer is not None:
            self._finalizer()
        return True
