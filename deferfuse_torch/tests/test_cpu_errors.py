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
    "bool remainder bool": lambda d: torch.tensor([True], device=d) % torch.tensor([True], device=d),
    "bool to a bool power": lambda d: torch.tensor([True], device=d) ** torch.tensor([True], device=d),
    "bool floor-divided by bool": lambda d: torch.tensor([True], device=d) // torch.tensor([True], device=d),
    "frac of an integer tensor": lambda d: torch.tensor([1, 2], device=d).frac(),
    "vector_norm of an integer tensor": lambda d: torch.linalg.vector_norm(
        torch.tensor([1, 2], device=d), dtype=torch.float32),
    "vector_norm narrowing to its dtype": lambda d: torch.linalg.vector_norm(
        torch.ones(2, device=d), dtype=torch.float16),
    "bool minus in place": lambda d: torch.tensor([True], device=d).sub_(torch.tensor([True], device=d)),
    "negated bool": lambda d: -torch.tensor([True], device=d),
    "bitwise and of floats": lambda d: torch.tensor([1.0], device=d) & torch.tensor([1.0], device=d),
    "bitwise xor of floats in place":
        lambda d: torch.tensor([1.0], device=d).bitwise_xor_(torch.tensor([1.0], device=d)),
    "cumsum of a bool tensor in place": lambda d: torch.tensor([True, False], device=d).cumsum_(0),
    "cumprod into a bool out": lambda d: torch.cumprod(
        torch.tensor([1, 2], device=d), 0, out=torch.empty(2, dtype=torch.bool, device=d)),
    "cumsum in bool": lambda d: torch.cumsum(torch.ones(3, device=d), 0, dtype=torch.bool),
    "cumsum_ in another dtype": lambda d: torch.ones(3, device=d).cumsum_(0, dtype=torch.float64),
    "cumsum into an out of another dtype than asked": lambda d: torch.cumsum(
        torch.ones(3, device=d), 0, dtype=torch.float64, out=torch.empty(3, device=d)),
    "renorm into an out of another dtype": lambda d: torch.renorm(
        torch.ones(3, 2, device=d), 2, 0, 1.0,
        out=torch.empty(3, 2, dtype=torch.float64, device=d)),
    "mean of integers": lambda d: torch.tensor([1, 2], device=d).mean(),
    "std of integers": lambda d: torch.tensor([1, 2], device=d).std(),
    "int32 clamp min past its range":
        lambda d: torch.tensor([1, 5], dtype=torch.int32, device=d).clamp(min=2**40),
    "int32 clamp max past its range":
        lambda d: torch.tensor([1, 5], dtype=torch.int32, device=d).clamp(max=-2**40),
    "uint8 clamp_ min past its range":
        lambda d: torch.tensor([1, 5], dtype=torch.uint8, device=d).clamp_(min=300),
    "clamp without bounds": lambda d: torch.clamp(torch.ones(2, device=d)),
    "float32 clamp by a bound past its range": lambda d: torch.ones(2, device=d).clamp(-1e300, 1),
    "float16 clamp by a bound past its range":
        lambda d: torch.ones(2, dtype=torch.float16, device=d).clamp(max=70000),
    "a float alpha for integers":
        lambda d: torch.add(torch.tensor([1], device=d), torch.tensor([2], device=d), alpha=0.5),
    "softmax of integers": lambda d: torch.softmax(torch.tensor([[1, 2, 3]], device=d), -1),
    "log_softmax of integers":
        lambda d: torch.log_softmax(torch.tensor([[1, 2, 3]], device=d), -1),
    "softmax of uint8 over dim 0":
        lambda d: torch.softmax(torch.tensor([[1, 2]], dtype=torch.uint8, device=d), 0),
    "an integer tensor times 1j in place": lambda d: torch.tensor([1, 2], device=d).mul_(1j),
    "an integer tensor plus 1.5 in place": lambda d: torch.tensor([1, 2], device=d).add_(1.5),
    "an integer tensor divided in place": lambda d: torch.tensor([1, 2], device=d).div_(2),
    "a bool tensor plus 1 in place": lambda d: torch.tensor([True], device=d).add_(1),
    "scatter from another dtype": lambda d: torch.zeros(3, device=d).scatter(
        0, torch.tensor([0], device=d), torch.ones(1, dtype=torch.float64, device=d)),
    "scatter_add_ from another dtype": lambda d: torch.zeros(3, dtype=torch.long, device=d)
        .scatter_add_(0, torch.tensor([0], device=d), torch.ones(1, device=d)),
    "scatter_reduce from another dtype": lambda d: torch.zeros(3, device=d).scatter_reduce(
        0, torch.tensor([0], device=d), torch.ones(1, dtype=torch.float64, device=d), "sum"),
    "lerp to an end of another dtype": lambda d: torch.lerp(
        torch.zeros(2, device=d), torch.ones(2, dtype=torch.float64, device=d), 0.3),
    "where with an int64 condition": lambda d: torch.where(
        torch.tensor([1, 0], device=d), torch.ones(2, device=d), 0.0),
    "lerp by a weight of another dtype": lambda d: torch.lerp(
        torch.zeros(3, device=d), torch.ones(3, device=d),
        torch.rand(3, dtype=torch.float64, device=d)),
    "an integer tensor and a float scalar": lambda d: torch.tensor([1], device=d) & 1.0,
    "an integer tensor xor a float tensor in place": lambda d: torch.tensor(
        [1], device=d).bitwise_xor_(torch.tensor([1.0], device=d)),
    "max over an empty last dim": lambda d: torch.zeros(3, 0, device=d).max(-1),
    "argmin over an empty last dim": lambda d: torch.zeros(3, 0, device=d).argmin(-1),
    "cat of a 0-dim tensor": lambda d: torch.cat(
        [torch.ones(2, device=d), torch.tensor(1.0, device=d)], 1),
    "a bool mask of the wrong length":
        lambda d: torch.ones(2, 3, device=d)[torch.tensor([True, False, True], device=d)],
    "a bool mask of the wrong length on dim 1":
        lambda d: torch.ones(2, 3, device=d)[:, torch.tensor([True, False], device=d)],
    "a float index tensor": lambda d: torch.ones(2, 3, device=d)[torch.tensor([0.0], device=d)],
    "too many indices": lambda d: torch.ones(2, device=d)[
        torch.tensor([0], device=d), torch.tensor([0], device=d)],
    "index_select by a 2-d index": lambda d: torch.ones(2, 3, device=d).index_select(
        0, torch.tensor([[0]], device=d)),
    "a bool tensor clamped by a bool bound":
        lambda d: torch.tensor([True, False], device=d).clamp(min=False),
    "a bool tensor clamped in place by an integer bound":
        lambda d: torch.tensor([True, False], device=d).clamp_(min=2),
    "a bool tensor shifted in place": lambda d: torch.tensor([True], device=d).__ilshift__(2),
    "a float tensor shifted": lambda d: torch.tensor([1.0], device=d) << 1,
    "max_unpool2d with int32 indices": lambda d: torch.ops.aten.max_unpool2d(
        torch.ones(1, 1, 2, 2, device=d), torch.zeros(1, 1, 2, 2, dtype=torch.int32, device=d),
        [4, 4]),
    "max_unpool2d with indices of another shape": lambda d: torch.ops.aten.max_unpool2d(
        torch.ones(1, 1, 2, 2, device=d), torch.zeros(1, 1, 2, 1, dtype=torch.long, device=d),
        [4, 4]),
    "max_unpool3d of a 3-d input": lambda d: torch.ops.aten.max_unpool3d(
        torch.ones(1, 2, 2, device=d), torch.zeros(1, 2, 2, dtype=torch.long, device=d),
        [4, 4, 4], [2, 2, 2], [0, 0, 0]),
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
