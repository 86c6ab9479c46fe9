"""Survey of commonly used PyTorch ops on the "tpu" device: each case runs once on tpu and on
CPU (forward, and backward through every floating output when an input requires grad) and is
classed as

  native    same values as CPU (and same gradients) with no op on the CPU fallback
  fallback  same values, but some op ran on the CPU fallback (named in the listing)
  wrong     a value, dtype or shape differs from CPU
  error     the tpu run raised where CPU did not

Random ops are compared by shape and dtype only (the device has its own generator). The counts
and the names in each class are printed; --json prints them as JSON. This is the yardstick of
issue 14 ("Real models run on device 'tpu' with no CPU fallback"); tests/test_op_coverage.py
holds the ops that must stay native.

Usage: python op_survey.py [--mode strict|debug|defer] [--json] [--verbose]"""

import argparse
import json
import math
import sys
import traceback

import torch
import torch.nn.functional as F

import deferfuse_torch

_g = torch.Generator().manual_seed(0)


def rn(*s):
    return torch.randn(*s, generator=_g)


def pos(*s):
    return torch.rand(*s, generator=_g) * 2 + 0.1


def unit(*s):
    return torch.rand(*s, generator=_g) * 1.8 - 0.9


def ri(lo, hi, *s):
    return torch.randint(lo, hi, s, generator=_g)


def distinct(*s):
    n = math.prod(s)
    return (torch.randperm(n, generator=_g).float() / n - 0.5).view(s)


CASES = []  # (name, fn, inputs or "factory", grad, random)


def case(name, fn, *inputs, grad=True, random=False):
    CASES.append((name, fn, inputs, grad, random))


# Elementwise unary functions of torch, with an input in each one's domain.
for n in ["abs", "neg", "exp", "exp2", "expm1", "sin", "cos", "tan", "tanh", "sinh", "cosh",
          "atan", "asinh", "sigmoid", "relu", "floor", "ceil", "round", "trunc", "frac", "sign",
          "sgn", "square", "erf", "erfc", "special.expit", "nn.functional.silu",
          "nn.functional.gelu", "nn.functional.mish", "nn.functional.softsign",
          "nn.functional.tanhshrink", "nn.functional.hardsigmoid", "nn.functional.hardswish",
          "nn.functional.relu6", "nn.functional.selu", "nn.functional.celu",
          "nn.functional.elu", "nn.functional.logsigmoid", "nn.functional.softplus",
          "nn.functional.hardtanh", "nn.functional.leaky_relu", "nn.functional.hardshrink",
          "nn.functional.softshrink", "deg2rad", "rad2deg", "positive", "signbit", "isfinite",
          "isinf", "isnan", "isneginf", "isposinf", "nan_to_num", "fix", "special.ndtr",
          "special.log_ndtr", "special.i0", "i0", "special.entr", "special.sinc", "sinc"]:
    case(n, eval("torch." + n), rn(3, 4) * 2)
for n in ["log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "lgamma", "digamma",
          "acosh", "special.xlog1py"]:
    f = eval("torch." + n)
    if n == "special.xlog1py":
        case(n, f, pos(3, 4), pos(3, 4))
    elif n == "acosh":
        case(n, f, pos(3, 4) + 1)
    else:
        case(n, f, pos(3, 4))
for n in ["asin", "acos", "atanh", "erfinv", "logit"]:
    case(n, eval("torch." + n), unit(3, 4))

# Binary and ternary elementwise.
for n in ["add", "sub", "mul", "div", "maximum", "minimum", "fmax", "fmin", "atan2", "hypot",
          "copysign", "pow", "xlogy", "remainder", "fmod", "eq", "ne", "lt", "le", "gt", "ge",
          "logaddexp", "logaddexp2", "nextafter", "float_power", "true_divide", "heaviside"]:
    a, b = (rn(3, 4), pos(3, 4)) if n in ("pow", "float_power", "xlogy") else (rn(3, 4),
                                                                               rn(3, 4))
    case(n, eval("torch." + n), a.abs() + 0.1 if n in ("pow", "float_power") else a, b,
         grad=n not in ("nextafter", "heaviside", "float_power"))
for n in ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
          "bitwise_right_shift", "gcd", "lcm", "floor_divide"]:
    case(n, eval("torch." + n), ri(1, 50, 10), ri(1, 5, 10))
