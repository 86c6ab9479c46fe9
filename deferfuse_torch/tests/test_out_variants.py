"""out= and in-place overloads that have no tpu kernel of their own run on the device through
their functional overload (csrc/out_variants.cpp): CPU's values, dtypes, shapes, warnings and
errors, the out tensor itself returned and written, and no CPU fallback where PyTorch's own
out= kernel would only resize and copy."""

import warnings

import pytest
import torch

import deferfuse_torch
from conftest import check

torch.manual_seed(5)
A, B = torch.randn(6, 4), torch.randn(4, 5)
X, Y = torch.randn(3, 5), torch.randn(3, 5)
BA, BB = torch.randn(2, 6, 4), torch.randn(2, 4, 5)

# name -> (call(inputs, out=...), inputs, outs as CPU tensors (their dtype and initial shape)).
OUT_CALLS = {
    "mm": (lambda a, b, out: torch.mm(a, b, out=out), (A, B), (torch.empty(6, 5),)),
    "matmul": (lambda a, b, out: torch.matmul(a, b, out=out), (A, B), (torch.empty(6, 5),)),
    "addmm": (lambda c, a, b, out: torch.addmm(c, a, b, beta=0.5, out=out),
              (torch.randn(6, 5), A, B), (torch.empty(6, 5),)),
    "bmm": (lambda a, b, out: torch.bmm(a, b, out=out), (BA, BB), (torch.empty(2, 6, 5),)),
    "baddbmm": (lambda c, a, b, out: torch.baddbmm(c, a, b, alpha=2.0, out=out),
                (torch.randn(2, 6, 5), BA, BB), (torch.empty(2, 6, 5),)),
    "cat": (lambda x, y, out: torch.cat([x, y], 1, out=out), (X, Y), (torch.empty(3, 10),)),
    "sigmoid": (lambda x, out: torch.sigmoid(x, out=out), (X,), (torch.empty(3, 5),)),
    "exp": (lambda x, out: torch.exp(x, out=out), (X,), (torch.empty(3, 5),)),
    "amax": (lambda x, out: torch.amax(x, 1, out=out), (X,), (torch.empty(3),)),
    "max_dim": (lambda x, out: torch.max(x, 1, out=out), (X,),
                (torch.empty(3), torch.empty(3, dtype=torch.long))),
    "eq": (lambda x, y, out: torch.eq(x, y, out=out), (X, X.where(X > 0, Y)),
           (torch.empty(3, 5, dtype=torch.bool),)),
    # PyTorch composes these from addmv.out.
    "mv": (lambda a, v, out: torch.mv(a, v, out=out), (A, B[:, 0]), (torch.empty(6),)),
    "matmul_vector": (lambda a, v, out: torch.matmul(a, v, out=out), (A, B[:, 0]),
                      (torch.empty(6),)),
}


def run_out(name, device):
    call, inputs, outs = OUT_CALLS[name]
    outs = tuple(o.to(device) for o in outs)
    got = call(*(t.to(device) for t in inputs), out=outs if len(outs) > 1 else outs[0])
    return got, outs


@pytest.fixture
def no_fallback():
    deferfuse_torch.reset_fallback_counts()
    yield
    assert deferfuse_torch.fallback_counts() == {}


@pytest.mark.parametrize("name", sorted(OUT_CALLS))
def test_an_out_variant_writes_cpus_values_on_the_device(mode, no_fallback, name):
    want, _ = run_out(name, "cpu")
    got, outs = run_out(name, "tpu")
    for g, w, o in zip(got if isinstance(got, tuple) else (got,),
                       want if isinstance(want, tuple) else (want,), outs):
        check(o, w)
        assert g.data_ptr() == o.data_ptr() and g.shape == o.shape


IN_PLACE_CALLS = {
    "eq_": lambda x, y: x.eq_(y),
    "lt_": lambda x, y: x.lt_(0.25),
    "ne_": lambda x, y: x.ne_(y),
    "logit_": lambda x, y: x.logit_(),
    "logit_eps": lambda x, y: x.logit_(0.1),
}


@pytest.mark.parametrize("name", sorted(IN_PLACE_CALLS))
def test_an_in_place_op_without_its_own_kernel_runs_on_the_device(mode, no_fallback, name):
    inplace = IN_PLACE_CALLS[name]
    x, y = torch.rand(3, 5), torch.rand(3, 5).where(torch.rand(3, 5) > 0.5, torch.rand(3, 5))
    want = inplace(x.clone(), y)
    d = x.to("tpu")
    got = inplace(d, y.to("tpu"))
    assert got is d
    check(d, want)


def test_baddbmm_in_place_runs_on_the_device(mode, no_fallback):
    c = torch.randn(2, 6, 5)
    d = c.to("tpu")
    d.baddbmm_(BA.to("tpu"), BB.to("tpu"), beta=0.5)
    check(d, c.baddbmm_(BA, BB, beta=0.5), atol=1e-5, rtol=1e-5)


