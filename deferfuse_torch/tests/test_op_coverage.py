"""Op coverage: every op issue 14 names, as a table of cases, on tpu against torch on CPU in
strict, debug and defer, forward and backward, with no CPU fallback for the case.

A deterministic case is compared by value (each output, and the gradient of every floating
input through every floating output). A random case cannot match CPU's stream (the device has
its own Philox generator), so it is checked for shape, dtype and statistics, and for giving the
same numbers in every mode under one seed. The ops that still run on the CPU fallback are listed
in FALLBACK with the reason; each must still fall back (so the list cannot go stale when one
gains a kernel), still give CPU's values, and be named in the README's list."""
import math
import pathlib
from typing import Callable, NamedTuple

import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch
from conftest import MODES, check

_gen = torch.Generator().manual_seed(14)


def rn(*shape, dtype=torch.float32):
    """Seeded normal numbers, so the table is the same on every run."""
    return torch.randn(*shape, generator=_gen, dtype=dtype)


def unit(*shape):
    """Inside (-0.9, 0.9): the domain of asin, acos, atanh."""
    return torch.rand(*shape, generator=_gen) * 1.8 - 0.9


def ri(low, high, *shape):
    return torch.randint(low, high, shape, generator=_gen)


def pos(*shape):
    """Inputs in a domain where log-like ops are defined (0.1 .. 2.1)."""
    return torch.rand(*shape, generator=_gen) * 2 + 0.1


def distinct(*shape):
    """Values without ties (a random permutation), so sort/topk/median/max_pool pick the same
    element as CPU."""
    n = math.prod(shape)
    return (torch.randperm(n, generator=_gen).float() / n - 0.5).view(shape)


class Case(NamedTuple):
    name: str
    fn: Callable
    inputs: tuple
    atol: float = 1e-5
    rtol: float = 1e-5
    grad: object = True  # False, or the indices of the inputs to differentiate
    factory: bool = False


def case(name, fn, *inputs, **kw):
    return Case(name, fn, inputs, **kw)


def flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run(c, device):
    """The case on one device: its outputs and the gradients of its floating inputs, taken
    through every floating output with fixed upstream gradients."""
    xs = [t.detach().clone().to(device) if isinstance(t, torch.Tensor) else t for t in c.inputs]
    for k, t in enumerate(xs):
        wanted = c.grad is True or (c.grad and k in c.grad)
        if wanted and isinstance(t, torch.Tensor) and t.is_floating_point():
            t.requires_grad_()
    outs = flat(c.fn(device) if c.factory else c.fn(*xs))
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    grads = []
    if diff:
        g = torch.Generator().manual_seed(1)
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype).to(device)).sum()
                   for o in diff)
        loss.backward()
        grads = [t.grad for t in xs if isinstance(t, torch.Tensor) and t.requires_grad]
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], grads


def compare(c):
    want, want_g = run(c, "cpu")
    deferfuse_torch.reset_fallback_counts()
    got, got_g = run(c, "tpu")
    torch.tpu.synchronize()
    fallbacks = deferfuse_torch.fallback_counts()
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            check(g, w, atol=c.atol, rtol=c.rtol)
        else:
            assert g == w
    assert len(got_g) == len(want_g)
    for g, w in zip(got_g, want_g):
        check(g, w, atol=c.atol, rtol=c.rtol)
    return fallbacks


def _index_put(x, v, accumulate):
    i = torch.tensor([0, 2, 0], device=x.device)
    return x.clone().index_put_((i,), v, accumulate=accumulate)


def _setitem_mask(x, m):
    y = x.clone()
    y[m] = 0.5
    return y


