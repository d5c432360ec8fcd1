"""Waiting through a CUDA host function, launched the first way or the second
(``cuLaunchHostFunc_v2``, whose sync mode says whether the driver's host-task thread sleeps or
spins while it waits for the work): latency rows that say what either mode would change for the
``callback`` strategy. On a GPU only; a driver without the second way gets no such rows.

Each wait enqueues, right behind the work, a host function that is the C library's ``sem_post``
on a semaphore of its waiter's own; a thread of the waiter's own blocks in ``sem_wait`` (through
ctypes: without the GIL) and resolves the wait's future on the loop (``call_soon_threadsafe``).
The same hops as the ``callback`` strategy's (the driver's host-task thread, a thread of ours,
the loop) without its helper stream and watcher: the rows differ from each other only in how the
driver runs the host function.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    import aiogpu

    from .baselines import Maker, Wait

#: ``CUhostTaskSyncMode``: how the driver's host-task thread waits for the work before it.
CU_HOST_TASK_BLOCKING = 0
CU_HOST_TASK_SPINWAIT = 1
#: Each way of launching, by the name of its latency row: ``None`` for ``cuLaunchHostFunc``.
VARIANTS: dict[str, int | None] = {
    "host function (cuLaunchHostFunc) -> thread -> loop": None,
    "host function (cuLaunchHostFunc_v2, BLOCKING) -> thread -> loop": CU_HOST_TASK_BLOCKING,
    "host function (cuLaunchHostFunc_v2, SPINWAIT) -> thread -> loop": CU_HOST_TASK_SPINWAIT,
}
_SEM_T_SIZE = 64  # sizeof(sem_t) is 32 on 64-bit glibc; leave room


def launcher(sync_mode: int | None) -> Callable[[int, int, int], int] | None:
    """``launch(stream, function, argument) -> CUresult`` straight into libcuda (not through
    cuda.bindings, whose trampoline takes the GIL on the driver's thread), or ``None`` where the
    driver lacks the entry point."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    try:
        function = libcuda.cuLaunchHostFunc if sync_mode is None else libcuda.cuLaunchHostFunc_v2
    except AttributeError:
        return None
    function.restype = ctypes.c_int
    if sync_mode is None:
        function.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        return lambda stream, host_function, argument: int(function(stream, host_function, argument))
    function.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
    return lambda stream, host_function, argument: int(function(stream, host_function, argument, sync_mode))


class _Semaphore:
    """A POSIX semaphore: ``post_function`` (``sem_post``) and ``address`` for a host function."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._semaphore = ctypes.create_string_buffer(_SEM_T_SIZE)
        if self._libc.sem_init(self._semaphore, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "sem_init failed")
        self.address = ctypes.addressof(self._semaphore)
        post = ctypes.cast(self._libc.sem_post, ctypes.c_void_p).value
        assert post is not None
        self.post_function = post

    def post(self) -> None:
        self._libc.sem_post(self._semaphore)

    def wait(self) -> None:
        """Block until posted (ctypes releases the GIL meanwhile)."""
        while self._libc.sem_wait(self._semaphore) != 0:  # EINTR: a signal came first
            pass


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def host_function_waiter(name: str, sync_mode: int | None) -> Maker | None:
    """The latency waiter that waits through a host function launched as ``sync_mode`` says,
    or ``None`` where the driver cannot launch one that way."""
    launch = launcher(sync_mode)
    if launch is None:
        return None

    def make(stream: aiogpu.Stream) -> tuple[Wait, Callable[[], None]]:
        semaphore = _Semaphore()
        pending: deque[asyncio.Future[None]] = deque()  # in launch order: a stream runs them in order
        stopping = threading.Event()

        def ring() -> None:
            while True:
                semaphore.wait()
                if stopping.is_set():
                    return
                future = pending.popleft()
                future.get_loop().call_soon_threadsafe(_resolve, future)

        thread = threading.Thread(target=ring, name="host-function waiter", daemon=True)
        thread.start()

        async def wait() -> None:
            future = asyncio.get_running_loop().create_future()
            pending.append(future)
            result = launch(stream.handle, semaphore.post_function, semaphore.address)
            if result != 0:
                pending.pop()
                raise RuntimeError(f"{name}: the launch failed with CUresult {result}")
            await future

        def close() -> None:
            stream.synchronize()  # no host function of ours left to run on a freed semaphore
            stopping.set()
            semaphore.post()
            thread.join()

        return wait, close

    return make


def waiters() -> list[tuple[str, Maker]]:
    """(name, maker) for each way this driver can launch a host function."""
    found = [(name, host_function_waiter(name, mode)) for name, mode in VARIANTS.items()]
    return [(name, make) for name, make in found if make is not None]