def test_a_comparison_in_place_on_an_int_tensor_keeps_its_dtype(no_fallback):
    x = torch.tensor([1, 5, 3, 7])
    d = x.to("tpu")
    d.gt_(4)
    check(d, x.clone().gt_(4))


# Ops whose out= has a tpu kernel of its own, each resizing a wrong-shaped out.
RESIZED_OUTS = {
    "mm": lambda x, out: torch.mm(x, x.t(), out=out),
    "add": lambda x, out: torch.add(x, 1, out=out),
    "mul": lambda x, out: torch.mul(x, x, out=out),
    "exp": lambda x, out: torch.exp(x, out=out),
    "sum_dim": lambda x, out: torch.sum(x, 0, out=out),
    "cumsum": lambda x, out: torch.cumsum(x, 1, out=out),
    "index_select": lambda x, out: torch.index_select(x, 0, torch.tensor([1, 0], device=x.device),
                                                      out=out),
    "gather": lambda x, out: torch.gather(x, 1, torch.tensor([[1, 0], [2, 2]], device=x.device),
                                          out=out),
    "logical_and": lambda x, out: torch.logical_and(x, x, out=out),
    "where": lambda x, out: torch.where(x > 1, x, x + 1, out=out),
}


@pytest.mark.parametrize("name", sorted(RESIZED_OUTS))
def test_a_non_empty_out_of_another_shape_is_resized_with_cpus_warning(no_fallback, name):
    results = []
    for device in ("cpu", "tpu"):
        x = torch.arange(6.).reshape(2, 3).to(device)
        out = torch.zeros(5, device=device, dtype=torch.bool if name == "logical_and" else None)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            RESIZED_OUTS[name](x, out)
        assert any("resized" in str(w.message) for w in seen), device
        results.append(out)
    check(results[1], results[0])


def test_an_empty_out_takes_the_results_shape_silently(no_fallback):
    out = torch.empty(0, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.sigmoid(X.to("tpu"), out=out)
    check(out, torch.sigmoid(X))


def test_a_non_contiguous_out_is_written_in_its_own_layout(mode, no_fallback):
    base = torch.zeros(5, 6, device="tpu")
    out = base.t()  # [6, 5], column-major
    torch.mm(A.to("tpu"), B.to("tpu"), out=out)
    assert out.stride() == (1, 6)
    check(out, A @ B)
    check(base, (A @ B).t())


# Ops with an out= kernel of their own: each resizes its out, which with the out's own shape
# must keep its strides (the tpu resize_ made them contiguous: the values landed transposed in
# the out's base).
OWN_OUT_KERNELS = {
    "cumsum": lambda x, out: torch.cumsum(x, 1, out=out),
    "cumprod": lambda x, out: torch.cumprod(x, 1, out=out),
    "index_select": lambda x, out: torch.index_select(x, 1, torch.tensor([3, 0, 2, 1]), out=out),
    "gather": lambda x, out: torch.gather(x, 1, torch.tensor([[3, 0, 2, 1]] * 3), out=out),
    "sort": lambda x, out: torch.sort(x, 1, out=(out, torch.empty(3, 4, dtype=torch.long))),
    "topk": lambda x, out: torch.topk(x, 4, 1, out=(out, torch.empty(3, 4, dtype=torch.long))),
}


@pytest.mark.parametrize("name", sorted(OWN_OUT_KERNELS))
def test_an_out_kernel_writes_a_transposed_out_through_its_strides(mode, name):
    x = torch.randn(3, 4)
    want_base = torch.zeros(4, 3)
    OWN_OUT_KERNELS[name](x, want_base.t())
    base = torch.zeros(4, 3, device="tpu")
    out = base.t()
    call = OWN_OUT_KERNELS[name]
    if name in ("sort", "topk", "index_select", "gather"):
        # Their index tensors go to the device with the input.
        def call(x, out, f=OWN_OUT_KERNELS[name]):
            with torch.device("tpu"):
                return f(x, out)
    call(x.to("tpu"), out)
    assert out.stride() == (1, 3)
    check(base, want_base)


@pytest.mark.parametrize("call", [
    lambda x, big: torch.add(x, big, out=x),
    lambda x, big: torch.add(big, x, alpha=2, out=x),
    lambda x, big: torch.mul(big, x, out=x),
])
def test_an_out_that_is_also_an_input_is_not_broadcast_to_a_bigger_shape(mode, call):
    with pytest.raises(RuntimeError) as cpu:
        call(torch.zeros(5), torch.ones(4, 5))
    x = torch.zeros(5, device="tpu")
    with pytest.raises(RuntimeError) as tpu:
        call(x, torch.ones(4, 5, device="tpu"))
    assert str(tpu.value) == str(cpu.value)
    assert x.shape == (5,)


def test_an_out_of_another_dtype_gets_cpus_error():
    with pytest.raises(RuntimeError) as cpu:
        torch.mm(A, B, out=torch.empty(6, 5, dtype=torch.float64))
    with pytest.raises(RuntimeError) as tpu:
        torch.mm(A.to("tpu"), B.to("tpu"), out=torch.empty(6, 5, dtype=torch.float64,
                                                            device="tpu"))
    assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


def test_an_out_of_a_castable_dtype_gets_cpus_values():
    # eq(out=float) casts on CPU; the op goes to the CPU fallback for it (PyTorch's own rules).
    out = torch.empty(3, 5, device="tpu")
    torch.eq(X.to("tpu"), X.to("tpu"), out=out)
    check(out, torch.eq(X, X, out=torch.empty(3, 5)))


def test_an_out_overlapping_an_input_partly_gets_cpus_values():
    # Not the functional path (its result would be computed before the write, where PyTorch's
    # kernel reads what it may have written): the CPU fallback, as before.
    def call(x):
        torch.sigmoid(x[:, 1:], out=x[:, :-1])
        return x

    check(call(X.to("tpu")), call(X.clone()))


def test_an_out_on_another_device_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"same device, but found at least two devices, "
                                           r"tpu:0 and cpu! \(when checking argument out of "
                                           r"aten::mm.out\)"):
        torch.mm(A.to("tpu"), B.to("tpu"), out=torch.empty(6, 5))


