import pytest

from tests.kernels.tolerance import DEVICE


@pytest.fixture
def device():
    return DEVICE
