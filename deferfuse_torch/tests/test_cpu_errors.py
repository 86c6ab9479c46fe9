"""A call that fails on CPU fails on tpu with CPU's exception class and message, in every mode:
code that catches IndexError or NotImplementedError around an op sees the same exception on
both devices. Each case below gave a RuntimeError in the runtime's own words before (a
reduction over dim 2 of a matrix), or no error at all (an integer to a negative power)."""

import pytest
import torch

import deferfuse_torch  # noqa: F401  (registers the device)

# name -> call(device): an op CPU refuses.
CASES = {
    "sum over a dim out of range": lambda d: torch.ones(2, 3, device=d).sum(2),
    "mean over a dim out of range": lambda d: torch.ones(2, 3, device=d).mean((0, 2)),
    "sum of a 0-dim tensor over dim 1": lambda d: torch.tensor(1.0, device=d).sum(1),
    "amax over a dim out of range": lambda d: torch.ones(2, 3, device=d).amax(2),
    "argmax over a dim out of range": lambda d: torch.ones(2, 3, device=d).argmax(2),
    "max over a dim out of range": lambda d: torch.ones(2, 3, device=d).max(5),
    "cat along a dim out of range": lambda d: torch.cat([torch.ones(2, 3, device=d)] * 2, 2),
    "amax over an empty dim": lambda d: torch.empty(0, 3, device=d).amax(0),
    "amin over an empty last dim": lambda d: torch.empty(3, 0, device=d).amin(-1),
    "max over an empty dim": lambda d: torch.empty(0, 3, device=d).max(0),
    "argmin over an empty dim": lambda d: torch.empty(0, 3, device=d).argmin(0),
    "argmax of an empty tensor": lambda d: torch.empty(0, 3, device=d).argmax(),
    "amax of an empty tensor": lambda d: torch.empty(0, 3, device=d).amax(),
    "aminmax of an empty tensor": lambda d: torch.empty(0, 3, device=d).aminmax(),
    "median over an empty dim": lambda d: torch.empty(0, 3, device=d).median(0),
    "integer to a negative power": lambda d: torch.tensor([2, 3], device=d) ** -1,
    "integer to a negative power in place": lambda d: torch.tensor([2, 3], device=d).pow_(-2),
    "bool minus bool": lambda d: torch.tensor([True], device=d) - torch.tensor([True], device=d),
    "bool minus in place": lambda d: torch.tensor([True], device=d).sub_(torch.tensor([True], device=d)),
    "negated bool": lambda d: -torch.tensor([True], device=d),
    "bitwise and of floats": lambda d: torch.tensor([1.0], device=d) & torch.tensor([1.0], device=d),
    "bitwise xor of floats in place":
        lambda d: torch.tensor([1.0], device=d).bitwise_xor_(torch.tensor([1.0], device=d)),
    "mean of integers": lambda d: torch.tensor([1, 2], device=d).mean(),
    "std of integers": lambda d: torch.tensor([1, 2], device=d).std(),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_op_cpu_refuses_raises_cpus_exception_on_tpu(mode, name):
    with pytest.raises(Exception) as cpu:
        CASES[name]("cpu")
    with pytest.raises(Exception) as tpu:
        CASES[name]("tpu")
    assert type(tpu.value) is type(cpu.value), (type(tpu.value), tpu.value)
    assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_the_median_of_an_empty_tensor_is_cpus(mode, dtype):
    want = torch.empty(0, dtype=dtype).median()
    got = torch.empty(0, dtype=dtype, device="tpu").median()
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    nan = torch.empty(0, 3, device="tpu").nanmedian()
    assert nan.isnan().item()
