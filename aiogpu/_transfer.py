"""Awaitable transfers between device memory and pooled page-locked host memory.

The pattern servers hand-roll with a thread (vLLM, SGLang): copy results to the host on a side
stream, ordered after the stream that produced them, and await the copy instead of blocking the
loop in ``synchronize()``. Rules this file keeps:

- Copies go through page-locked (pinned) host memory from a :class:`PinnedPool`
  (``_pinned``), the only kind a copy can overlap with.
- A copy runs on a side stream that first waits, on the device, for the work enqueued so far on
  ``after``: the producer's stream is never blocked and goes on.
- A buffer is never reused, nor freed, while a copy into or out of it may still run: a copy
  whose await was cancelled hands its buffer to the pool to hold until the GPU is done.
- Bad arguments are refused before anything is taken from the pool or enqueued.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _foreign
from ._errors import ClosedResourceError
from ._pinned import PinnedBuffer, PinnedPool
from ._wait import check_strategy

if TYPE_CHECKING:
    from ._stream import Stream
    from ._wait import WaitStrategy


async def copy_to_host(source: object, *, after: Stream, pool: PinnedPool, strategy: WaitStrategy | None = None) -> PinnedBuffer:
    """Copy a device array into pinned host memory and await the copy.

    The copy runs on a side stream of the pool (one per producer stream) once the work enqueued
    on ``after`` so far (which produced ``source``) is done; ``after`` itself is not blocked and
    can take more work.

    Args:
        source: A C-contiguous CUDA array (torch CUDA tensor, CuPy or Numba device array, any
            ``__cuda_array_interface__`` object) or a ``(device_pointer, nbytes)`` pair.
        after: The stream whose work produces ``source``.
        pool: Where the host memory comes from; its device must be ``after``'s.
        strategy: ``"auto"``, ``"poll"``, ``"thread"`` or ``"callback"`` (see
            :meth:`Event.wait`); the default is :func:`aiogpu.get_default_wait_strategy`.

    Returns:
        The host copy; give it back with ``release()`` (or ``with``) when done with it.

    Raises:
        TypeError: ``source`` is not a CUDA array, or ``after``/``pool`` have the wrong type.
        ValueError: The array is not contiguous or is empty, or ``pool`` is for another device.
        CudaError: The copy (or the work before it) failed.

    Cancellation:
        Returns promptly; the copy may still run, and its memory stays out of the pool until
        it has.
    """
    array = _foreign.describe_array(source)
    _check_transfer(after, pool, array, strategy)
    buffer = pool.take(array.nbytes)
    await _copy(pool, after, buffer.pointer, array.pointer, array.nbytes, buffer, strategy, owned=True)
    return buffer


async def copy_to_device(
    destination: object, source: object, *, after: Stream, pool: PinnedPool, strategy: WaitStrategy | None = None
) -> None:
    """Copy host bytes into a device array and await the copy.

    ``source`` is staged through the pool's pinned memory unless it is a :class:`PinnedBuffer`
    already. The copy runs on a side stream of the pool (one per producer stream) after the work
    enqueued on ``after`` so far (which may still be using ``destination``).

    Args:
        destination: A writable, C-contiguous CUDA array or ``(device_pointer, nbytes)``.
        source: Any bytes-like object (``bytes``, ``memoryview``, a NumPy array...) or a
            :class:`PinnedBuffer`, of exactly ``destination``'s size.
        after: The stream whose earlier work must finish before ``destination`` is overwritten.
        pool: Staging memory and the side stream; its device must be ``after``'s.
        strategy: ``"auto"``, ``"poll"``, ``"thread"`` or ``"callback"`` (see
            :meth:`Event.wait`); the default is :func:`aiogpu.get_default_wait_strategy`.

    Raises:
        TypeError: Wrong argument types.
        ValueError: Sizes differ, the destination is read-only or not contiguous.
        CudaError: The copy (or the work before it) failed.

    Cancellation:
        Returns promptly; the copy may still run. Staging memory, or a :class:`PinnedBuffer`
        passed as ``source``, goes back to the pool only once the copy is done.
    """
    array = _foreign.describe_array(destination)
    if array.readonly:
        raise ValueError("the destination CUDA array is read-only")
    _check_transfer(after, pool, array, strategy)
    if isinstance(source, PinnedBuffer):
        if source._pool is None:
            raise ClosedResourceError("the source PinnedBuffer was given back to its pool")
        if source.nbytes != array.nbytes:
            raise ValueError(f"the source has {source.nbytes} bytes, the destination {array.nbytes}")
        await _copy(pool, after, array.pointer, source.pointer, array.nbytes, source, strategy, owned=False)
        return
    try:
        data = memoryview(source).cast("B")  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"the source must be bytes-like or a PinnedBuffer, got {type(source).__name__}") from None
    if data.nbytes != array.nbytes:
        raise ValueError(f"the source has {data.nbytes} bytes, the destination {array.nbytes}")
    staging = pool.take(array.nbytes)
    staging.view()[:] = data
    await _copy(pool, after, array.pointer, staging.pointer, array.nbytes, staging, strategy, owned=True)
    staging.release()


def _check_transfer(after: Stream, pool: PinnedPool, array: _foreign.DeviceArray, strategy: object) -> None:
    """Refuse bad arguments before anything is taken or enqueued."""
    if strategy is not None:
        check_strategy(strategy)
    if not isinstance(pool, PinnedPool):
        raise TypeError(f"pool must be an aiogpu.PinnedPool, got {pool!r}")
    pool._check_producer(after)
    if array.nbytes == 0:
        raise ValueError("the CUDA array is empty: nothing to copy")


async def _copy(
    pool: PinnedPool,
    after: Stream,
    destination: int,
    source: int,
    nbytes: int,
    buffer: PinnedBuffer,
    strategy: WaitStrategy | None,
    *,
    owned: bool,
) -> None:
    """Enqueue the copy on ``after``'s side stream after ``after``'s work so far, and await it.

    ``owned``: ``buffer`` was taken for this copy (given back if the copy cannot be enqueued).
    """
    try:
        side = pool.side_stream(after)
        side.wait_for(after)
        with after.device._activated():
            after.device._driver.memcpy_async(destination, source, nbytes, side.handle)
        done = side.record()
    except BaseException:  # not enqueued, or the context failed: no copy will touch the memory
        if owned:
            buffer.release()
        raise
    try:
        await done.wait(strategy=strategy)
    except BaseException:
        pool._hold_until_done(done, buffer)
        raise
    done.close()
