"""The driver door: CUresult to exceptions, NOT_READY as a value, messages that say what to do."""

from __future__ import annotations

import pickle

import pytest
from cuda.bindings import driver as cu

import aiogpu
from aiogpu import _driver


def test_error_carries_result_function_and_explanation() -> None:
    error = _driver.cuda_error(_driver.result_code("CUDA_ERROR_INVALID_HANDLE"), "cuEventRecord")
    assert isinstance(error, aiogpu.CudaError)
    assert error.result == 400
    assert error.name == "CUDA_ERROR_INVALID_HANDLE"
    assert error.func == "cuEventRecord"
    assert str(error) == "cuEventRecord: CUDA_ERROR_INVALID_HANDLE: invalid resource handle"
    assert not error.is_context_lost


def test_sticky_errors_say_the_context_is_lost() -> None:
    error = _driver.cuda_error(_driver.result_code("CUDA_ERROR_ILLEGAL_ADDRESS"), "cuEventQuery")
    assert error.is_context_lost
    assert "The CUDA context is no longer usable" in str(error)


def test_fork_hint() -> None:
    error = _driver.cuda_error(_driver.result_code("CUDA_ERROR_NOT_INITIALIZED"), "cuEventQuery")
    assert "'spawn'" in str(error)


def test_errors_pickle_and_copy() -> None:
    import copy

    error = _driver.cuda_error(_driver.result_code("CUDA_ERROR_LAUNCH_FAILED"), "cuStreamSynchronize")
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert clone is not error
        assert (clone.result, clone.name, clone.func, str(clone)) == (error.result, error.name, error.func, str(error))


def test_unknown_results() -> None:
    assert _driver.result_name(123456) == "CUresult(123456)"
    with pytest.raises(ValueError, match="unknown CUresult name 'CUDA_ERROR_NOPE'"):
        _driver.result_code("CUDA_ERROR_NOPE")
    with pytest.raises(ValueError, match="unknown CUresult name"):
        _driver.result_code("__class__")


def test_not_ready_is_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _driver.CudaDriver()
    monkeypatch.setattr(cu, "cuEventQuery", lambda event: (cu.CUresult.CUDA_ERROR_NOT_READY,))
    assert real.event_query(0x10) is False
    monkeypatch.setattr(cu, "cuEventQuery", lambda event: (cu.CUresult.CUDA_SUCCESS,))
    assert real.event_query(0x10) is True
    monkeypatch.setattr(cu, "cuEventQuery", lambda event: (cu.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,))
    with pytest.raises(aiogpu.CudaError, match="^cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS") as info:
        real.event_query(0x10)
    assert info.value.result == cu.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS


def test_checked_call_unpacks_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cu, "cuCtxGetStreamPriorityRange", lambda: (cu.CUresult.CUDA_SUCCESS, 0, -5))
    assert _driver.CudaDriver().stream_priority_range() == (0, -5)

    def cuStreamCreateWithPriority(flags: int, priority: int) -> tuple[object, None]:
        return (cu.CUresult.CUDA_ERROR_INVALID_CONTEXT, None)

    monkeypatch.setattr(cu, "cuStreamCreateWithPriority", cuStreamCreateWithPriority)
    with pytest.raises(
        aiogpu.CudaError, match="^cuStreamCreateWithPriority: CUDA_ERROR_INVALID_CONTEXT.*No CUDA context is current"
    ):
        _driver.CudaDriver().stream_create(0, 0)


def test_default_driver_swap() -> None:
    original = _driver.default_driver()
    assert isinstance(original, _driver.CudaDriver)
    assert _driver.default_driver() is original