def test_an_out_variant_in_defer_mode_does_not_sync():
    a, b = A.to("tpu"), B.to("tpu")
    out = torch.empty(6, 5, device="tpu")
    torch.tpu.synchronize()
    with deferfuse_torch.mode("defer"):
        before = sum(deferfuse_torch.stats()["sync_points"].values())
        torch.mm(a, b, out=out)
        torch.sigmoid(out, out=out)
        after = sum(deferfuse_torch.stats()["sync_points"].values())
    assert after == before
    check(out, torch.sigmoid(A @ B))


def test_an_out_variant_in_strict_mode_is_one_program():
    a, b = A.to("tpu"), B.to("tpu")
    out = torch.empty(6, 5, device="tpu")
    with deferfuse_torch.mode("strict"):
        torch.tpu.synchronize()
        before = deferfuse_torch.stats()["programs_run"]
        torch.mm(a, b, out=out)
        torch.tpu.synchronize()
        assert deferfuse_torch.stats()["programs_run"] - before == 1
    check(out, A @ B)


def test_an_out_variant_of_a_tensor_requiring_grad_gets_cpus_error():
    with pytest.raises(RuntimeError) as cpu:
        torch.exp(X.requires_grad_(), out=torch.empty(3, 5))
    X.requires_grad_(False)
    x = X.to("tpu").requires_grad_()
    with pytest.raises(RuntimeError) as tpu:
        torch.exp(x, out=torch.empty(3, 5, device="tpu"))
    assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


@pytest.mark.parametrize("call", [
    lambda s, a, b: torch.addbmm(s, a[0], b), lambda s, a, b: torch.addbmm(s, a, b[:1]),
    lambda s, a, b: torch.addbmm(s, a, b[:, :2]), lambda s, a, b: torch.addbmm(s[:3], a, b),
    lambda s, a, b: torch.addmv(s[:, 0], a[0], b[0, :2, 0]),
    lambda s, a, b: torch.addmv(s, a[0], b[0, :, 0]),
], ids=["batch1_2d", "batches_differ", "sizes_differ", "self_does_not_fit", "mv_sizes",
        "mv_dims"])
def test_addbmm_and_addmv_shape_errors_are_cpus(call):
    inputs = torch.randn(4, 5), torch.randn(2, 4, 3), torch.randn(2, 3, 5)
    with pytest.raises(RuntimeError) as cpu:
        call(*inputs)
    with pytest.raises(RuntimeError) as tpu:
        call(*(t.to("tpu") for t in inputs))
    assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


def test_an_out_variant_with_a_sliced_input_runs_on_the_device(mode, no_fallback):
    # A non-dense input of another storage than the out cannot overlap it: mm.out ran on the
    # CPU fallback for `a[:, :3]`.
    a, b = torch.randn(4, 5), torch.randn(3, 6)
    out = torch.empty(4, 6, device="tpu")
    torch.mm(a.to("tpu")[:, :3], b.to("tpu"), out=out)
    check(out, a[:, :3] @ b)


OUT_IS_AN_INPUT = {
    "index_select": lambda x: torch.index_select(x, 0, torch.tensor([1, 0], device=x.device),
                                                 out=x),
    "where_broadcast": lambda x: where_into_its_input(x[:1]),
}


def where_into_its_input(a):
    c = torch.ones(3, 1, dtype=torch.bool, device=a.device)
    return torch.where(c, a, torch.ones(3, 3, device=a.device), out=a)


@pytest.mark.parametrize("name", sorted(OUT_IS_AN_INPUT))
def test_an_out_that_is_an_input_it_cannot_be_gets_cpus_error(name):
    x = torch.arange(9.).reshape(3, 3)
    with pytest.raises(RuntimeError) as cpu_error:
        OUT_IS_AN_INPUT[name](x.clone())
    with pytest.raises(RuntimeError) as tpu_error:
        OUT_IS_AN_INPUT[name](x.to("tpu"))
    assert str(tpu_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]
