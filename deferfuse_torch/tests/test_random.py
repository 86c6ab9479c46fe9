"""Random numbers on tpu: drawn on the device by the runtime's Philox generator, seeded by
torch.manual_seed and torch.Generator(device="tpu"), the same numbers in strict, debug and defer,
with the right statistics, and dropout with no CPU fallback."""

import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch


@pytest.fixture(autouse=True)
def no_fallback():
    deferfuse_torch.reset_fallback_counts()
    yield
    assert deferfuse_torch.fallback_counts() == {}


def draws():
    torch.manual_seed(1234)
    return [
        torch.rand(1000, device="tpu").cpu(),
        torch.randn(3, 333, device="tpu").cpu(),
        torch.randint(0, 10, (500,), device="tpu").cpu(),
        torch.empty(400, device="tpu").uniform_(-2, 3).cpu(),
        torch.empty(400, device="tpu").normal_(5, 0.5).cpu(),
        torch.bernoulli(torch.full((400,), 0.3, device="tpu")).cpu(),
        torch.randperm(50, device="tpu").cpu(),
    ]


def test_a_seed_gives_the_same_numbers_in_every_mode():
    results = {}
    for m in ("strict", "debug", "defer"):
        with deferfuse_torch.mode(m):
            results[m] = draws()
    for m in ("debug", "defer"):
        for a, b in zip(results["strict"], results[m]):
            assert torch.equal(a, b), m


def test_consecutive_draws_differ_and_reseeding_repeats_them(mode):
    torch.manual_seed(7)
    a, b = torch.rand(100, device="tpu").cpu(), torch.rand(100, device="tpu").cpu()
    assert not torch.equal(a, b)
    torch.manual_seed(7)
    assert torch.equal(torch.rand(100, device="tpu").cpu(), a)


def test_uniform_and_normal_statistics(mode):
    torch.manual_seed(0)
    u = torch.rand(200_000, device="tpu").cpu()
    assert 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    z = torch.randn(200_000, device="tpu", dtype=torch.float64).cpu()
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    n = torch.empty(100_000, device="tpu").normal_(3.0, 2.0).cpu()
    assert abs(n.mean() - 3.0) < 0.03 and abs(n.std() - 2.0) < 0.03


def test_randint_randperm_and_bernoulli(mode):
    torch.manual_seed(3)
    r = torch.randint(-3, 4, (10_000,), device="tpu").cpu()
    assert r.dtype == torch.int64 and r.min() == -3 and r.max() == 3
    p = torch.randperm(100, device="tpu").cpu()
    assert torch.equal(p.sort().values, torch.arange(100))
    b = torch.bernoulli(torch.full((20_000,), 0.25, device="tpu")).cpu()
    assert abs(b.mean() - 0.25) < 0.02


@pytest.mark.parametrize("dtype, n", [(torch.float16, 2050), (torch.float32, 2**24 + 2)])
def test_randperm_past_what_its_float_dtype_holds_raises_as_on_cpu(dtype, n):
    # CPU refuses n whose indices the dtype cannot all hold (the result would repeat values).
    with pytest.raises(RuntimeError, match="n cannot be greater than"):
        torch.randperm(n, dtype=dtype)
    with pytest.raises(RuntimeError, match="n cannot be greater than"):
        torch.randperm(n, dtype=dtype, device="tpu")
    assert torch.randperm(n - 1, dtype=dtype, device="tpu").shape == (n - 1,)


def test_a_tpu_generator_is_independent_of_the_default_one(mode):
    g = torch.Generator(device="tpu")
    g.manual_seed(11)
    a = torch.rand(50, device="tpu", generator=g).cpu()
    torch.manual_seed(99)
    g.manual_seed(11)
    assert torch.equal(torch.rand(50, device="tpu", generator=g).cpu(), a)
    state = g.get_state()
    c = torch.rand(50, device="tpu", generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.rand(50, device="tpu", generator=g).cpu(), c)


def test_fork_rng_restores_the_tpu_generator(mode):
    torch.manual_seed(5)
    with torch.random.fork_rng(device_type="tpu"):
        torch.rand(10, device="tpu")
    after = torch.rand(10, device="tpu").cpu()
    torch.manual_seed(5)
    assert torch.equal(torch.rand(10, device="tpu").cpu(), after)


def test_dropout_zeroes_p_and_scales_survivors_and_backward_uses_the_mask(mode):
    torch.manual_seed(0)
    x = torch.ones(100_000, device="tpu", requires_grad=True)
    y = F.dropout(x, p=0.3, training=True)
    yc = y.detach().cpu()
    zero = (yc == 0).float().mean().item()
    assert abs(zero - 0.3) < 0.01
    torch.testing.assert_close(yc[yc != 0], torch.full_like(yc[yc != 0], 1 / 0.7))
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), yc)


