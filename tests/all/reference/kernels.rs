//! Reference semantics of the kernel ops (gather, scatter, scans, argsort, depthwise
//! convolution, grouped matrix product), written from torch's documentation with whole index tuples, one element at a
//! time.
//!
//! Float arithmetic steps follow torch's CPU kernels: scatter combines in the dtype (f16/bf16
//! through f32, rounded each step), cumsum/cumprod accumulate in f64 for f32/f64 and in f32 for
//! f16/bf16. Scattered values are combined in row-major order of the index. A depthwise
//! convolution and a grouped product sum in f64 and round once to the dtype.

use super::{cast_value, indices, numel, round_float, store, RefTensor};
use deferfuse::fusion::ir::{Conv, Depthwise, DepthwisePart, GroupedMatmul, ScanOp, ScatterReduce};
use deferfuse::DType;
use std::cmp::Ordering;

/// `idx` with `idx[dim] = v`.
fn with(idx: &[usize], dim: usize, v: usize) -> Vec<usize> {
    let mut i = idx.to_vec();
    i[dim] = v;
    i
}

/// Row-major position of `idx` in `sizes`.
fn position(sizes: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(sizes).fold(0, |p, (&i, &s)| p * s + i)
}

/// `torch.gather(src, dim, index)`; panics on an out-of-range index (tests check those apart).
pub fn gather(src: &RefTensor, dim: usize, index: &RefTensor) -> RefTensor {
    let data = indices(&index.sizes)
        .iter()
        .map(|i| src.at(&with(i, dim, index.at(i) as usize)))
        .collect();
    RefTensor {
        dtype: src.dtype,
        sizes: index.sizes.clone(),
        data,
    }
}

/// What scatter combines: a tensor's same-position elements or one value.
pub enum ScatterSrc<'a> {
    Tensor(&'a RefTensor),
    Value(f64),
}

/// One scatter step on `dtype`.
fn combine(dtype: DType, r: ScatterReduce, a: f64, b: f64) -> f64 {
    let float = |v: f64| {
        if dtype == DType::F64 {
            v
        } else {
            round_float(round_float(v, DType::F32), dtype)
        }
    };
    let int = |v: f64| store(v, dtype);
    let step = |v: f64| if dtype.is_float() { float(v) } else { int(v) };
    match r {
        ScatterReduce::Assign => b,
        ScatterReduce::Sum | ScatterReduce::Mean => step(a + b),
        ScatterReduce::Prod => step(a * b),
        _ if a.is_nan() || b.is_nan() => f64::NAN,
        ScatterReduce::Amax => a.max(b),
        ScatterReduce::Amin => a.min(b),
    }
}

/// Where an element that receives values starts without `include_self`.
fn identity(dtype: DType, r: ScatterReduce) -> f64 {
    let (lo, hi) = match dtype {
        d if d.is_float() => (f64::NEG_INFINITY, f64::INFINITY),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        DType::U8 => (0.0, 255.0),
        _ => (0.0, 1.0),
    };
    match r {
        ScatterReduce::Prod => 1.0,
        ScatterReduce::Amax => lo,
        ScatterReduce::Amin => hi,
        _ => 0.0,
    }
}

/// Functional `scatter` / `scatter_reduce(dim, index, src, reduce, include_self)`.
pub fn scatter(
    this: &RefTensor,
    dim: usize,
    index: &RefTensor,
    src: ScatterSrc,
    reduce: ScatterReduce,
    include_self: bool,
) -> RefTensor {
    let dtype = this.dtype;
    let mut out = this.clone();
    let target = |i: &[usize]| position(&this.sizes, &with(i, dim, index.at(i) as usize));
    let all = indices(&index.sizes);
    if !include_self && reduce != ScatterReduce::Assign {
        for i in &all {
            out.data[target(i)] = identity(dtype, reduce);
        }
    }
    let mut count = vec![include_self as i64; numel(&this.sizes)];
    for i in &all {
        let v = match src {
            ScatterSrc::Tensor(s) => s.at(i),
            ScatterSrc::Value(v) => store(v, dtype),
        };
        let t = target(i);
        out.data[t] = combine(dtype, reduce, out.data[t], v);
        count[t] += 1;
    }
    if reduce == ScatterReduce::Mean {
        for (v, &c) in out.data.iter_mut().zip(&count) {
            if c > 1 {
                *v = if dtype.is_float() {
                    combine(dtype, ScatterReduce::Sum, *v / c as f64, 0.0)
                } else {
                    (*v / c as f64).floor()
                };
            }
        }
    }
    out
}