INDEXING = [
    case("index_select", lambda x, i: x.index_select(1, i), rn(4, 5), ri(0, 5, 7)),
    case("gather", lambda x, i: torch.gather(x, 1, i), rn(3, 5), ri(0, 5, 3, 4)),
    case("take_along_dim", lambda x, i: torch.take_along_dim(x, i, 1), rn(3, 5), ri(0, 5, 3, 2)),
    case("scatter_src", lambda x, i, s: x.scatter(1, i, s), rn(3, 5),
         torch.tensor([[0, 1], [4, 3], [2, 0]]), rn(3, 2)),
    case("scatter_value", lambda x, i: x.scatter(1, i, 7.0), rn(3, 5),
         torch.tensor([[0, 1], [4, 3], [2, 0]])),
    case("scatter_in_place", lambda x, i, s: x.clone().scatter_(0, i, s), rn(4, 3),
         torch.tensor([[3, 0, 1], [2, 1, 0]]), rn(2, 3)),
    case("scatter_add", lambda x, i, s: x.scatter_add(1, i, s), rn(3, 5), ri(0, 5, 3, 6),
         rn(3, 6)),
    *[case(f"scatter_reduce_{r}",
           lambda x, i, s, r=r: x.scatter_reduce(1, i, s, r, include_self=True),
           rn(3, 5), ri(0, 5, 3, 6), rn(3, 6), grad=r in ("sum", "mean"))
      for r in ("sum", "prod", "amax", "amin", "mean")],
    case("index_add", lambda x, i, s: x.index_add(0, i, s, alpha=2.0), rn(5, 3),
         torch.tensor([0, 4, 0, 2]), rn(4, 3)),
    case("index_put", lambda x, v: _index_put(x, v, False), rn(4, 3), rn(3)),
    case("index_put_accumulate", lambda x, v: _index_put(x, v, True), rn(4, 3), rn(3)),
    case("getitem_index", lambda x, i: x[i], rn(6, 3), torch.tensor([5, -1, 0, 2])),
    case("getitem_mask", lambda x, m: x[m], rn(4, 5), rn(4, 5) > 0),
    case("setitem_mask", _setitem_mask, rn(4, 5), rn(4, 5) > 0),
    case("masked_fill", lambda x, m: x.masked_fill(m, -1.5), rn(4, 5), rn(4, 5) > 0),
    case("masked_select", lambda x, m: torch.masked_select(x, m), rn(4, 5), rn(5) > 0),
    case("nonzero", lambda x: torch.nonzero(x), ri(0, 2, 4, 5)),
    case("nonzero_as_tuple", lambda x: torch.nonzero(x, as_tuple=True), ri(0, 2, 3, 4)),
    case("index_fill", lambda x, i: x.index_fill(1, i, -1.0), rn(3, 5), torch.tensor([4, 0])),
    case("isin", lambda x, t: torch.isin(x, t), ri(0, 10, 20), torch.tensor([1, 3, 5, 7])),
    case("embedding", lambda w, i: F.embedding(i, w), rn(10, 4), ri(0, 10, 3, 5)),
    case("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), rn(4, 3), rn(4, 3) > 0,
         rn(12)),
    case("flip", lambda x: torch.flip(x, (0, 2)), rn(2, 3, 4)),
    case("embedding_padding_idx", lambda w, i: F.embedding(i, w, padding_idx=2), rn(10, 4),
         torch.tensor([[2, 1, 2, 9], [0, 2, 5, 5]])),
]

REDUCTIONS = [
    case("cumsum", lambda x: torch.cumsum(x, 1), rn(3, 7)),
    case("cumprod", lambda x: torch.cumprod(x, 0), pos(5, 3)),
    case("logsumexp", lambda x: torch.logsumexp(x, dim=(0, 2)), rn(3, 4, 5)),
    case("vector_norm_2", lambda x: torch.linalg.vector_norm(x), rn(4, 5)),
    case("vector_norm_1_dim", lambda x: torch.linalg.vector_norm(x, 1, dim=1), rn(4, 5)),
    case("vector_norm_inf_dims", lambda x: torch.linalg.vector_norm(x, math.inf, dim=(0, 2)),
         distinct(3, 4, 5)),
    case("vector_norm_keepdim", lambda x: torch.linalg.vector_norm(x, 2, dim=-1, keepdim=True),
         rn(4, 5)),
    case("normalize", lambda x: F.normalize(x, dim=1), rn(4, 5)),
    case("var_mean", lambda x: torch.var_mean(x, dim=1), rn(4, 6)),
    case("topk", lambda x: torch.topk(x, 3, dim=1), distinct(4, 6)),
    case("topk_smallest", lambda x: torch.topk(x, 2, dim=0, largest=False), distinct(5, 3)),
    case("sort", lambda x: torch.sort(x, dim=1, descending=True), distinct(3, 6)),
    case("sort_stable", lambda x: torch.sort(x, stable=True), ri(0, 4, 12), grad=False),
    case("argsort_stable", lambda x: torch.argsort(x, dim=0, stable=True), ri(0, 3, 10, 2)),
    case("median", lambda x: torch.median(x), distinct(5, 3)),
    case("median_dim", lambda x: torch.median(x, dim=1), distinct(4, 5)),
    case("count_nonzero", lambda x: torch.count_nonzero(x, dim=0), ri(0, 2, 4, 5)),
    case("unique", lambda x: torch.unique(x, return_inverse=True, return_counts=True),
         ri(0, 6, 20)),
]

