//! Reference reductions: sum/mean/prod (integers accumulate in wrapping i64), NaN-propagating
//! amax/amin, and argmax/argmin returning the first index of the extreme (NaN is the extreme).

use super::{cast_value, check, indices, numel, Arg, RefTensor};
use deferfuse::fusion::ir::Dims;
use deferfuse::{DType, Op, ReduceOp};

/// The reduced dims (empty = all), sorted and deduplicated; a 0-dim tensor's dim 0 is the
/// tensor itself (PyTorch's rule), nothing to reduce over.
pub fn reduced_dims(dims: &[usize], rank: usize) -> Vec<usize> {
    let mut r: Vec<usize> = if dims.is_empty() {
        (0..rank).collect()
    } else {
        dims.iter().copied().filter(|&d| d < rank).collect()
    };
    r.sort_unstable();
    r.dedup();
    r
}

/// The output shape of reducing `sizes` over `dims`.
pub fn reduced_shape(sizes: &[usize], dims: &[usize], keepdim: bool) -> Vec<usize> {
    let red = reduced_dims(dims, sizes.len());
    let mut out = Vec::new();
    for (d, &s) in sizes.iter().enumerate() {
        if !red.contains(&d) {
            out.push(s);
        } else if keepdim {
            out.push(1);
        }
    }
    out
}

fn fold(op: ReduceOp, vals: &[f64], float: bool) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean if float => {
            let s: f64 = vals.iter().sum();
            if op == ReduceOp::Mean {
                s / vals.len() as f64
            } else {
                s
            }
        }
        ReduceOp::Sum | ReduceOp::Mean => {
            vals.iter().fold(0i64, |a, &v| a.wrapping_add(v as i64)) as f64
        }
        ReduceOp::Prod if float => vals.iter().product(),
        ReduceOp::Prod => vals.iter().fold(1i64, |a, &v| a.wrapping_mul(v as i64)) as f64,
        ReduceOp::Amax | ReduceOp::Amin => {
            let mut acc = vals[0];
            for &v in &vals[1..] {
                if acc.is_nan() {
                    break;
                }
                acc = if v.is_nan() {
                    v
                } else if op == ReduceOp::Amax {
                    acc.max(v)
                } else {
                    acc.min(v)
                };
            }
            acc
        }
        ReduceOp::Argmax | ReduceOp::Argmin => {
            let (mut best, mut at) = (vals[0], 0usize);
            for (i, &v) in vals.iter().enumerate().skip(1) {
                let better = if op == ReduceOp::Argmax {
                    v > best
                } else {
                    v < best
                };
                if better || (v.is_nan() && !best.is_nan()) {
                    best = v;
                    at = i;
                }
            }
            at as f64
        }
    }
}

/// `op(x, dims, keepdim)`; the reduced elements are visited in row-major order of the reduced
/// dims (argmax's index is the flat index over them).
pub fn reduce(op: ReduceOp, x: &RefTensor, dims: &[usize], keepdim: bool) -> RefTensor {
    let rop = Op::Reduce {
        op,
        dims: dims.iter().copied().collect::<Dims>(),
        keepdim,
    };
    let out_dtype = check(&rop, &[Arg::T(x)])
        .unwrap_or_else(|e| panic!("reference given a bad reduction: {e}"))
        .dtype;
    let rank = x.rank();
    let red = reduced_dims(dims, rank);
    let kept: Vec<usize> = (0..rank).filter(|d| !red.contains(d)).collect();
    let kept_sizes: Vec<usize> = kept.iter().map(|&d| x.sizes[d]).collect();
    let red_sizes: Vec<usize> = red.iter().map(|&d| x.sizes[d]).collect();
    let float = x.dtype.is_float();
    let mut data = Vec::with_capacity(numel(&kept_sizes));
    let red_idx = indices(&red_sizes);
    for k in indices(&kept_sizes) {
        let mut idx = vec![0usize; rank];
        for (j, &d) in kept.iter().enumerate() {
            idx[d] = k[j];
        }
        let vals: Vec<f64> = red_idx
            .iter()
            .map(|r| {
                for (j, &d) in red.iter().enumerate() {
                    idx[d] = r[j];
                }
                x.at(&idx)
            })
            .collect();
        let v = if vals.is_empty() {
            match op {
                ReduceOp::Sum => 0.0,
                ReduceOp::Mean => f64::NAN,
                ReduceOp::Prod => 1.0,
                _ => panic!("{} of nothing is rejected at record time", op.name()),
            }
        } else {
            fold(op, &vals, float)
        };
        let from = if op.is_arg() || !float {
            DType::I64
        } else {
            DType::F64
        };
        data.push(cast_value(v, from, out_dtype));
    }
    RefTensor {
        dtype: out_dtype,
        sizes: reduced_shape(&x.sizes, dims, keepdim),
        data,
    }
}
