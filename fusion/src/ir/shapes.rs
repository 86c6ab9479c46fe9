//! Shape and dtype rules of the structural ops (matmul, reductions, cat, arange, full): the
//! second half of [`super::infer`], split off to keep each file to one screenful of rules.

use super::dtype::DType;
use super::error::{OpError, OpResult};
use super::infer::{expect_tensor, result_type, ArgMeta, Inferred};
use super::layout::{broadcast_shapes, checked_numel, fmt_dims, wrap_dim, Dims};
use super::op::{Op, ReduceOp, Scalar};
use smallvec::{smallvec, SmallVec};
use std::fmt::Display;

pub(super) fn check_numel(op: &str, sizes: &[usize]) -> OpResult<usize> {
    checked_numel(sizes)
        .filter(|&n| n.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or_else(|| {
            OpError::new(
                op,
                "sizes",
                "an element count that fits in memory",
                fmt_dims(sizes),
            )
        })
}

pub(super) fn check_matmul_dtypes(op: &str, a: DType, b: DType) -> OpResult<()> {
    if a != b {
        return Err(OpError::new(
            op,
            "input 1",
            format!("dtype {a} (same as input 0)"),
            format!("{b}"),
        )
        .hint("matmul does not promote; cast one operand"));
    }
    if a == DType::Bool {
        return Err(OpError::new(op, "input 0", "a numeric dtype", "bool"));
    }
    Ok(())
}

/// `torch.matmul` output shape.
pub(crate) fn matmul_shape(op: &str, a: &[usize], b: &[usize]) -> OpResult<Dims> {
    if a.is_empty() || b.is_empty() {
        return Err(OpError::new(
            op,
            "inputs",
            "tensors with at least 1 dim",
            "a 0-dim tensor",
        ));
    }
    let k_a = *a.last().unwrap();
    let k_b = if b.len() == 1 { b[0] } else { b[b.len() - 2] };
    if k_a != k_b {
        return Err(OpError::new(
            op,
            "input 1",
            format!("{k_a} rows to match input 0's {k_a} columns"),
            format!("shape {} (inner size {k_b})", fmt_dims(b)),
        )
        .hint(format!("input 0 has shape {}", fmt_dims(a))));
    }
    let batch_a = if a.len() > 2 {
        &a[..a.len() - 2]
    } else {
        &[][..]
    };
    let batch_b = if b.len() > 2 {
        &b[..b.len() - 2]
    } else {
        &[][..]
    };
    let mut out = broadcast_shapes(op, batch_a, batch_b, "input 1 (batch dims)")?;
    if a.len() >= 2 {
        out.push(a[a.len() - 2]);
    }
    if b.len() >= 2 {
        out.push(b[b.len() - 1]);
    }
    Ok(out)
}

pub(super) fn infer_reduce(
    r: ReduceOp,
    dt: DType,
    sizes: &[usize],
    dims: &[usize],
    keepdim: bool,
) -> OpResult<Inferred> {
    let name = r.name();
    let mut seen: SmallVec<[usize; 6]> = SmallVec::new();
    for &d in dims {
        let w = wrap_dim(name, d as i64, sizes.len())?;
        if seen.contains(&w) {
            return Err(
                OpError::new(name, "dim", "each dim at most once", format!("{dims:?}")).hint(
                    format!("dim {w} appears multiple times in the list of dims"),
                ),
            );
        }
        seen.push(w);
    }
    if r.is_arg() && dims.len() > 1 {
        return Err(OpError::new(
            name,
            "dim",
            "at most one dim",
            format!("{dims:?}"),
        ));
    }
    let all = dims.is_empty();
    let reduced = |i: usize| all || dims.contains(&i);
    let count: usize = (0..sizes.len())
        .filter(|&i| reduced(i))
        .map(|i| sizes[i])
        .product();
    if count == 0
        && matches!(
            r,
            ReduceOp::Amax | ReduceOp::Amin | ReduceOp::Argmax | ReduceOp::Argmin
        )
    {
        return Err(OpError::new(
            name,
            "input 0",
            "a non-empty reduced dim",
            format!("shape {}", fmt_dims(sizes)),
        )
        .hint("max/min of nothing is undefined; pass a dim with elements"));
    }
    let mut out: Dims = SmallVec::new();
    for (i, &s) in sizes.iter().enumerate() {
        if !reduced(i) {
            out.push(s);
        } else if keepdim {
            out.push(1);
        }
    }
    let (dtype, compute) = match r {
        ReduceOp::Sum | ReduceOp::Prod if !dt.is_float() => (DType::I64, DType::I64),
        ReduceOp::Mean if !dt.is_float() => {
            return Err(
                OpError::new(name, "input 0", "a floating dtype", format!("dtype {dt}"))
                    .hint("cast to float first, e.g. x.float().mean()"),
            )
        }
        ReduceOp::Argmax | ReduceOp::Argmin => (DType::I64, dt),
        ReduceOp::Amax | ReduceOp::Amin if dt == DType::Bool => {
            return Err(OpError::new(
                name,
                "input 0",
                "a numeric dtype",
                "dtype bool",
            ))
        }
        _ => (dt, dt),
    };
    Ok(Inferred {
        dtype,
        sizes: out,
        compute,
    })
}

pub(super) fn infer_cat(args: &[ArgMeta], dim: usize) -> OpResult<Inferred> {
    if args.is_empty() {
        return Err(OpError::new("cat", "inputs", "at least one tensor", "none"));
    }
    let (_, first) = expect_tensor(&Op::Cat { dim }, args, 0)?;
    let rank = first.len();
    if rank == 0 {
        return Err(OpError::new(
            "cat",
            "input 0",
            "a tensor with at least 1 dim",
            "a 0-dim tensor",
        ));
    }
    wrap_dim("cat", dim as i64, rank)?;
    let mut out = first.clone();
    out[dim] = 0;
    for i in 0..args.len() {
        let (_, s) = expect_tensor(&Op::Cat { dim }, args, i)?;
        let same = s.len() == rank && (0..rank).all(|d| d == dim || s[d] == first[d]);
        if !same {
            return Err(OpError::new(
                "cat",
                format!("input {i}"),
                format!("sizes {} except in dim {dim}", fmt_dims(first)),
                fmt_dims(s),
            ));
        }
        out[dim] += s[dim];
    }
    let dtype = result_type(args);
    Ok(Inferred {
        dtype,
        sizes: out,
        compute: dtype,
    })
}

/// Number of elements `arange(start, end, step)` makes, with PyTorch's rules.
pub(crate) fn arange_len(start: f64, end: f64, step: f64) -> OpResult<usize> {
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
        return Err(OpError::new(
            "arange",
            "step",
            "a finite non-zero step",
            format!("{step}"),
        ));
    }
    if (end - start) * step < 0.0 {
        return Err(bound_against_step(start, end, step));
    }
    let n = ((end - start) / step).ceil();
    if n > (1u64 << 40) as f64 {
        return Err(too_long(n));
    }
    Ok(n as usize)
}