ELEMENTWISE = [
    *[case(f"bitwise_{n}_int", lambda a, b, op=op: op(a, b), ri(-50, 50, 10), ri(-50, 50, 10))
      for n, op in (("and", torch.bitwise_and), ("or", torch.bitwise_or),
                    ("xor", torch.bitwise_xor))],
    case("bitwise_and_bool", torch.bitwise_and, ri(0, 2, 10).bool(), ri(0, 2, 10).bool()),
    case("bitwise_not", torch.bitwise_not, ri(-50, 50, 10)),
    case("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), rn(10) * 5, pos(10)),
    case("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), rn(10) * 5, pos(10)),
    case("floor_divide_int", torch.floor_divide, ri(-20, 20, 10), ri(1, 5, 10)),
    case("fmod", lambda a: torch.fmod(a, 1.5), rn(10) * 4),
    case("atan2", torch.atan2, rn(10), rn(10)),
    case("trunc", torch.trunc, rn(10) * 4),
    case("log2", torch.log2, pos(10)),
    case("log10", torch.log10, pos(10)),
    case("nan_to_num", lambda x: torch.nan_to_num(x, nan=0.5, posinf=9.0),
         torch.tensor([1.0, math.nan, math.inf, -math.inf, -2.0]), grad=False),
    case("clamp", lambda x: torch.clamp(x, -0.5, 0.5), rn(10)),  # backward: logical_and.out
    case("logical_and_in_place", lambda a, b: a.clone().logical_and_(b), rn(6), rn(6) > 0),
    case("softplus", lambda x: F.softplus(x, beta=2.0, threshold=3.0), rn(10) * 3),
    case("leaky_relu", lambda x: F.leaky_relu(x, 0.1), rn(10)),
    case("elu", F.elu, rn(10)),
    case("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.5), rn(10)),
    case("hardswish", F.hardswish, rn(10) * 4),
    case("mish", F.mish, rn(10)),
    case("logsigmoid", F.logsigmoid, rn(10) * 3),
    case("logit", torch.logit, torch.rand(10, generator=_gen)),
    case("logit_eps", lambda x: torch.logit(x, eps=0.2), torch.rand(10, generator=_gen)),
    *[case(n, getattr(torch, n), x) for n, x in (
        ("sinh", rn(10) * 3), ("cosh", rn(10) * 3), ("tan", rn(10)), ("asin", unit(10)),
        ("acos", unit(10)), ("atan", rn(10) * 3), ("asinh", rn(10) * 3), ("acosh", pos(10) + 1),
        ("atanh", unit(10)))],
    case("linspace", lambda device: torch.linspace(-1, 2, 7, device=device), factory=True),
    case("eye", lambda device: torch.eye(3, 4, device=device), factory=True),
]

CONV_POOL_NORM = [
    case("conv1d", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1), rn(2, 3, 9),
         rn(4, 3, 3), rn(4), atol=2e-5),
    case("conv2d_stride_padding", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
         rn(2, 3, 7, 6), rn(4, 3, 3, 3), rn(4), atol=2e-5),
    case("conv2d_dilation_groups", lambda x, w, b: F.conv2d(x, w, b, dilation=2, groups=2),
         rn(2, 4, 8, 8), rn(6, 2, 3, 3), rn(6), atol=2e-5),
    case("conv2d_depthwise", lambda x, w: F.conv2d(x, w, padding=1, groups=4), rn(2, 4, 6, 6),
         rn(4, 1, 3, 3), atol=2e-5),
    case("max_pool2d_indices", lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
         distinct(2, 3, 7, 7)),
    case("avg_pool2d", lambda x: F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False),
         rn(2, 3, 7, 7)),
    case("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (3, 2)), rn(2, 3, 7, 5)),
    case("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (3, 2), return_indices=True),
         distinct(2, 3, 6, 4)),
    case("adaptive_max_pool2d_uneven",
         lambda x: F.adaptive_max_pool2d(x, 3, return_indices=True), distinct(2, 3, 7, 5)),
    case("batch_norm_train", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
         rn(4, 3, 5, 5), rn(3), rn(3), atol=2e-5),
    case("batch_norm_eval", lambda x, m, v: F.batch_norm(x, m, v, training=False),
         rn(4, 3, 5, 5), rn(3), pos(3), atol=2e-5, grad=(0,)),
    case("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), rn(3, 4, 5, 6), rn(4), rn(4),
         atol=2e-5),
    case("instance_norm", lambda x: F.instance_norm(x), rn(3, 4, 5, 6), atol=2e-5),
    case("upsample_nearest", lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
         rn(2, 3, 4, 5)),
    case("pad_reflect", lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), rn(2, 3, 5, 6)),
    case("pad_replicate", lambda x: F.pad(x, (2, 1, 1, 2), mode="replicate"), rn(2, 3, 5, 6)),
]

LOSSES = [
    case("cross_entropy_label_smoothing",
         lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), rn(6, 5), ri(0, 5, 6)),
    case("cross_entropy_nd", lambda x, t: F.cross_entropy(x, t), rn(2, 5, 3, 4), ri(0, 5, 2, 3, 4)),
    case("binary_cross_entropy", lambda x, t: F.binary_cross_entropy(torch.sigmoid(x), t),
         rn(8), torch.rand(8, generator=_gen)),  # the target's gradient goes through logit
    case("binary_cross_entropy_with_logits",
         lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, pos_weight=w),
         rn(4, 3), torch.rand(4, 3, generator=_gen), pos(3), grad=(0, 1)),
    case("smooth_l1", lambda a, b: F.smooth_l1_loss(a, b, beta=0.5), rn(4, 5), rn(4, 5)),
    case("huber", lambda a, b: F.huber_loss(a, b, delta=0.7), rn(4, 5), rn(4, 5)),
]