/// `cumsum` / `cumprod(x, dim, dtype=)`.
pub fn scan(x: &RefTensor, dim: usize, op: ScanOp, dtype: Option<DType>) -> RefTensor {
    let rt = dtype.unwrap_or(if x.dtype.is_float() {
        x.dtype
    } else {
        DType::I64
    });
    let acc_round = |v: f64| match rt {
        DType::F16 | DType::BF16 => round_float(v, DType::F32),
        d if d.is_float() => v,
        _ => store(v, DType::I64),
    };
    let mut data = vec![0.0; x.numel()];
    for i in indices(&x.sizes) {
        let mut acc = match op {
            ScanOp::Sum => 0.0,
            ScanOp::Prod => 1.0,
        };
        for j in 0..=i[dim] {
            let v = cast_value(x.at(&with(&i, dim, j)), x.dtype, rt);
            acc = acc_round(match op {
                ScanOp::Sum => acc + v,
                ScanOp::Prod => acc * v,
            });
        }
        data[position(&x.sizes, &i)] = store(acc, rt);
    }
    RefTensor {
        dtype: rt,
        sizes: x.sizes.clone(),
        data,
    }
}

/// `argsort(x, dim, descending, stable=True)` with NaN as the largest value.
pub fn argsort(x: &RefTensor, dim: usize, descending: bool) -> RefTensor {
    let key_cmp = |a: f64, b: f64| match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap(),
    };
    let mut data = vec![0.0; x.numel()];
    for i in indices(&x.sizes).into_iter().filter(|i| i[dim] == 0) {
        let n = x.sizes[dim];
        let keys: Vec<f64> = (0..n).map(|j| x.at(&with(&i, dim, j))).collect();
        // Insertion sort: stable by construction, independent of the runtime's `sort_by`.
        let mut order: Vec<usize> = Vec::new();
        for j in 0..n {
            let before = |k: &usize| {
                let c = key_cmp(keys[*k], keys[j]);
                if descending {
                    c != Ordering::Less
                } else {
                    c != Ordering::Greater
                }
            };
            let at = order.iter().take_while(|k| before(k)).count();
            order.insert(at, j);
        }
        for (j, k) in order.into_iter().enumerate() {
            data[position(&x.sizes, &with(&i, dim, j))] = k as f64;
        }
    }
    RefTensor {
        dtype: DType::I64,
        sizes: x.sizes.clone(),
        data,
    }
}

