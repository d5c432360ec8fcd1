"""A forked child must not use CUDA: every driver, real or simulated, refuses there.

CUDA cannot be used in a child of a parent that used it, and calling it there may not even
fail: a driver lock held by one of the parent's threads at the fork (a waiter thread parked in
``cuEventSynchronize``) is held forever in the child, so the call can hang. Whatever calls
CUDA registers with :func:`refuse_after_fork`; in a child, every public call of each raises
``CUDA_ERROR_NOT_INITIALIZED`` with the hint to use ``spawn``, without entering the driver.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any

from ._results import cuda_error, result_code

if TYPE_CHECKING:
    from collections.abc import Callable

#: What a forked child must refuse: every initialized CudaDriver, every SimulatedDriver, and
#: aiogpu.testing's CUDA instruments.
_refused_after_fork: weakref.WeakSet[object] = weakref.WeakSet()


def refuse_after_fork(driver: object) -> None:
    """Make ``driver`` refuse every call in children forked from now on (see
    :func:`fail_every_call_after_fork`)."""
    _refused_after_fork.add(driver)


def fail_every_call_after_fork(driver: object) -> None:
    """In a child created by ``fork()``: make every public call of ``driver`` raise
    ``CUDA_ERROR_NOT_INITIALIZED`` (with the hint to use ``spawn``) without entering the driver.
    """
    for cls in type(driver).__mro__[:-1]:  # a subclass inherits calls too (object has none)
        for name, member in vars(cls).items():
            if not name.startswith("_") and (callable(member) or isinstance(member, (staticmethod, classmethod))):
                setattr(driver, name, _fails_after_fork(name))


def _fails_after_fork(name: str) -> Callable[..., Any]:
    def call(*args: object, **kwargs: object) -> Any:
        raise cuda_error(result_code("CUDA_ERROR_NOT_INITIALIZED"), name)

    return call


def _after_fork_in_child() -> None:
    for driver in list(_refused_after_fork):
        fail_every_call_after_fork(driver)


os.register_at_fork(after_in_child=_after_fork_in_child)