def _grid(*shape):
    """Grid coordinates reaching past the input's edges (|v| up to ~1.3), so padding matters."""
    return torch.rand(*shape, generator=_gen) * 2.6 - 1.3


RESAMPLE = [
    case("upsample_bilinear", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
         rn(2, 3, 4, 5)),
    case("upsample_bilinear_align_corners_size",
         lambda x: F.interpolate(x, size=(7, 3), mode="bilinear", align_corners=True),
         rn(2, 3, 4, 5)),
    case("upsample_bilinear_downscale", lambda x: F.interpolate(x, size=(3, 2), mode="bilinear"),
         rn(1, 2, 7, 5)),
    case("upsample_bilinear_fractional_scale",
         lambda x: F.interpolate(x, scale_factor=(1.7, 0.6), mode="bilinear"), rn(1, 2, 5, 6)),
    case("upsample_bilinear_double", lambda x: F.interpolate(x, scale_factor=3, mode="bilinear"),
         rn(1, 2, 3, 4, dtype=torch.float64)),
    case("upsample_bicubic", lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"),
         rn(2, 3, 4, 5)),
    # half is interpolated in float and rounded once, as on CPU: the same bits
    *[case(f"upsample_{m}_half_in_float", lambda x, m=m: F.interpolate(x, scale_factor=2, mode=m),
           rn(1, 2, 5, 6, dtype=torch.float16), atol=0, rtol=0, grad=False)
      for m in ("bilinear", "bicubic")],
    case("upsample_bicubic_align_corners_size",
         lambda x: F.interpolate(x, size=(6, 9), mode="bicubic", align_corners=True),
         rn(1, 2, 4, 5)),
    case("upsample_bicubic_fractional_scale",
         lambda x: F.interpolate(x, scale_factor=(0.7, 1.6), mode="bicubic"), rn(1, 2, 6, 5)),
    case("upsample_linear1d", lambda x: F.interpolate(x, size=9, mode="linear"), rn(2, 3, 5)),
    *[case(f"grid_sample_{m}_{p}_{'align' if a else 'noalign'}",
           lambda x, g, m=m, p=p, a=a: F.grid_sample(x, g, mode=m, padding_mode=p,
                                                      align_corners=a),
           rn(2, 3, 5, 4), _grid(2, 3, 6, 2), atol=2e-5, rtol=2e-5, grad=(0, 1) if m != "nearest"
           else (0,))
      for m in ("bilinear", "nearest", "bicubic") for p in ("zeros", "border", "reflection")
      for a in (False, True)],
    case("grid_sample_nan_reads_zero", lambda x, g: F.grid_sample(x, g, align_corners=False),
         rn(1, 2, 3, 3), torch.tensor([[[[math.nan, 0.2], [0.1, -0.3]]]]), grad=False),
]