/// A depthwise convolution's part `k` of operands `a` and `b` (forward: x `[N, C, in...]`, w
/// `[C, 1, k...]`; input gradient: grad `[N, C, out...]`, w; weight gradient: grad, x), from
/// the definition: for every sample, channel, output position `o` and tap `t`, the input
/// position of spatial dim `i` is `o[i] * stride[i] - padding[i] + t[i] * dilation[i]`; where
/// every dim's position is inside the input, the term `x * w` (forward), `grad * w` (input
/// gradient) or `grad * x` (weight gradient) is added to the result element it belongs to. The
/// sums are in f64, rounded once to the operands' dtype (so `|a|`, `|b|` of float64 give the sum
/// of the terms' magnitudes, for accumulation tolerances).
pub fn depthwise(k: &Depthwise, a: &RefTensor, b: &RefTensor) -> RefTensor {
    let d = k.kernel.len();
    let (n, c) = (a.sizes[0], a.sizes[1]);
    let input: Vec<usize> = match k.part {
        DepthwisePart::Forward => a.sizes[2..].to_vec(),
        DepthwisePart::InputGrad => k.input.to_vec(),
        DepthwisePart::WeightGrad => b.sizes[2..].to_vec(),
    };
    let out: Vec<usize> = (0..d)
        .map(|i| {
            (input[i] + 2 * k.padding[i] - k.dilation[i] * (k.kernel[i] - 1) - 1) / k.stride[i] + 1
        })
        .collect();
    let lead = |spatial: &[usize]| [&[n, c][..], spatial].concat();
    let weight = [&[c, 1][..], &k.kernel[..]].concat();
    if k.part != DepthwisePart::Forward {
        assert_eq!(a.sizes, lead(&out), "the gradient's shape");
    }
    let sizes = match k.part {
        DepthwisePart::Forward => lead(&out),
        DepthwisePart::InputGrad => lead(&input),
        DepthwisePart::WeightGrad => weight.clone(),
    };
    let mut data = vec![0.0; numel(&sizes)];
    for o in indices(&lead(&out)) {
        for t in indices(&k.kernel) {
            let p: Vec<i64> = (0..d)
                .map(|i| {
                    (o[2 + i] * k.stride[i] + t[i] * k.dilation[i]) as i64 - k.padding[i] as i64
                })
                .collect();
            if p.iter().zip(&input).any(|(&p, &s)| p < 0 || p >= s as i64) {
                continue;
            }
            let xi: Vec<usize> =
                [&o[..2], &p.iter().map(|&v| v as usize).collect::<Vec<_>>()].concat();
            let wi: Vec<usize> = [&[o[1], 0][..], &t[..]].concat();
            let (at, term) = match k.part {
                DepthwisePart::Forward => (position(&sizes, &o), a.at(&xi) * b.at(&wi)),
                DepthwisePart::InputGrad => (position(&sizes, &xi), a.at(&o) * b.at(&wi)),
                DepthwisePart::WeightGrad => (position(&sizes, &wi), a.at(&o) * b.at(&xi)),
            };
            data[at] += term;
        }
    }
    RefTensor::new(a.dtype, &sizes, data)
}

/// Calls `f(o, xi, wi)` for every term of the dense convolution `k`: output index `o` of `out`
/// (`[N, OC, out...]`), input channel `ci < c` and kernel tap `t`, with `xi = [n, ci, o *
/// stride - padding + t * dilation]` inside `input` (the input's spatial sizes) and `wi = [oc,
/// ci, t]`. The one place the three parts below take the convolution's index relation from.
fn conv_terms(
    k: &Conv,
    (out, c, input, kernel): (&[usize], usize, &[usize], &[usize]),
    mut f: impl FnMut(&[usize], &[usize], &[usize]),
) {
    for o in indices(out) {
        for ci in 0..c {
            for t in indices(kernel) {
                let p: Vec<i64> = (0..kernel.len())
                    .map(|i| {
                        (o[2 + i] * k.stride[i] + t[i] * k.dilation[i]) as i64 - k.padding[i] as i64
                    })
                    .collect();
                if p.iter().zip(input).any(|(&p, &s)| p < 0 || p >= s as i64) {
                    continue;
                }
                let xi: Vec<usize> = [o[0], ci]
                    .into_iter()
                    .chain(p.iter().map(|&v| v as usize))
                    .collect();
                let wi: Vec<usize> = [o[1], ci].into_iter().chain(t.iter().copied()).collect();
                f(&o, &xi, &wi);
            }
        }
    }
}

/// The dense convolution `conv(x, w)` (x `[N, C, in...]`, w `[OC, C, k...]`), term by term in
/// f64: output position `o` of each spatial dim reads input position `o * stride - padding + t
/// * dilation` for each tap `t`, zero outside the input.
pub fn conv(k: &Conv, x: &RefTensor, w: &RefTensor) -> RefTensor {
    let (input, kernel) = (&x.sizes[2..], &w.sizes[2..]);
    let out: Vec<usize> = (0..input.len())
        .map(|i| {
            (input[i] + 2 * k.padding[i] - k.dilation[i] * (kernel[i] - 1) - 1) / k.stride[i] + 1
        })
        .collect();
    let sizes = [&[x.sizes[0], w.sizes[0]][..], &out].concat();
    let mut data = vec![0.0; numel(&sizes)];
    conv_terms(k, (&sizes, x.sizes[1], input, kernel), |o, xi, wi| {
        data[position(&sizes, o)] += x.at(xi) * w.at(wi);
    });
    // float32 whatever the operands' dtype: bfloat16 ones are summed into a float32 result.
    RefTensor::new(DType::F32, &sizes, data)
}

