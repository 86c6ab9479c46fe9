"""copy.deepcopy of tpu tensors and modules, as CPU does it: the copy holds the same values in
its own storage, views that shared a storage still share one, and a module copy (an EMA
teacher, a DQN target network, torch.optim.swa_utils.AveragedModel) runs and trains apart from
its original. Tensor.__deepcopy__ clones the storage as bytes (UntypedStorage.clone), which on
tpu copies the storage's elements and gives the new storage their dtype."""
import copy

import pytest
import torch
from torch import nn

import deferfuse_torch  # noqa: F401

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_deepcopy_of_a_tensor_has_its_values_in_a_new_storage(mode, dtype):
    src = (torch.arange(12) % 5).to(dtype).reshape(3, 4)
    t = src.to("tpu")
    c = copy.deepcopy(t)
    assert c.device == t.device and c.dtype == dtype and c.shape == t.shape
    assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    torch.testing.assert_close(c.cpu(), src)


def test_writing_a_deepcopy_leaves_the_original(mode):
    t = torch.arange(6.0).to("tpu")
    c = copy.deepcopy(t)
    c.add_(100)
    torch.testing.assert_close(t.cpu(), torch.arange(6.0))
    torch.testing.assert_close(c.cpu(), torch.arange(6.0) + 100)


def test_deepcopy_keeps_a_views_offset_and_strides(mode):
    base = torch.arange(24.0).reshape(4, 6)
    v = base.to("tpu")[1:, ::2].t()
    c = copy.deepcopy(v)
    assert c.stride() == v.stride() and c.storage_offset() == v.storage_offset()
    torch.testing.assert_close(c.cpu(), base[1:, ::2].t())


def test_views_of_one_storage_still_share_one_after_deepcopy(mode):
    base = torch.arange(8.0).to("tpu")
    a, b = copy.deepcopy([base, base[2:5]])
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    a.zero_()
    torch.testing.assert_close(b.cpu(), torch.zeros(3))
    torch.testing.assert_close(base.cpu(), torch.arange(8.0))


def test_deepcopy_of_a_tensor_with_pending_writes_copies_their_values(mode):
    t = torch.ones(5, device="tpu")
    t.mul_(3).add_(1)
    c = copy.deepcopy(t)
    torch.testing.assert_close(c.cpu(), torch.full((5,), 4.0))


def test_deepcopy_of_a_module_with_buffers_runs_and_trains_apart(mode):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    m = copy.deepcopy(ref).to("tpu")
    twin = copy.deepcopy(m)
    x = torch.randn(2, 3, 6, 6)
    twin(x.to("tpu")).sum().backward()
    ref_twin = copy.deepcopy(ref)
    ref_twin(x).sum().backward()
    for (name, got), want in zip(twin.state_dict().items(), ref_twin.state_dict().values()):
        torch.testing.assert_close(got.cpu(), want, msg=name)
    for (name, got), want in zip(m.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(got.cpu(), want, msg=name)
    assert all(p.grad is None for p in m.parameters())


def test_averaged_model_of_a_tpu_model_averages_as_on_cpu(mode):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    m = copy.deepcopy(ref).to("tpu")
    ema = lambda avg, p, n: 0.9 * avg + 0.1 * p  # noqa: E731
    avg_ref = torch.optim.swa_utils.AveragedModel(ref, avg_fn=ema)
    avg = torch.optim.swa_utils.AveragedModel(m, avg_fn=ema)
    for _ in range(2):
        for p in list(ref.parameters()) + list(m.parameters()):
            with torch.no_grad():
                p.mul_(1.5)
        avg_ref.update_parameters(ref)
        avg.update_parameters(m)
    for (name, got), want in zip(avg.state_dict().items(), avg_ref.state_dict().values()):
        torch.testing.assert_close(got.cpu(), want, msg=name)


def test_untyped_storage_clone_reads_back_as_the_same_bytes(mode):
    t = torch.tensor([1.5, -2.0, 3.25]).to("tpu")
    s = t.untyped_storage().clone()
    assert s.device == t.device and s.nbytes() == 12
    assert bytes(s.cpu()) == bytes(torch.tensor([1.5, -2.0, 3.25]).untyped_storage())


def test_copying_a_storage_into_one_of_another_dtype_is_a_clear_error(mode):
    f = torch.ones(2).to("tpu").untyped_storage()
    i = torch.zeros(2, dtype=torch.int32).to("tpu").untyped_storage()
    with pytest.raises(RuntimeError, match="Float storage into a Int storage would reinterpret"):
        i.copy_(f)