SCANS = [
    case("cummax", lambda x: torch.cummax(x, 1), distinct(3, 6)),
    case("cummin", lambda x: torch.cummin(x, 0), distinct(5, 3)),
    case("cummax_ties_take_the_later_index", lambda x: torch.cummax(x, 0),
         ri(0, 3, 9).float()),
    case("cummin_nan_stays", lambda x: torch.cummin(x, 0),
         torch.tensor([3.0, 1.0, math.nan, 0.0, math.nan, -1.0]), grad=False),
    case("cummax_int", lambda x: torch.cummax(x, -1), ri(-9, 9, 2, 7)),
    case("logcumsumexp", lambda x: torch.logcumsumexp(x, 1), rn(3, 6)),
    case("logcumsumexp_wide_range", lambda x: torch.logcumsumexp(x, 0), rn(11, 2) * 60,
         atol=1e-4),
    case("logcumsumexp_infinities", lambda x: torch.logcumsumexp(x, 0),
         torch.tensor([-math.inf, -math.inf, 1.0, math.inf, 2.0]), grad=False),
]

SPECIAL = [
    case("erfinv", torch.erfinv, unit(20)),
    case("erfinv_edges", torch.erfinv, torch.tensor([-1.0, 1.0, 1.5, 0.0, 0.999999]),
         grad=False),
    case("erfinv_double", torch.erfinv, unit(20).double(), atol=1e-10, rtol=1e-10),
    case("lgamma", torch.lgamma, rn(20) * 4),
    case("lgamma_poles", torch.lgamma, torch.tensor([0.0, -1.0, -2.0, 1.0, 2.0, math.inf]),
         grad=False),
    case("digamma", torch.digamma, rn(20) * 4, atol=1e-4, rtol=1e-4),
    case("digamma_poles", torch.digamma, torch.tensor([0.0, -0.0, -3.0, 1.0]), grad=False),
    case("polygamma_1", lambda x: torch.polygamma(1, x), pos(20) * 3, atol=1e-4, rtol=1e-4),
    case("polygamma_2", lambda x: torch.polygamma(2, x), pos(20) * 3, atol=1e-4, rtol=1e-4),
    case("lgamma_double", torch.lgamma, pos(20).double() * 10, atol=1e-10, rtol=1e-10),
    case("erfinv_in_place", lambda x: x.clone().erfinv_(), unit(8)),
]

BUCKETING = [
    case("searchsorted", torch.searchsorted, torch.arange(10.0), rn(5) * 5),
    case("searchsorted_right_ties", lambda s, v: torch.searchsorted(s, v, right=True),
         torch.tensor([0.0, 1.0, 1.0, 2.0, 3.0]), torch.tensor([1.0, -1.0, 3.0, 2.5, math.nan])),
    case("searchsorted_nd_int32", lambda s, v: torch.searchsorted(s, v, out_int32=True),
         rn(3, 6).sort().values, rn(3, 4)),
    case("searchsorted_sorter", lambda s, v: torch.searchsorted(s, v, sorter=s.argsort()),
         rn(7), rn(4)),
    case("bucketize", lambda v, b: torch.bucketize(v, b), rn(3, 4), torch.tensor([-1.0, 0, 0.5])),
    case("bucketize_right", lambda v, b: torch.bucketize(v, b, right=True),
         torch.tensor([-1.0, 0.0, 0.2, 0.5, 2.0]), torch.tensor([-1.0, 0, 0.5])),
    case("histc", lambda x: torch.histc(x, 5), rn(40)),
    case("histc_range", lambda x: torch.histc(x, 4, min=-1, max=1), rn(40)),
    case("bincount", torch.bincount, ri(0, 6, 20)),
    case("bincount_weights_minlength", lambda i, w: torch.bincount(i, w, minlength=9),
         ri(0, 6, 20), rn(20), grad=False),  # bincount has no derivative, on CPU either
]