/// The input gradient `[N, C, input...]` of the dense convolution `k` by w `[OC, C,
/// k...]` for output gradient grad `[N, OC, out...]`, term by term in f64: each input element
/// sums the gradient times the weight over the outputs and taps that read it.
pub fn conv_input_grad(k: &Conv, grad: &RefTensor, w: &RefTensor, input: &[usize]) -> RefTensor {
    let sizes = [&[grad.sizes[0], w.sizes[1]][..], input].concat();
    let mut data = vec![0.0; numel(&sizes)];
    let spec = (&grad.sizes[..], w.sizes[1], input, &w.sizes[2..]);
    conv_terms(k, spec, |o, xi, wi| {
        data[position(&sizes, xi)] += grad.at(o) * w.at(wi);
    });
    RefTensor::new(grad.dtype, &sizes, data)
}

/// The weight gradient `[OC, C, k...]` of the dense convolution `k` (its `sizes`
/// giving k) whose input is x `[N, C, in...]` and output gradient grad `[N, OC, out...]`, term
/// by term in f64.
pub fn conv_weight_grad(k: &Conv, grad: &RefTensor, x: &RefTensor) -> RefTensor {
    let sizes = [&[grad.sizes[1], x.sizes[1]][..], &k.sizes[..]].concat();
    let mut data = vec![0.0; numel(&sizes)];
    let spec = (&grad.sizes[..], x.sizes[1], &x.sizes[2..], &k.sizes[..]);
    conv_terms(k, spec, |o, xi, wi| {
        data[position(&sizes, wi)] += grad.at(o) * x.at(xi);
    });
    // float32 whatever the operands' dtype, as `conv`.
    RefTensor::new(DType::F32, &sizes, data)
}

/// col2im (`ConvPart::ColumnsToInput`): columns `[N, C, k..., out...]` added back into `[N, C,
/// input...]` (`k.sizes`), each value at the input position its tap read (`o * stride -
/// padding + t * dilation`) and dropped where that is padding. Summed as the strided adds it
/// replaces: in float32, tap by tap in row-major tap order, from +0.0, so the op must match it
/// bit for bit.
pub fn conv_columns_to_input(k: &Conv, cols: &RefTensor) -> RefTensor {
    let d = k.padding.len();
    let (kernel, out) = (&cols.sizes[2..2 + d], &cols.sizes[2 + d..]);
    let sizes = [&cols.sizes[..2], &k.sizes[..]].concat();
    let mut data = vec![0.0f64; numel(&sizes)];
    for t in indices(kernel) {
        for lead in indices(&cols.sizes[..2]) {
            for o in indices(out) {
                let p: Vec<i64> = (0..d)
                    .map(|i| {
                        (o[i] * k.stride[i] + t[i] * k.dilation[i]) as i64 - k.padding[i] as i64
                    })
                    .collect();
                if p.iter()
                    .zip(&k.sizes)
                    .any(|(&p, &s)| p < 0 || p >= s as i64)
                {
                    continue;
                }
                let at: Vec<usize> = lead
                    .iter()
                    .copied()
                    .chain(p.iter().map(|&v| v as usize))
                    .collect();
                let from: Vec<usize> = lead.iter().chain(&t).chain(&o).copied().collect();
                let slot = &mut data[position(&sizes, &at)];
                *slot = (*slot as f32 + cols.at(&from) as f32) as f64;
            }
        }
    }
    RefTensor::new(cols.dtype, &sizes, data)
}