def test_dropout_outside_training_is_the_identity(mode):
    x = torch.randn(10, device="tpu")
    assert torch.equal(F.dropout(x, 0.5, training=False).cpu(), x.cpu())


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_recomputes_the_same_dropout_mask(mode, use_reentrant):
    # torch.utils.checkpoint saves and restores the device generator only for a device module
    # with `_initialized` set: without it the recomputation drew another mask, and the
    # gradient no longer matched the forward.
    lin = torch.nn.Linear(8, 8).to("tpu")
    x = torch.randn(4, 8).to("tpu").requires_grad_()

    def block(t):
        return F.dropout(torch.relu(lin(t)), 0.5, training=True)

    torch.manual_seed(1)
    y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=use_reentrant)
    y.sum().backward()
    got = x.grad.clone()
    x.grad = None
    torch.manual_seed(1)
    want_y = block(x)
    want_y.sum().backward()
    assert torch.equal(y.detach().cpu(), want_y.detach().cpu())
    assert torch.equal(got.cpu(), x.grad.cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_exponential_draws_in_float32_and_never_gives_zero(mode, dtype):
    # Drawn in bfloat16 a uniform number took 256 values: 0.4% of exponential_'s results were
    # exactly 0, and gumbel_softmax(hard=True) turned those rows into NaN.
    torch.manual_seed(0)
    e = torch.empty(200_000, dtype=dtype, device="tpu").exponential_().cpu()
    assert (e > 0).all()
    assert abs(e.float().mean().item() - 1.0) < 0.02
    y = F.gumbel_softmax(torch.zeros(2000, 10, dtype=dtype, device="tpu"), hard=True).cpu()
    assert not y.isnan().any()
    assert torch.equal(y.sum(1), torch.ones(2000, dtype=dtype))


def test_bfloat16_dropout_keeps_elements_with_probability_one_minus_p(mode):
    # Compared in bfloat16, the keep probability of p = 0.1 was 231/256 = 0.9023.
    torch.manual_seed(0)
    x = torch.ones(2_000_000, dtype=torch.bfloat16, device="tpu")
    kept = (F.dropout(x, 0.1) != 0).float().mean().item()
    assert abs(kept - 0.9) < 0.0012, kept



@pytest.mark.parametrize("low, high", [(2**62, 2**62 + 5), (2**53, 2**53 + 4), (0, 2**62),
                                       (-2**62, 2**62), (-2**63, 2**63 - 1), (-2**63 + 5, 2**62)])
def test_randint_with_bounds_past_2_to_the_53_stays_in_range_and_uses_every_low_bit(mode, low, high):
    # Drawn through a float64 they lost their low bits (never odd, one value of five) or left
    # the range; and a span of 2^63 overflowed int64.
    r = torch.randint(low, high, (4000,), device="tpu").cpu()
    assert r.dtype == torch.int64
    assert bool((r >= low).all()) and bool((r < high).all())
    assert 0 < int((r % 2).sum()) < 4000
    if high - low <= 8:
        assert r.unique().numel() == high - low


def test_random_of_int64_draws_odd_values_too(mode):
    r = torch.empty(4000, dtype=torch.int64, device="tpu").random_().cpu()
    assert bool((r >= 0).all()) and 0 < int((r % 2).sum()) < 4000


@pytest.mark.parametrize("draw", ["cauchy_", "log_normal_", "geometric_"])
def test_cauchy_log_normal_and_geometric_draw_on_the_device_from_its_generator(mode, draw):
    # On the CPU fallback they drew from the CPU's generator: a tpu generator raised, and tpu
    # seeds and states did not reproduce them.
    calls = {"cauchy_": lambda t, g: t.cauchy_(generator=g),
             "log_normal_": lambda t, g: t.log_normal_(generator=g),
             "geometric_": lambda t, g: t.geometric_(0.3, generator=g)}
    call = calls[draw]
    deferfuse_torch.reset_fallback_counts()
    g = torch.Generator(device="tpu")
    g.manual_seed(5)
    a = call(torch.empty(20000, device="tpu"), g).cpu()
    g.manual_seed(5)
    assert torch.equal(call(torch.empty(20000, device="tpu"), g).cpu(), a)
    state = torch.tpu.get_rng_state()
    b = call(torch.empty(8, device="tpu"), None).cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(call(torch.empty(8, device="tpu"), None).cpu(), b)
    assert deferfuse_torch.fallback_counts() == {}
    want = call(torch.empty(20000), None)  # CPU's distribution: the same median, roughly
    assert abs(a.median().item() - want.median().item()) < 0.1 * max(1.0, abs(want.median().item()))


def test_cauchy_log_normal_and_geometric_refuse_cpus_bad_parameters(mode):
    t = torch.empty(2, device="tpu")
    with pytest.raises(RuntimeError, match="cauchy_ expects sigma > 0.0, but found sigma=0"):
        t.cauchy_(sigma=0)
    with pytest.raises(RuntimeError, match=r"log_normal_ expects std > 0.0, but found std=-1"):
        t.log_normal_(std=-1)
    with pytest.raises(RuntimeError, match=r"geometric_ expects p to be in \(0, 1\), but got p=1.5"):
        t.geometric_(1.5)


@pytest.mark.parametrize("call", [
    lambda d: torch.empty(8, dtype=torch.int32, device=d).random_(0, 2**40),
    lambda d: torch.empty(8, dtype=torch.uint8, device=d).random_(-1, 5),
    lambda d: torch.empty(8, dtype=torch.bool, device=d).random_(3),
    lambda d: torch.empty(3, dtype=torch.int32, device=d).cauchy_(),
    lambda d: torch.empty(3, dtype=torch.int64, device=d).log_normal_(),
    lambda d: torch.empty(3, dtype=torch.bool, device=d).geometric_(0.5),
    lambda d: torch.empty(3, dtype=torch.int32, device=d).exponential_(),
])
def test_random_fills_refuse_bounds_and_dtypes_as_cpu(mode, call):
    # random_ past the dtype's range wrapped (int32 random_(0, 2**40) gave negatives); the
    # continuous samplers filled integer tensors.
    with pytest.raises((RuntimeError, NotImplementedError)) as want:
        call("cpu")
    with pytest.raises(type(want.value), match=str(want.value)[:30].replace("(", r"\(")):
        call("tpu")


def _same_error(call):
    """`call(device)` raises on CPU and on tpu with the same exception type and first line."""
    with pytest.raises(Exception) as want:
        call("cpu")
    with pytest.raises(Exception) as got:
        call("tpu")
    assert type(got.value) is type(want.value), (got.value, want.value)
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]