# Beyond the list: ops the op survey found on the fallback that model code uses (EMA
# updates, attention scores, shifted windows).
FROM_THE_SURVEY = [
    case("lerp_tensor_weight", torch.lerp, rn(4, 5), rn(4, 5), torch.rand(4, 5, generator=_gen)),
    case("lerp_tensor_weight_in_place", lambda a, b, w: a.clone().lerp_(b, w), rn(6), rn(6),
         rn(6)),
    case("baddbmm", lambda s, a, b: torch.baddbmm(s, a, b, beta=0.5, alpha=2.0), rn(2, 3, 4),
         rn(2, 3, 5), rn(2, 5, 4), atol=2e-5),
    case("baddbmm_beta_zero_ignores_nan", lambda s, a, b: torch.baddbmm(s, a, b, beta=0),
         torch.full((1, 3, 4), math.nan), rn(2, 3, 5), rn(2, 5, 4), atol=2e-5, grad=(1, 2)),
    case("addmv", lambda s, m, v: torch.addmv(s, m, v, beta=0.5, alpha=2.0), rn(3), rn(3, 5),
         rn(5)),
    case("addmv_broadcast_self", torch.addmv, rn(1), rn(3, 5), rn(5)),
    case("addmv_beta_zero_ignores_nan", lambda s, m, v: torch.addmv(s, m, v, beta=0),
         torch.full((3,), math.nan), rn(3, 5), rn(5), grad=(1, 2)),
    case("addbmm", lambda s, a, b: torch.addbmm(s, a, b, beta=0.5, alpha=2.0), rn(3, 4),
         rn(2, 3, 5), rn(2, 5, 4), atol=2e-5),
    case("addbmm_broadcast_self", torch.addbmm, rn(4), rn(3, 3, 2), rn(3, 2, 4), atol=2e-5),
    case("roll", lambda x: torch.roll(x, (2, -1), (0, 2)), rn(4, 3, 5)),
    case("roll_flat", lambda x: torch.roll(x, 7), rn(3, 4)),
    case("roll_past_size", lambda x: torch.roll(x, (13, -8, 0), (1, 0, 1)), rn(5, 6)),
]

CASES = INDEXING + REDUCTIONS + ELEMENTWISE + CONV_POOL_NORM + LOSSES + RESAMPLE + SCANS + \
    SPECIAL + BUCKETING + FROM_THE_SURVEY



@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_op_matches_cpu_with_no_fallback(mode, c):
    assert compare(c) == {}, c.name


def test_logcumsumexp_over_a_length_one_dim_is_a_new_tensor(mode):
    x = torch.randn(3, 1).to("tpu")
    y = torch.logcumsumexp(x, 1)
    y.add_(1)
    check(x, y.cpu() - 1)


def test_special_function_in_place_on_an_integer_tensor_raises_as_on_cpu(mode):
    for t in (torch.arange(3), torch.arange(3).to("tpu")):
        with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired "
                           "output type Long"):
            t.lgamma_()


class Random(NamedTuple):
    """A random op: draw(device) gives tensors; stats(tensors) asserts their distribution."""
    name: str
    draw: Callable
    stats: Callable


def _close(a, b, tol):
    assert abs(float(a) - b) < tol, (float(a), b)


def _dropout_with_grad(device):
    x = torch.ones(20_000, device=device, requires_grad=True)
    y = torch.ops.aten.native_dropout(x, 0.3, True)
    y[0].backward(torch.full_like(y[0], 2.0))
    return y[0].detach(), y[1], x.grad


def _dropout_stats(y, mask, grad):
    assert mask.dtype == torch.bool
    _close((y == 0).float().mean(), 0.3, 0.015)
    assert torch.equal(y != 0, mask)
    torch.testing.assert_close(y[mask], torch.full_like(y[mask], 1 / 0.7))
    torch.testing.assert_close(grad, y * 2)


def _uniform(lo, hi):
    def stats(u):
        assert lo <= u.min() and u.max() < hi
        _close(u.float().mean(), (lo + hi) / 2, 0.03 * (hi - lo))
    return stats


def _normal(mean, std):
    def stats(z):
        _close(z.mean(), mean, 0.05 * std)
        _close(z.std(), std, 0.05 * std)
    return stats


def _ints(lo, hi):
    def stats(r):
        assert r.dtype == torch.int64 and r.min() == lo and r.max() == hi - 1
    return stats


