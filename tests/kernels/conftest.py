import pytest
import torch

from tests.kernels.tolerance import DEVICE


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _seeded():
    """Every kernel test draws the same inputs whatever ran before it (a failure reproduces alone)."""
    torch.manual_seed(0)
    yield
