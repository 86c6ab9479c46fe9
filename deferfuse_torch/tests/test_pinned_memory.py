"""Pinned host memory and non-blocking copies work as with CUDA: pin_memory(), is_pinned(),
DataLoader(pin_memory=True), and .to(..., non_blocking=True) both ways. A non-blocking copy
is carried out as a blocking one (it completes in stream order), so using its result at once
is always safe."""
import pytest
import torch

import deferfuse_torch  # noqa: F401
from conftest import check


def test_pin_memory_gives_a_pinned_copy():
    t = torch.randn(4)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned()
    assert p.data_ptr() != t.data_ptr()
    torch.testing.assert_close(p, t)


def test_pinned_views_and_storage_report_pinned():
    p = torch.randn(4, 4).pin_memory()
    assert p[1:].is_pinned() and p.t().is_pinned()
    assert not p.clone().is_pinned()


def test_non_blocking_upload_of_a_pinned_tensor(mode):
    t = torch.randn(3, 5).pin_memory()
    x = t.to("tpu", non_blocking=True)
    check(x * 2, t * 2)


def test_non_blocking_download_is_complete_on_return(mode):
    t = torch.randn(6)
    y = (t.to("tpu") + 1).to("cpu", non_blocking=True)
    torch.testing.assert_close(y, t + 1)


def test_non_blocking_copy_into_an_existing_host_tensor(mode):
    x = torch.arange(5.0).to("tpu") * 3
    dst = torch.empty(5).pin_memory()
    dst.copy_(x, non_blocking=True)
    torch.testing.assert_close(dst, torch.arange(5.0) * 3)


def test_dataloader_pins_batches_for_the_tpu(mode):
    torch.manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(10, 3), torch.arange(10))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True)
    seen = 0
    for xb, yb in loader:
        assert xb.is_pinned() and yb.is_pinned()
        xd, yd = xb.to("tpu", non_blocking=True), yb.to("tpu", non_blocking=True)
        check(xd.sum(1), xb.sum(1))
        check(yd, yb)
        seen += len(xb)
    assert seen == 10


@pytest.mark.parametrize("make", [
    lambda: torch.empty(3, device="tpu", pin_memory=True),
    lambda: torch.zeros(3, device="tpu", pin_memory=True),
    lambda: torch.randn(3, device="tpu", pin_memory=True),
    lambda: torch.empty_strided((2, 2), (2, 1), device="tpu", pin_memory=True),
], ids=["empty", "zeros", "randn", "empty_strided"])
def test_a_device_factory_asked_to_pin_raises_as_cudas_does(make):
    # Ignored, the call looked as if it had pinned something.
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        make()
