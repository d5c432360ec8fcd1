"""Arming the doorbell for the ``callback`` strategy, off the loop thread.

A host function enqueued on the user's stream would wait for everything enqueued there since
the event was recorded, and hold up that stream's later work. So each armed wait gets a private
non-blocking helper stream that waits for the event (``cuStreamWaitEvent``) and then runs the
host function: it rings as soon as the event's work is done. It still delays other work: CUDA
documents that device work added to any stream does not become active until the host functions
enqueued before it have run: one pending host function can hold up later work on the legacy
default stream and on blocking streams, and a few can hold up every stream, until the awaited
work finishes. The user guide says so where it lists
strategies.

Arming runs on its own thread, never on the loop: creating a stream can block inside the driver
while other streams are held (dozens of streams waiting on host memory, for example), and a
loop blocked there could never release them. Helper streams are reused once idle; when a wait
is armed, idle ones beyond ``KEEP_IDLE_HELPERS`` per device (left by a burst of waits) are destroyed.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from .. import _driver
from .._daemon import Executor
from .._per_process import PerProcess

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._device import Device
    from .._driver import Driver
    from ._doorbell import Doorbell
    from ._recording import Recording

#: The thread that arms waits, in the order they ask.
_armer = PerProcess(lambda: Executor("aiogpu-armer")).get
#: Helper streams per driver and context (only touched on the armer thread); a driver that is
#: gone takes its handles with it, so a later driver can never be handed them.
_helpers: weakref.WeakKeyDictionary[Driver, dict[int, list[int]]] = weakref.WeakKeyDictionary()
#: Idle helper streams kept per device for the next armed waits; more are destroyed.
KEEP_IDLE_HELPERS = 16


def arm(target: Recording, doorbell: Doorbell, poke: Callable[[], object]) -> None:
    """Ring ``doorbell`` once ``target``'s recorded work is done; ``poke`` if arming fails."""
    target._lifetime.retain()  # the pending wait holds it; it must outlive the cuStreamWaitEvent below
    _armer().submit(lambda: _arm(target, doorbell, poke))


def _arm(target: Recording, doorbell: Doorbell, poke: Callable[[], object]) -> None:
    try:
        driver, device = target._driver, target._device
        helper = _idle_helper(driver, device)
        driver.stream_wait_event(helper, target._handle)
        driver.launch_host_function(helper, doorbell.function, doorbell.address)
        helper_streams(driver, device._context).append(helper)
    except Exception:  # a lost context: the watcher's query will report it
        poke()
    finally:
        target._lifetime.release()


def helper_streams(driver: Driver, context: int) -> list[int]:
    """The helper streams of ``context`` (idle ones and ones still waiting to ring)."""
    return _helpers.setdefault(driver, {}).setdefault(context, [])


def _idle_helper(driver: Driver, device: Device) -> int:
    helpers = helper_streams(driver, device._context)
    idle = [helper for helper in helpers if driver.stream_query(helper)]
    for extra in idle[KEEP_IDLE_HELPERS:]:  # a burst of armed waits is over: give its streams back
        helpers.remove(extra)
        driver.stream_destroy(extra)
    if idle:
        helpers.remove(idle[0])
        return idle[0]
    with device._activated():
        return driver.stream_create(_driver.STREAM_NON_BLOCKING, 0)
