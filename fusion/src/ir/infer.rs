//! Type promotion and shape inference: the only place that decides an op's output dtype and
//! shape, and so the only place that raises "bad op" errors. Runs at record time in every mode.

use super::dtype::{Category, DType, DEFAULT_FLOAT};
use super::elementwise::{infer_binary, infer_unary};
use super::error::{OpError, OpResult};
use super::layout::{broadcast_shapes, fmt_dims, Dims};
use super::op::{Op, Scalar};
use super::shapes::matmul_shape;
use super::shapes::{check_matmul_dtypes, check_numel, infer_arange, infer_cat, infer_reduce};
use smallvec::SmallVec;

/// What inference needs to know of one operand.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgMeta {
    /// A tensor operand: its dtype and shape.
    Tensor {
        /// The tensor's dtype.
        dtype: DType,
        /// The tensor's sizes.
        sizes: Dims,
    },
    /// A Python number operand.
    Scalar(Scalar),
    /// An optional operand left out (a missing clamp bound).
    Absent,
}

impl ArgMeta {
    #[inline]
    /// A tensor operand's meta from a dtype and a size slice.
    pub fn tensor(dtype: DType, sizes: &[usize]) -> ArgMeta {
        ArgMeta::Tensor {
            dtype,
            sizes: super::layout::dims_from(sizes),
        }
    }
}

/// The dtype and shape an op produces, and the dtype its operands are converted to before the
/// arithmetic (e.g. `eq(int32, float32)` compares in float32 and yields bool).
#[derive(Clone, Debug, PartialEq)]
pub struct Inferred {
    /// The dtype of the result.
    pub dtype: DType,
    /// The shape of the result.
    pub sizes: Dims,
    /// The dtype operands are converted to for the arithmetic.
    pub compute: DType,
}

/// PyTorch's `result_type`: tensors with dims win over zero-dim tensors, which win over Python
/// scalars, unless the lower-priority operand is of a higher category (int tensor + 2.5 -> float).
pub(crate) fn result_type(args: &[ArgMeta]) -> DType {
    let mut dim: Option<DType> = None;
    let mut zero: Option<DType> = None;
    let mut wrapped: Option<DType> = None;
    let merge = |slot: &mut Option<DType>, d: DType| {
        *slot = Some(slot.map_or(d, |s| DType::promote(s, d)));
    };
    for a in args {
        match a {
            ArgMeta::Tensor { dtype, sizes } if sizes.is_empty() => merge(&mut zero, *dtype),
            ArgMeta::Tensor { dtype, .. } => merge(&mut dim, *dtype),
            ArgMeta::Scalar(s) => merge(
                &mut wrapped,
                match s.category() {
                    Category::Float => DEFAULT_FLOAT,
                    Category::Integer => DType::I64,
                    Category::Bool => DType::Bool,
                },
            ),
            ArgMeta::Absent => {}
        }
    }
    fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
        match (higher, lower) {
            (Some(h), _) if h.is_float() => Some(h),
            (Some(h), Some(l)) if h == DType::Bool || l.is_float() => Some(DType::promote(h, l)),
            (Some(h), _) => Some(h),
            (None, l) => l,
        }
    }
    combine(dim, combine(zero, wrapped)).unwrap_or(DEFAULT_FLOAT)
}

/// PyTorch's `can_cast`: may a result of `from` be written into an `out` of dtype `to`?
pub fn can_cast(from: DType, to: DType) -> bool {
    from.category() <= to.category()
}

fn tensor_sizes(args: &[ArgMeta]) -> impl Iterator<Item = (usize, &Dims)> {
    args.iter().enumerate().filter_map(|(i, a)| match a {
        ArgMeta::Tensor { sizes, .. } => Some((i, sizes)),
        _ => None,
    })
}

pub(super) fn broadcast_all(op: &str, args: &[ArgMeta]) -> OpResult<Dims> {
    let mut out: Dims = SmallVec::new();
    for (i, sizes) in tensor_sizes(args) {
        // The operand's name is only formatted on error: this runs for every recorded op.
        out = broadcast_shapes(op, &out, sizes, "").map_err(|mut e| {
            e.operand = format!("input {i}");
            e
        })?;
    }
    Ok(out)
}

pub(super) fn float_of(d: DType) -> DType {
    if d.is_float() {
        d
    } else {
        DEFAULT_FLOAT
    }
}