/// An arange whose end lies behind its start for its step's sign.
fn bound_against_step(start: impl Display, end: impl Display, step: impl Display) -> OpError {
    OpError::new(
        "arange",
        "end",
        "a bound consistent with the step's sign",
        format!("start={start}, end={end}, step={step}"),
    )
}

/// An arange of `n` elements, past what one may hold.
fn too_long(n: impl Display) -> OpError {
    OpError::new("arange", "end", "fewer than 2^40 elements", format!("{n}"))
}

/// Start, end and step when all three are integers.
fn integral_bounds(args: &[ArgMeta]) -> Option<(i64, i64, i64)> {
    let int = |a: &ArgMeta| match a {
        ArgMeta::Scalar(Scalar::Int(v)) => Some(*v),
        _ => None,
    };
    Some((int(args.first()?)?, int(args.get(1)?)?, int(args.get(2)?)?))
}

/// An int64 arange's length from integer bounds, counted in integers as CPU's kernel does: in
/// f64, `arange(10**18, 10**18 + 5)` has a length of 0 (the two bounds round to one double).
fn arange_len_i64(start: i64, end: i64, step: i64) -> OpResult<usize> {
    let (start, end, step) = (start as i128, end as i128, step as i128);
    if step == 0 {
        return Err(OpError::new("arange", "step", "a non-zero step", "0"));
    }
    if (end - start) * step.signum() < 0 {
        return Err(bound_against_step(start, end, step));
    }
    // ceil((end - start) / step), exact: the difference and step have the same sign.
    let n = (end - start + step - step.signum()) / step;
    if n > 1 << 40 {
        return Err(too_long(n));
    }
    Ok(n as usize)
}

pub(super) fn infer_arange(args: &[ArgMeta], dtype: DType) -> OpResult<Inferred> {
    let v: SmallVec<[f64; 3]> = args
        .iter()
        .map(|a| match a {
            ArgMeta::Scalar(s) => Ok(s.as_f64()),
            other => Err(OpError::new(
                "arange",
                "start/end/step",
                "three scalars",
                format!("{other:?}"),
            )),
        })
        .collect::<OpResult<_>>()?;
    if v.len() != 3 {
        return Err(OpError::new(
            "arange",
            "inputs",
            "start, end and step",
            format!("{} operands", v.len()),
        ));
    }
    if dtype == DType::Bool {
        return Err(OpError::new("arange", "dtype", "a numeric dtype", "bool"));
    }
    let n = match integral_bounds(args) {
        Some((start, end, step)) if dtype == DType::I64 => arange_len_i64(start, end, step)?,
        _ => arange_len(v[0], v[1], v[2])?,
    };
    Ok(Inferred {
        dtype,
        sizes: smallvec![n],
        compute: dtype.compute(),
    })
}