@pytest.mark.parametrize("call", [
    lambda d: torch.rand(4, device=d, dtype=torch.int64),
    lambda d: torch.rand(4, device=d, dtype=torch.bool),
    lambda d: torch.randn(4, device=d, dtype=torch.int64),
    lambda d: torch.zeros(4, dtype=torch.int64, device=d).uniform_(0, 10),
    lambda d: torch.zeros(4, dtype=torch.int32, device=d).normal_(),
    lambda d: torch.bernoulli(torch.ones(3, dtype=torch.int64, device=d)),
], ids=["rand-int64", "rand-bool", "randn-int64", "uniform_-int64", "normal_-int32",
        "bernoulli-int64"])
def test_a_random_fill_of_a_non_float_dtype_raises_as_on_cpu(mode, call):
    # Unchecked, torch.rand(n, dtype=torch.long) gave zeros and randn truncated normals.
    _same_error(call)


@pytest.mark.parametrize("bounds, dtype", [
    ((0, float("inf")), torch.float32),
    ((float("-inf"), 0), torch.float32),
    ((-3e38, 3e38), torch.float32),
    ((-1e5, 1e5), torch.float16),
])
def test_uniform_checks_its_bounds_as_on_cpu(mode, bounds, dtype):
    # Unchecked, these filled infinities and NaN.
    _same_error(lambda d: torch.empty(3, device=d, dtype=dtype).uniform_(*bounds))


def test_dropout_of_an_integer_tensor_raises_as_on_cpu(mode):
    _same_error(lambda d: torch.nn.functional.dropout(torch.ones(3, dtype=torch.int64, device=d),
                                                      0.5))


def test_randperm_into_a_dtype_too_narrow_for_its_indices_raises_as_on_cpu(mode):
    _same_error(lambda d: torch.randperm(300, device=d, dtype=torch.uint8))
    got = torch.randperm(256, device="tpu", dtype=torch.uint8).sort().values.cpu()
    assert torch.equal(got, torch.arange(256, dtype=torch.uint8))


def test_multinomial_over_more_than_2_pow_24_categories_raises_as_on_cpu(mode):
    _same_error(lambda d: torch.multinomial(torch.ones(2**24 + 1, device=d), 1))


def test_bernoulli_in_place_takes_a_cpu_probability_tensor_as_cuda_does(mode):
    got = torch.zeros(3, device="tpu").bernoulli_(torch.tensor([0.0, 1.0, 0.0])).cpu()
    assert got.tolist() == [0.0, 1.0, 0.0]


def test_dropout_outside_training_passes_an_integer_tensor_through_as_on_cpu(mode):
    x = torch.arange(4)
    got, mask = torch.native_dropout(x.to("tpu"), 0.5, False)
    assert got.dtype == torch.int64 and got.cpu().tolist() == x.tolist()
    assert mask.cpu().all()


def test_randperm_refuses_what_cpu_refuses_with_its_message(mode):
    _same_error(lambda d: torch.randperm(2**31 + 2, device=d, dtype=torch.int32))
    _same_error(lambda d: torch.randperm(3, device=d, dtype=torch.bool))


def test_multinomial_checks_the_sample_count_before_the_categories_as_cpu(mode):
    _same_error(lambda d: torch.multinomial(torch.ones(2**24 + 1, device=d), 2**24 + 2))


@pytest.mark.parametrize("bounds, dtype", [((float("nan"), 1), torch.float32),
                                           ((2, 1), torch.int64)])
def test_uniform_runs_cpus_checks_first(mode, bounds, dtype):
    _same_error(lambda d: torch.zeros(3, device=d, dtype=dtype).uniform_(*bounds))


def test_bernoulli_in_place_refuses_an_integer_probability_as_cpu(mode):
    _same_error(lambda d: torch.zeros(3, device=d).bernoulli_(torch.tensor([0, 1, 1])))