for n in ["logical_and", "logical_or", "logical_xor"]:
    case(n, eval("torch." + n), rn(10) > 0, rn(10) > 0)
case("logical_not", torch.logical_not, rn(10) > 0)
case("bitwise_not", torch.bitwise_not, ri(-9, 9, 10))
case("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), rn(10), pos(10))
case("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), rn(10), pos(10))
case("where", lambda c, a, b: torch.where(c, a, b), rn(3, 4) > 0, rn(3, 4), rn(3, 4))
case("clamp", lambda x: torch.clamp(x, -0.5, 0.5), rn(3, 4))
case("clamp_tensor", lambda x, lo: torch.clamp(x, min=lo), rn(3, 4), rn(4))
case("lerp", torch.lerp, rn(5), rn(5), pos(5) / 3)
case("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.5), rn(5), rn(5), rn(5))
case("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c, value=0.5), rn(5), rn(5), pos(5))
case("polar", torch.polar, pos(4), rn(4), grad=False)
case("isclose", lambda a, b: torch.isclose(a, b), rn(5), rn(5))
case("clone", torch.clone, rn(3, 4))
case("to_double", lambda x: x.double(), rn(3, 4))
case("to_half", lambda x: x.half(), rn(3, 4))
case("to_bf16", lambda x: x.bfloat16(), rn(3, 4))
case("to_int", lambda x: (x * 5).int(), rn(3, 4))

# Reductions and scans.
for n in ["sum", "mean", "prod", "amax", "amin", "std", "var", "norm", "logsumexp", "nansum",
          "nanmean", "argmax", "argmin", "max", "min", "median", "nanmedian", "all", "any",
          "count_nonzero", "aminmax", "std_mean", "var_mean"]:
    f = eval("torch." + n)
    if n in ("logsumexp",):
        case(n, lambda x, f=f: f(x, 1), distinct(4, 5))
    elif n in ("all", "any"):
        case(n, f, rn(4, 5) > 0)
    elif n == "aminmax":
        case(n, lambda x: torch.aminmax(x, dim=1), distinct(4, 5))
    else:
        case(n, f, distinct(4, 5))
        if n not in ("count_nonzero",):
            case(n + "_dim", lambda x, f=f: f(x, 1), distinct(4, 5))
for n in ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"]:
    case(n, lambda x, f=eval("torch." + n): f(x, 1), distinct(3, 6) + 1)
case("sort", lambda x: torch.sort(x, 1), distinct(3, 6))
case("argsort", lambda x: torch.argsort(x, 1), distinct(3, 6))
case("sort_stable", lambda x: torch.sort(x, stable=True), ri(0, 3, 12))
case("topk", lambda x: torch.topk(x, 2), distinct(3, 6))
case("kthvalue", lambda x: torch.kthvalue(x, 2), distinct(3, 6))
case("msort", torch.msort, distinct(4, 3))
case("unique", lambda x: torch.unique(x, return_counts=True), ri(0, 5, 20))
case("unique_consecutive", torch.unique_consecutive, ri(0, 3, 20))
case("bincount", torch.bincount, ri(0, 6, 20))
case("histc", lambda x: torch.histc(x, 5), rn(20))
case("searchsorted", torch.searchsorted, torch.arange(10.0), rn(5) * 5)
case("bucketize", lambda x, b: torch.bucketize(x, b), rn(5) * 5, torch.arange(10.0))
case("vector_norm_1", lambda x: torch.linalg.vector_norm(x, 1, dim=1), rn(4, 5))
case("vector_norm_inf", lambda x: torch.linalg.vector_norm(x, math.inf), distinct(4, 5))
case("normalize", lambda x: F.normalize(x, dim=1), rn(4, 5))
case("diff", torch.diff, rn(4, 5))
case("trace", torch.trace, rn(4, 4))
case("dist", torch.dist, rn(4), rn(4))
case("cdist", torch.cdist, rn(3, 4), rn(5, 4))
case("cosine_similarity", F.cosine_similarity, rn(3, 4), rn(3, 4))
case("pairwise_distance", F.pairwise_distance, rn(3, 4), rn(3, 4))

# Shapes and views.
case("cat", lambda a, b: torch.cat([a, b], 1), rn(3, 2), rn(3, 4))
case("stack", lambda a, b: torch.stack([a, b]), rn(3, 2), rn(3, 2))
case("split", lambda x: torch.split(x, 2, 1), rn(3, 5))
case("chunk", lambda x: torch.chunk(x, 2, 0), rn(4, 3))
case("unbind", torch.unbind, rn(3, 2))
case("flip", lambda x: torch.flip(x, (0, 1)), rn(3, 4))
case("roll", lambda x: torch.roll(x, 2, 1), rn(3, 4))
case("rot90", torch.rot90, rn(3, 4))
case("tril", torch.tril, rn(4, 4))
case("triu", lambda x: torch.triu(x, 1), rn(4, 4))
case("diag", torch.diag, rn(4))
case("diagonal", torch.diagonal, rn(4, 4))
case("diag_embed", torch.diag_embed, rn(2, 3))
case("repeat", lambda x: x.repeat(2, 3), rn(2, 3))
case("repeat_interleave", lambda x: x.repeat_interleave(2, 0), rn(2, 3))
case("tile", lambda x: torch.tile(x, (2,)), rn(3))
case("expand", lambda x: x.expand(3, 4).contiguous(), rn(1, 4))
case("permute", lambda x: x.permute(2, 0, 1).contiguous(), rn(2, 3, 4))
case("transpose", lambda x: x.t().contiguous(), rn(3, 4))
case("reshape", lambda x: x.reshape(4, 3), rn(3, 4))
case("flatten", lambda x: x.flatten(1), rn(2, 3, 4))
case("narrow", lambda x: x.narrow(1, 1, 2), rn(3, 4))
case("unfold", lambda x: x.unfold(1, 2, 1).contiguous(), rn(3, 5))
case("movedim", lambda x: torch.movedim(x, 0, 2).contiguous(), rn(2, 3, 4))
case("squeeze_unsqueeze", lambda x: x.unsqueeze(0).squeeze(1), rn(3, 1, 4))
case("select_scatter", lambda x, s: torch.select_scatter(x, s, 0, 1), rn(3, 4), rn(4))
case("slice_scatter", lambda x, s: torch.slice_scatter(x, s, 1, 0, 2), rn(3, 4), rn(3, 2))
case("diagonal_scatter", lambda x, s: torch.diagonal_scatter(x, s), rn(3, 3), rn(3))
case("meshgrid", lambda a, b: torch.meshgrid(a, b, indexing="ij"), rn(3), rn(4))
case("cartesian_prod", torch.cartesian_prod, rn(2), rn(3))
case("broadcast_to", lambda x: torch.broadcast_to(x, (3, 4)).contiguous(), rn(4))
case("atleast_2d", torch.atleast_2d, rn(4))
case("column_stack", lambda a, b: torch.column_stack([a, b]), rn(3), rn(3))

# Indexing.
case("index_select", lambda x, i: x.index_select(0, i), rn(5, 3), ri(0, 5, 4))
case("gather", lambda x, i: torch.gather(x, 1, i), rn(3, 5), ri(0, 5, 3, 2))
case("scatter", lambda x, i, s: x.scatter(1, i, s), rn(3, 5), ri(0, 5, 3, 2), rn(3, 2))
case("scatter_add", lambda x, i, s: x.scatter_add(1, i, s), rn(3, 5), ri(0, 5, 3, 4), rn(3, 4))
case("scatter_reduce_amax", lambda x, i, s: x.scatter_reduce(1, i, s, "amax"), rn(3, 5),
     ri(0, 5, 3, 4), rn(3, 4), grad=False)
case("index_add", lambda x, i, s: x.index_add(0, i, s), rn(5, 3), ri(0, 5, 4), rn(4, 3))
case("index_copy", lambda x, i, s: x.index_copy(0, i, s), rn(5, 3), torch.tensor([4, 0]),
     rn(2, 3))
case("index_fill", lambda x, i: x.index_fill(1, i, 2.0), rn(3, 5), torch.tensor([0, 3]))
case("index_put", lambda x, v: x.index_put((torch.tensor([0, 2], device=x.device),), v),
     rn(4, 3), rn(3))
case("getitem_tensor", lambda x, i: x[i], rn(5, 3), ri(0, 5, 4))
case("getitem_mask", lambda x, m: x[m], rn(4, 3), rn(4, 3) > 0)
case("getitem_slice_step", lambda x: x[::2, 1:], rn(5, 3))
case("masked_fill", lambda x, m: x.masked_fill(m, 0.0), rn(4, 3), rn(4, 3) > 0)
case("masked_select", torch.masked_select, rn(4, 3), rn(4, 3) > 0)
case("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), rn(4, 3), rn(4, 3) > 0,
     rn(12))
case("nonzero", torch.nonzero, rn(4, 3) > 0)
case("argwhere", torch.argwhere, rn(4, 3) > 0)
case("take", torch.take, rn(4, 3), ri(0, 12, 5))
case("take_along_dim", lambda x, i: torch.take_along_dim(x, i, 1), rn(3, 5), ri(0, 5, 3, 2))
case("isin", torch.isin, ri(0, 10, 12), torch.tensor([1, 4, 7]))
case("embedding", lambda w, i: F.embedding(i, w), rn(10, 4), ri(0, 10, 3, 5))
case("embedding_bag", lambda w, i: F.embedding_bag(i, w, torch.tensor([0, 3], device=i.device)),
     rn(10, 4), ri(0, 10, 6))
case("one_hot", lambda i: F.one_hot(i, 5), ri(0, 5, 6))

# Factories.
for n, fn in [("zeros", lambda d: torch.zeros(3, 4, device=d)),
              ("ones", lambda d: torch.ones(3, 4, device=d)),
              ("full", lambda d: torch.full((3,), 2.5, device=d)),
              ("arange", lambda d: torch.arange(2, 11, 3, device=d)),
              ("linspace", lambda d: torch.linspace(0, 1, 7, device=d)),
              ("logspace", lambda d: torch.logspace(0, 2, 5, device=d)),
              ("eye", lambda d: torch.eye(3, 4, device=d)),
              ("tril_indices", lambda d: torch.tril_indices(3, 3, device=d)),
              ("empty_like_fill", lambda d: torch.empty(3, device=d).fill_(1.5)),
              ("zeros_like", lambda d: torch.zeros_like(torch.ones(2, device=d)))]:
    CASES.append((n, fn, "factory", False, False))

# Random.
for n, fn in [("rand", lambda d: torch.rand(100, device=d)),
              ("randn", lambda d: torch.randn(100, device=d)),
              ("randint", lambda d: torch.randint(0, 9, (100,), device=d)),
              ("randperm", lambda d: torch.randperm(20, device=d)),
              ("normal_", lambda d: torch.empty(100, device=d).normal_()),
              ("uniform_", lambda d: torch.empty(100, device=d).uniform_()),
              ("random_", lambda d: torch.empty(100, device=d).random_(0, 5)),
              ("exponential_", lambda d: torch.empty(100, device=d).exponential_()),
              ("bernoulli", lambda d: torch.bernoulli(torch.full((100,), 0.3, device=d))),
              ("dropout", lambda d: F.dropout(torch.ones(100, device=d), 0.5)),
              ("multinomial", lambda d: torch.multinomial(torch.ones(5, device=d), 3)),
              ("rand_like", lambda d: torch.rand_like(torch.ones(10, device=d))),
              ("normal_tensor", lambda d: torch.normal(torch.zeros(10, device=d), 1.0)),
              ("poisson", lambda d: torch.poisson(torch.full((10,), 3.0, device=d)))]:
    CASES.append((n, fn, "factory", False, True))

# Linear algebra.
case("mm", torch.mm, rn(3, 4), rn(4, 5))
case("bmm", torch.bmm, rn(2, 3, 4), rn(2, 4, 5))
case("matmul_broadcast", torch.matmul, rn(2, 3, 4), rn(4, 5))
case("mv", torch.mv, rn(3, 4), rn(4))
case("dot", torch.dot, rn(4), rn(4))
case("addmm", torch.addmm, rn(5), rn(3, 4), rn(4, 5))
case("baddbmm", torch.baddbmm, rn(2, 3, 5), rn(2, 3, 4), rn(2, 4, 5))
case("outer", torch.outer, rn(3), rn(4))
case("einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b), rn(2, 3, 4), rn(2, 4, 5))
case("tensordot", lambda a, b: torch.tensordot(a, b, dims=1), rn(3, 4), rn(4, 5))
case("kron", torch.kron, rn(2, 2), rn(2, 3))
case("linear", F.linear, rn(3, 4), rn(5, 4), rn(5))
case("bilinear", F.bilinear, rn(3, 4), rn(3, 2), rn(5, 4, 2), rn(5))
case("linalg_inv", torch.linalg.inv, rn(3, 3) + 3 * torch.eye(3))
case("linalg_solve", torch.linalg.solve, rn(3, 3) + 3 * torch.eye(3), rn(3, 2))
case("cholesky", lambda a: torch.linalg.cholesky(a @ a.mT + torch.eye(3, device=a.device)),
     rn(3, 3))
case("det", torch.linalg.det, rn(3, 3))
case("qr", torch.linalg.qr, rn(4, 3), grad=False)
case("matrix_norm", torch.linalg.matrix_norm, rn(3, 3))

# Neural network ops.
case("softmax", lambda x: F.softmax(x, -1), rn(3, 5))
case("log_softmax", lambda x: F.log_softmax(x, -1), rn(3, 5))
case("softmin", lambda x: F.softmin(x, -1), rn(3, 5))
case("layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b), rn(3, 5), rn(5), rn(5))
case("rms_norm", lambda x, w: F.rms_norm(x, (5,), w), rn(3, 5), rn(5))
case("group_norm", lambda x: F.group_norm(x, 2), rn(2, 4, 3, 3))
case("instance_norm", F.instance_norm, rn(2, 3, 4, 4))
case("batch_norm_train", lambda x: F.batch_norm(x, None, None, training=True), rn(4, 3, 2, 2))
case("batch_norm_eval", lambda x, m, v: F.batch_norm(x, m, v), rn(4, 3), rn(3), pos(3),
     grad=False)
case("local_response_norm", lambda x: F.local_response_norm(x, 2), rn(2, 4, 3, 3))
case("dropout_eval", lambda x: F.dropout(x, 0.5, training=False), rn(4))
case("conv1d", F.conv1d, rn(2, 3, 8), rn(4, 3, 3))
case("conv2d", lambda x, w: F.conv2d(x, w, stride=2, padding=1), rn(2, 3, 7, 7),
     rn(4, 3, 3, 3))
case("conv2d_groups", lambda x, w: F.conv2d(x, w, groups=2, dilation=2), rn(1, 4, 7, 7),
     rn(4, 2, 2, 2))
case("conv3d", F.conv3d, rn(1, 2, 4, 4, 4), rn(3, 2, 2, 2, 2))
case("conv_transpose2d", lambda x, w: F.conv_transpose2d(x, w, stride=2), rn(1, 3, 4, 4),
     rn(3, 2, 3, 3))
case("max_pool1d", lambda x: F.max_pool1d(x, 2), distinct(2, 3, 8))
case("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1), distinct(2, 3, 7, 7))
case("max_pool3d", lambda x: F.max_pool3d(x, 2), distinct(1, 2, 4, 4, 4))
case("avg_pool1d", lambda x: F.avg_pool1d(x, 2), rn(2, 3, 8))
case("avg_pool2d", lambda x: F.avg_pool2d(x, 2), rn(2, 3, 6, 6))
case("avg_pool3d", lambda x: F.avg_pool3d(x, 2), rn(1, 2, 4, 4, 4))
case("adaptive_avg_pool1d", lambda x: F.adaptive_avg_pool1d(x, 3), rn(2, 3, 7))
case("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (1, 1)), rn(2, 3, 5, 5))
case("adaptive_avg_pool2d_uneven", lambda x: F.adaptive_avg_pool2d(x, 3), rn(2, 3, 7, 5))
case("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, 2), distinct(2, 3, 6, 4))
case("adaptive_max_pool2d_uneven", lambda x: F.adaptive_max_pool2d(x, 3), distinct(2, 3, 7, 5))
case("lp_pool2d", lambda x: F.lp_pool2d(x, 2, 2), pos(1, 2, 4, 4))
case("pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), rn(1, 8, 3, 3))
case("pixel_unshuffle", lambda x: F.pixel_unshuffle(x, 2), rn(1, 2, 4, 4))
case("unfold_im2col", lambda x: F.unfold(x, 2), rn(1, 2, 4, 4))
case("fold_col2im", lambda x: F.fold(x, (3, 3), 2), rn(1, 8, 4))
case("interpolate_nearest", lambda x: F.interpolate(x, scale_factor=2), rn(1, 2, 3, 3))
case("interpolate_bilinear", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
     rn(1, 2, 3, 3))
case("interpolate_bilinear_ac", lambda x: F.interpolate(x, size=(5, 4), mode="bilinear",
                                                        align_corners=True), rn(1, 2, 3, 3))
case("interpolate_bicubic", lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"),
     rn(1, 2, 3, 3))
case("interpolate_linear", lambda x: F.interpolate(x, scale_factor=2, mode="linear"),
     rn(1, 2, 5))
case("grid_sample", lambda x, g: F.grid_sample(x, g, align_corners=False), rn(1, 2, 4, 4),
     unit(1, 3, 3, 2))
case("affine_grid", lambda t: F.affine_grid(t, (1, 1, 3, 3), align_corners=False), rn(1, 2, 3))
case("pad_constant", lambda x: F.pad(x, (1, 2)), rn(2, 3))
case("pad_reflect", lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"), rn(1, 2, 4, 4))
case("pad_replicate", lambda x: F.pad(x, (1, 2, 2, 1), mode="replicate"), rn(1, 2, 4, 4))
case("pad_circular", lambda x: F.pad(x, (1, 2, 2, 1), mode="circular"), rn(1, 2, 4, 4))
case("glu", F.glu, rn(3, 4))
case("prelu", F.prelu, rn(2, 3, 4), pos(3))
case("rrelu_eval", lambda x: F.rrelu(x, training=False), rn(10))
case("threshold", lambda x: F.threshold(x, 0.1, 20.0), rn(10))
case("sdpa", F.scaled_dot_product_attention, rn(1, 2, 4, 8), rn(1, 2, 4, 8), rn(1, 2, 4, 8))
case("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     rn(1, 2, 4, 8), rn(1, 2, 4, 8), rn(1, 2, 4, 8))
case("multi_head_attention",
     lambda x, w, b, o, ob: F.multi_head_attention_forward(
         x, x, x, 4, 2, w, b, None, None, False, 0.0, o, ob, need_weights=False)[0],
     rn(3, 1, 4), rn(12, 4), rn(12), rn(4, 4), rn(4))

# Losses.
case("mse_loss", F.mse_loss, rn(4, 3), rn(4, 3))
case("l1_loss", F.l1_loss, rn(4, 3), rn(4, 3))
case("smooth_l1_loss", F.smooth_l1_loss, rn(4, 3), rn(4, 3))
case("huber_loss", F.huber_loss, rn(4, 3), rn(4, 3))
case("cross_entropy", F.cross_entropy, rn(4, 5), ri(0, 5, 4))
case("cross_entropy_smoothing", lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
     rn(4, 5), ri(0, 5, 4))
case("cross_entropy_probs", lambda x, t: F.cross_entropy(x, t.softmax(-1)), rn(4, 5),
     rn(4, 5))
case("cross_entropy_2d", F.cross_entropy, rn(2, 5, 3, 3), ri(0, 5, 2, 3, 3))
case("cross_entropy_ignore", lambda x, t: F.cross_entropy(x, t, ignore_index=1), rn(6, 5),
     ri(0, 5, 6))
case("nll_loss", F.nll_loss, rn(4, 5).log_softmax(-1), ri(0, 5, 4))
case("binary_cross_entropy", lambda x, t: F.binary_cross_entropy(x.sigmoid(), t), rn(6),
     torch.rand(6, generator=_g))
case("bce_with_logits", F.binary_cross_entropy_with_logits, rn(6), torch.rand(6, generator=_g))
case("kl_div", lambda x, t: F.kl_div(x, t, reduction="batchmean"), rn(3, 4).log_softmax(-1),
     rn(3, 4).softmax(-1))
case("soft_margin_loss", F.soft_margin_loss, rn(6), torch.randn(6, generator=_g).sign(),
     grad=(0,))
case("margin_ranking_loss", F.margin_ranking_loss, rn(6), rn(6),
     torch.randn(6, generator=_g).sign())
case("hinge_embedding_loss", F.hinge_embedding_loss, rn(6), torch.randn(6, generator=_g).sign())
case("cosine_embedding_loss", F.cosine_embedding_loss, rn(3, 4), rn(3, 4),
     torch.randn(3, generator=_g).sign())
case("triplet_margin_loss", F.triplet_margin_loss, rn(3, 4), rn(3, 4), rn(3, 4))
case("poisson_nll_loss", F.poisson_nll_loss, rn(6), pos(6))
case("gaussian_nll_loss", F.gaussian_nll_loss, rn(6), rn(6), pos(6))
case("multilabel_soft_margin", F.multilabel_soft_margin_loss, rn(3, 4),
     ri(0, 2, 3, 4).float())
case("multi_margin_loss", F.multi_margin_loss, rn(3, 4), ri(0, 4, 3))
case("ctc_loss", lambda lp, t: F.ctc_loss(lp, t, [6, 6], [2, 3]), rn(6, 2, 4).log_softmax(-1),
     ri(1, 4, 2, 3))


def flat(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    return [out]


def run_case(fn, inputs, grad, device):
    """Outputs and input gradients of one case on one device; grad is True, False or the
    indices of the inputs to differentiate."""
    if inputs == "factory":
        return flat(fn(device)), []
    xs = [t.detach().clone().to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    for k, t in enumerate(xs):
        wanted = grad is True or (grad and k in grad)
        if wanted and isinstance(t, torch.Tensor) and t.is_floating_point():
            t.requires_grad_()
    outs = [o for o in flat(fn(*xs)) if isinstance(o, torch.Tensor)]
    diff = [o for o in outs if o.requires_grad]
    grads = []
    if diff:
        g = torch.Generator().manual_seed(1)
        sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype).to(device)).sum()
            for o in diff).backward()
        grads = [t.grad for t in xs
                 if isinstance(t, torch.Tensor) and t.requires_grad and t.grad is not None]
    return [o.detach() for o in outs], grads


def same(got, want, random):
    if len(got) != len(want):
        return f"{len(got)} outputs, CPU has {len(want)}"
    for g, w in zip(got, want):
        g = g.cpu()
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"{g.dtype}{list(g.shape)}, CPU {w.dtype}{list(w.shape)}"
        if random:
            continue
        if w.dtype in (torch.float16, torch.bfloat16):
            g, w = g.float(), w.float()
        if not torch.allclose(g, w, rtol=1e-4, atol=1e-5, equal_nan=True):
            diff = (g.double() - w.double()).abs().nan_to_num(math.inf).max().item()
            return f"values differ (max abs diff {diff:.3g})"
    return None


def classify(name, fn, inputs, grad, random):
    """(class, detail) of one case."""
    try:
        want, want_g = run_case(fn, inputs, grad, "cpu")
    except Exception as e:  # noqa: BLE001 - a case CPU itself rejects is not surveyed
        return "skipped", f"CPU raised {type(e).__name__}: {e}"
    deferfuse_torch.reset_fallback_counts()
    try:
        got, got_g = run_case(fn, inputs, grad, "tpu")
        torch.tpu.synchronize()
        bad = same(got, want, random) or same(got_g, want_g, random)
    except Exception as e:  # noqa: BLE001 - the survey reports every failure and goes on
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    fallbacks = deferfuse_torch.fallback_counts()
    if bad:
        return "wrong", bad
    if fallbacks:
        return "fallback", ", ".join(sorted(fallbacks))
    return "native", ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="defer", choices=["strict", "debug", "defer"])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--verbose", action="store_true", help="print a traceback for each error")
    args = ap.parse_args(argv)
    results = {}
    with deferfuse_torch.mode(args.mode):
        for name, fn, inputs, grad, random in CASES:
            torch.manual_seed(0)
            results[name] = classify(name, fn, inputs, grad, random)
            if args.verbose and results[name][0] == "error":
                traceback.print_exc()
    classes = ["native", "fallback", "wrong", "error", "skipped"]
    by_class = {c: {n: d for n, (k, d) in results.items() if k == c} for c in classes}
    if args.json:
        print(json.dumps({"cases": len(results), "mode": args.mode, **by_class}, indent=1))
        return 0
    counts = ", ".join(f"{len(by_class[c])} {c}" for c in classes)
    print(f"{len(results)} op cases on tpu ({args.mode}) vs CPU: {counts}")
    for c in classes[1:]:
        if by_class[c]:
            print(f"\n{c}:")
            for n, d in by_class[c].items():
                print(f"  {n}: {d}")
    print("\nnative:", " ".join(by_class["native"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