pub(super) fn expect_args(op: &Op, args: &[ArgMeta], n: usize) -> OpResult<()> {
    if args.len() != n {
        return Err(OpError::new(
            op.name(),
            "inputs",
            format!("{n} operands"),
            format!("{}", args.len()),
        ));
    }
    Ok(())
}

pub(super) fn expect_tensor<'a>(
    op: &Op,
    args: &'a [ArgMeta],
    i: usize,
) -> OpResult<(DType, &'a Dims)> {
    match &args[i] {
        ArgMeta::Tensor { dtype, sizes } => Ok((*dtype, sizes)),
        other => Err(OpError::new(
            op.name(),
            format!("input {i}"),
            "a tensor",
            format!("{other:?}"),
        )),
    }
}

/// Infers the output of `op` applied to `args`, or explains why the op is invalid.
pub fn infer(op: &Op, args: &[ArgMeta]) -> OpResult<Inferred> {
    let name = op.name();
    match op {
        Op::Unary(u) => infer_unary(op, *u, args),
        Op::Binary(b) => infer_binary(op, *b, args),
        Op::Where => {
            expect_args(op, args, 3)?;
            let (cd, _) = expect_tensor(op, args, 0)?;
            if cd != DType::Bool {
                return Err(OpError::new(
                    name,
                    "condition",
                    "a bool tensor",
                    format!("dtype {cd}"),
                )
                .hint("compare first, e.g. x > 0"));
            }
            let sizes = broadcast_all(name, args)?;
            let dtype = result_type(&args[1..]);
            Ok(Inferred {
                dtype,
                sizes,
                compute: dtype,
            })
        }
        Op::Clamp => {
            expect_args(op, args, 3)?;
            let (xd, _) = expect_tensor(op, args, 0)?;
            if matches!(args[1], ArgMeta::Absent) && matches!(args[2], ArgMeta::Absent) {
                return Err(OpError::new(
                    name,
                    "min/max",
                    "at least one bound",
                    "neither",
                ));
            }
            if xd == DType::Bool {
                return Err(OpError::new(
                    name,
                    "input 0",
                    "a numeric dtype",
                    "dtype bool",
                ));
            }
            let sizes = broadcast_all(name, args)?;
            let dtype = result_type(args);
            Ok(Inferred {
                dtype,
                sizes,
                compute: dtype,
            })
        }
        Op::Cast(to) => {
            expect_args(op, args, 1)?;
            let (_, sizes) = expect_tensor(op, args, 0)?;
            Ok(Inferred {
                dtype: *to,
                sizes: sizes.clone(),
                compute: to.compute(),
            })
        }
        Op::Copy => {
            expect_args(op, args, 1)?;
            let (dt, sizes) = expect_tensor(op, args, 0)?;
            Ok(Inferred {
                dtype: dt,
                sizes: sizes.clone(),
                compute: dt,
            })
        }
        Op::Reduce {
            op: r,
            dims,
            keepdim,
        } => {
            expect_args(op, args, 1)?;
            let (dt, sizes) = expect_tensor(op, args, 0)?;
            infer_reduce(*r, dt, sizes, dims, *keepdim)
        }
        Op::Cat { dim } => infer_cat(args, *dim),
        Op::Full { sizes, dtype } => {
            expect_args(op, args, 1)?;
            check_numel(name, sizes)?;
            Ok(Inferred {
                dtype: *dtype,
                sizes: sizes.clone(),
                compute: dtype.compute(),
            })
        }
        Op::Arange { dtype } => infer_arange(args, *dtype),
        Op::Kernel(k) => super::kernel::infer_kernel(op, k, args),
        Op::Matmul => {
            expect_args(op, args, 2)?;
            let (ad, a) = expect_tensor(op, args, 0)?;
            let (bd, b) = expect_tensor(op, args, 1)?;
            check_matmul_dtypes(name, ad, bd)?;
            let sizes = matmul_shape(name, a, b)?;
            Ok(Inferred {
                dtype: ad,
                sizes,
                compute: ad,
            })
        }
        Op::Addmm => {
            expect_args(op, args, 5)?;
            let (cd, c) = expect_tensor(op, args, 0)?;
            let (ad, a) = expect_tensor(op, args, 1)?;
            let (bd, b) = expect_tensor(op, args, 2)?;
            check_matmul_dtypes(name, ad, bd)?;
            if cd != ad {
                return Err(OpError::new(
                    name,
                    "input 0",
                    format!("dtype {ad}"),
                    format!("{cd}"),
                ));
            }
            for (i, s) in [(1, a), (2, b)] {
                if s.len() != 2 {
                    return Err(OpError::new(
                        name,
                        format!("input {i}"),
                        "a 2-D matrix",
                        format!("shape {}", fmt_dims(s)),
                    ));
                }
            }
            let sizes = matmul_shape(name, a, b)?;
            let bc = broadcast_shapes(name, &sizes, c, "input 0")?;
            if bc != sizes {
                return Err(OpError::new(
                    name,
                    "input 0",
                    format!("a shape broadcastable to {}", fmt_dims(&sizes)),
                    fmt_dims(c),
                ));
            }
            Ok(Inferred {
                dtype: ad,
                sizes,
                compute: ad,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::shapes::arange_len;
    use crate::ir::{BinaryOp, ReduceOp};
    use smallvec::smallvec;

    fn t(d: DType, s: &[usize]) -> ArgMeta {
        ArgMeta::tensor(d, s)
    }

    #[test]
    fn int_tensor_plus_float_scalar_is_float32() {
        let r = infer(
            &Op::Binary(BinaryOp::Add),
            &[t(DType::I64, &[2]), ArgMeta::Scalar(Scalar::Float(0.5))],
        );
        assert_eq!(r.unwrap().dtype, DType::F32);
    }

    #[test]
    fn half_tensor_plus_float_scalar_stays_half() {
        let r = infer(
            &Op::Binary(BinaryOp::Mul),
            &[t(DType::F16, &[2]), ArgMeta::Scalar(Scalar::Float(0.5))],
        );
        assert_eq!(r.unwrap().dtype, DType::F16);
    }

    #[test]
    fn zero_dim_double_does_not_promote_float_tensor() {
        let r = infer(
            &Op::Binary(BinaryOp::Add),
            &[t(DType::F32, &[3]), t(DType::F64, &[])],
        );
        assert_eq!(r.unwrap().dtype, DType::F32);
    }

    #[test]
    fn int_division_gives_float() {
        let r = infer(
            &Op::Binary(BinaryOp::Div),
            &[t(DType::I32, &[3]), t(DType::I32, &[3])],
        )
        .unwrap();
        assert_eq!((r.dtype, r.compute), (DType::F32, DType::F32));
    }

    #[test]
    fn comparison_computes_in_common_type() {
        let r = infer(
            &Op::Binary(BinaryOp::Lt),
            &[t(DType::I32, &[3]), t(DType::F64, &[3])],
        )
        .unwrap();
        assert_eq!((r.dtype, r.compute), (DType::Bool, DType::F64));
    }

    #[test]
    fn bad_broadcast_names_op_and_operand() {
        let e = infer(
            &Op::Binary(BinaryOp::Add),
            &[t(DType::F32, &[2, 3]), t(DType::F32, &[4])],
        )
        .unwrap_err();
        assert_eq!(e.op, "add");
        assert_eq!(e.operand, "input 1");
    }

    #[test]
    fn reduce_keepdim_shapes() {
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            dims: smallvec![1],
            keepdim: true,
        };
        assert_eq!(
            infer(&op, &[t(DType::F32, &[2, 3, 4])])
                .unwrap()
                .sizes
                .as_slice(),
            &[2, 1, 4]
        );
    }

    #[test]
    fn repeated_reduce_dim_is_rejected() {
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            dims: smallvec![1, 1],
            keepdim: false,
        };
        assert!(infer(&op, &[t(DType::F32, &[2, 3])]).is_err());
    }

    #[test]
    fn mean_of_int_is_rejected() {
        let op = Op::Reduce {
            op: ReduceOp::Mean,
            dims: smallvec![],
            keepdim: false,
        };
        assert!(infer(&op, &[t(DType::I64, &[2])]).is_err());
    }

    #[test]
    fn batched_matmul_broadcasts_batch_dims() {
        let s = matmul_shape("matmul", &[2, 1, 3, 4], &[5, 4, 6]).unwrap();
        assert_eq!(s.as_slice(), &[2, 5, 3, 6]);
        assert!(matmul_shape("matmul", &[3, 4], &[5, 6]).is_err());
    }

    #[test]
    fn arange_length_matches_pytorch() {
        assert_eq!(arange_len(0.0, 10.0, 3.0).unwrap(), 4);
        assert_eq!(arange_len(1.0, 0.0, -0.25).unwrap(), 4);
        assert!(arange_len(0.0, 1.0, 0.0).is_err());
    }
}
