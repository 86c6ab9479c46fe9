import pytest
import torch

import deferfuse_torch

MODES = ["strict", "debug", "defer"]


@pytest.fixture(params=MODES)
def mode(request):
    """Runs the test body in each eager mode (set through the package's context manager)."""
    with deferfuse_torch.mode(request.param):
        yield request.param
    torch.tpu.synchronize()


def check(got, want, atol=1e-5, rtol=1e-5):
    """got: a tpu tensor; want: the CPU result. Same dtype, shape and values."""
    assert got.device.type == "tpu", got.device
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    torch.testing.assert_close(got.cpu(), want, atol=atol, rtol=rtol, equal_nan=True)