def _frequencies(p):
    def stats(s):
        assert s.dtype == torch.int64
        counts = torch.bincount(s, minlength=len(p)).double() / s.numel()
        torch.testing.assert_close(counts, torch.tensor(p, dtype=torch.float64), atol=0.015,
                                   rtol=0)
    return stats


def _distinct_draws_of_nonzero_categories(s):
    """Without replacement: no category twice in a row, never the zero-probability one, and
    the first draw follows p (5/11 for category 4)."""
    assert all(len(set(row)) == len(row) for row in s.tolist())
    assert not (s == 1).any()
    _close((s[:, 0] == 4).double().mean(), 5 / 11, 0.03)


RANDOM = [
    Random("rand", lambda d: torch.rand(20_000, device=d), _uniform(0.0, 1.0)),
    Random("randn", lambda d: torch.randn(20_000, device=d, dtype=torch.float64), _normal(0, 1)),
    Random("normal_", lambda d: torch.empty(20_000, device=d).normal_(3.0, 2.0), _normal(3, 2)),
    Random("uniform_", lambda d: torch.empty(20_000, device=d).uniform_(-2, 3),
           _uniform(-2.0, 3.0)),
    Random("random_", lambda d: torch.empty(20_000, device=d, dtype=torch.long).random_(-4, 6),
           _ints(-4, 6)),
    Random("randint", lambda d: torch.randint(0, 10, (20_000,), device=d), _ints(0, 10)),
    Random("randperm", lambda d: torch.randperm(300, device=d),
           lambda p: torch.testing.assert_close(p.sort().values, torch.arange(300))),
    Random("bernoulli", lambda d: torch.bernoulli(torch.full((20_000,), 0.3, device=d)),
           lambda b: _close(b.mean(), 0.3, 0.015)),
    Random("bernoulli_p", lambda d: torch.empty(20_000, device=d).bernoulli_(0.75),
           lambda b: _close(b.mean(), 0.75, 0.015)),
    Random("native_dropout_and_backward", _dropout_with_grad, _dropout_stats),
    Random("multinomial_with_replacement",
           lambda d: torch.multinomial(torch.tensor([0.0, 1.0, 2.0, 0.0], device=d), 30_000, True),
           _frequencies([0.0, 1 / 3, 2 / 3, 0.0])),
    Random("multinomial_without_replacement",
           lambda d: torch.multinomial(torch.tensor([[1.0, 0, 3, 2, 5]] * 4000, device=d), 3),
           _distinct_draws_of_nonzero_categories),
]


@pytest.mark.parametrize("r", RANDOM, ids=[r.name for r in RANDOM])
def test_random_op_has_cpus_shape_and_dtype_its_statistics_and_repeats_in_every_mode(r):
    want = flat(r.draw("cpu"))
    draws = {}
    for m in MODES:
        with deferfuse_torch.mode(m):
            deferfuse_torch.reset_fallback_counts()
            torch.manual_seed(21)
            draws[m] = [t.cpu() for t in flat(r.draw("tpu"))]
            assert deferfuse_torch.fallback_counts() == {}, m
    for got, w in zip(draws["strict"], want):
        assert (got.dtype, got.shape) == (w.dtype, w.shape)
    r.stats(*draws["strict"])
    for m in ("debug", "defer"):
        for a, b in zip(draws["strict"], draws[m]):
            assert torch.equal(a, b), (r.name, m)


# Ops of the list that still run on the CPU fallback, with why; the README's list of
# fallback ops names each one (its `readme` word).
class Fallback(NamedTuple):
    case: Case
    reason: str
    readme: str


FALLBACK: list = []  # every op of the list has a tpu kernel now


@pytest.mark.parametrize("f", FALLBACK, ids=[f.case.name for f in FALLBACK])
def test_op_still_on_the_fallback_gives_cpus_values(f):
    """Fails once the op gains a kernel: then move it to CASES and off the README's list."""
    assert compare(f.case) != {}, f"{f.case.name} no longer falls back: move it to CASES"


def test_readme_lists_every_op_still_on_the_fallback():
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("Ops known to still run on the CPU fallback")
    listed = readme[start:readme.index("\n\n", start)]
    for f in FALLBACK:
        assert f.readme in listed, f"README's fallback list does not name {f.readme}"