/// im2col (`ConvPart::InputToColumns`): x `[N, C, in...]` into columns `[C, k..., N, out...]`
/// (`k.sizes` the kernel), each column value the input element its tap reads (`o * stride -
/// padding + t * dilation`), zero where that is padding. A copy: the op must match it exactly.
pub fn conv_input_to_columns(k: &Conv, x: &RefTensor) -> RefTensor {
    let d = k.padding.len();
    let (input, kernel) = (&x.sizes[2..], &k.sizes[..]);
    let out: Vec<usize> = (0..d)
        .map(|i| {
            (input[i] + 2 * k.padding[i] - k.dilation[i] * (kernel[i] - 1) - 1) / k.stride[i] + 1
        })
        .collect();
    let sizes = [&[x.sizes[1]][..], kernel, &[x.sizes[0]], &out].concat();
    let data = indices(&sizes)
        .into_iter()
        .map(|i| {
            let (c, t, n, o) = (i[0], &i[1..1 + d], i[1 + d], &i[2 + d..]);
            let p: Vec<i64> = (0..d)
                .map(|j| (o[j] * k.stride[j] + t[j] * k.dilation[j]) as i64 - k.padding[j] as i64)
                .collect();
            if p.iter().zip(input).any(|(&p, &s)| p < 0 || p >= s as i64) {
                return 0.0;
            }
            let at: Vec<usize> = [n, c]
                .into_iter()
                .chain(p.iter().map(|&v| v as usize))
                .collect();
            x.at(&at)
        })
        .collect();
    RefTensor::new(x.dtype, &sizes, data)
}

/// `torch._grouped_mm(a, b, offs)` for `case`, element by element: group g covers
/// `[offs[g-1], offs[g])` of the cut dim (from 0), each end clamped to it, as torch slices it.
/// Ranges may overlap (offsets that decrease): each group's product reads its own range, and
/// in the row and column cases a later group's rows replace an earlier one's (torch writes
/// them in group order). What no group covers is zero (torch leaves it uninitialised).
pub fn grouped_mm(case: GroupedMatmul, a: &RefTensor, b: &RefTensor, offs: &[i64]) -> RefTensor {
    let (extent, sizes) = match case {
        GroupedMatmul::Rows => (a.sizes[0], vec![a.sizes[0], b.sizes[2]]),
        GroupedMatmul::Cols => (b.sizes[1], vec![a.sizes[1], b.sizes[1]]),
        GroupedMatmul::Contraction => (a.sizes[1], vec![offs.len(), a.sizes[0], b.sizes[1]]),
    };
    let clamp = |v: i64| v.clamp(0, extent as i64) as usize;
    let ranges: Vec<std::ops::Range<usize>> = offs
        .iter()
        .enumerate()
        .map(|(g, &end)| {
            let start = if g == 0 { 0 } else { offs[g - 1] };
            clamp(start)..clamp(end)
        })
        .collect();
    // The group whose rows (columns) a position of the cut dim ends up with: the last.
    let last = |p: usize| ranges.iter().rposition(|r| r.contains(&p));
    let k_all = a.sizes[a.rank() - 1];
    let mut out = RefTensor::new(a.dtype, &sizes, vec![0.0; numel(&sizes)]);
    for (pos, idx) in indices(&sizes).into_iter().enumerate() {
        let v: f64 = match case {
            GroupedMatmul::Rows => match last(idx[0]) {
                Some(g) => (0..k_all)
                    .map(|k| a.at(&[idx[0], k]) * b.at(&[g, k, idx[1]]))
                    .sum(),
                None => 0.0,
            },
            GroupedMatmul::Cols => match last(idx[1]) {
                Some(g) => (0..k_all)
                    .map(|k| a.at(&[g, idx[0], k]) * b.at(&[k, idx[1]]))
                    .sum(),
                None => 0.0,
            },
            GroupedMatmul::Contraction => ranges[idx[0]]
                .clone()
                .map(|k| a.at(&[idx[1], k]) * b.at(&[k, idx[2]]))
                .sum(),
        };
        out.data[pos] = round_float(v, a.dtype);
    }
    out
}
