"""The contract suite on trio, through anyio's pytest plugin."""

from __future__ import annotations

import pytest

from tests.contract import Contract

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


class TestContractOnTrio(Contract):
    pass
