//! Dtype rules of the elementwise unary and binary ops: which dtypes each op accepts, what it
//! produces and what it computes in. Split off [`super::infer`] so the per-op rules read as one
//! list.

use super::dtype::{Category, DType};
use super::error::{OpError, OpResult};
use super::infer::{
    broadcast_all, expect_args, expect_tensor, float_of, result_type, ArgMeta, Inferred,
};
use super::op::{BinaryOp, Op, UnaryOp};

/// Output and compute dtype of `op(x)` for a tensor `x`, or why `x`'s dtype is not accepted.
pub(super) fn infer_unary(op: &Op, u: UnaryOp, args: &[ArgMeta]) -> OpResult<Inferred> {
    let name = op.name();
    expect_args(op, args, 1)?;
    let (dt, sizes) = expect_tensor(op, args, 0)?;
    let sizes = sizes.clone();
    let bad = |what: &str| {
        Err(
            OpError::new(name, "input 0", what.to_string(), format!("dtype {dt}"))
                .hint("cast the input with .to(dtype) first"),
        )
    };
    let out = match u {
        UnaryOp::LogicalNot | UnaryOp::IsNan => {
            return Ok(Inferred {
                dtype: DType::Bool,
                sizes,
                compute: dt,
            })
        }
        UnaryOp::GeluErf | UnaryOp::GeluTanh | UnaryOp::Silu if !dt.is_float() => {
            return bad("a floating dtype")
        }
        UnaryOp::Neg if dt == DType::Bool => {
            return bad("a numeric dtype (use logical_not for bool)")
        }
        UnaryOp::Relu | UnaryOp::Abs | UnaryOp::Trunc if dt == DType::Bool => {
            return bad("a numeric dtype")
        }
        // PyTorch's wording: "bitwise_not: ... expected an integer or bool tensor, got float32".
        UnaryOp::BitwiseNot if dt.is_float() => {
            return Err(
                OpError::new(name, "input 0", "an integer or bool tensor", dt.name())
                    .hint("use logical_not, or cast the input to an integer dtype"),
            )
        }
        u if u.is_float_op() => float_of(dt),
        _ => dt,
    };
    Ok(Inferred {
        dtype: out,
        sizes,
        compute: out,
    })
}

/// Output and compute dtype of `op(x, y)` (tensors or scalars), or why the operands are not
/// accepted.
pub(super) fn infer_binary(op: &Op, b: BinaryOp, args: &[ArgMeta]) -> OpResult<Inferred> {
    let name = op.name();
    expect_args(op, args, 2)?;
    if !args.iter().any(|a| matches!(a, ArgMeta::Tensor { .. })) {
        return Err(OpError::new(
            name,
            "inputs",
            "at least one tensor",
            "two scalars",
        ));
    }
    let sizes = broadcast_all(name, args)?;
    let common = result_type(args);
    if b == BinaryOp::Sub && common == DType::Bool {
        return Err(
            OpError::new(name, "inputs", "numeric tensors", "two bool operands")
                .hint("use logical_xor or ~ for bool tensors"),
        );
    }
    if b.rejects_bool() && common == DType::Bool {
        return Err(
            OpError::new(name, "inputs", "numeric tensors", "two bool operands")
                .hint("cast the operands to an integer dtype first"),
        );
    }
    if b.is_bitwise() && common.is_float() {
        return Err(float_operand_error(name, args));
    }
    let (dtype, compute) = match b {
        BinaryOp::Mul | BinaryOp::Div
            if matches!(float_of(common), DType::F16 | DType::BF16) && one_element(&args[1]) =>
        {
            // PyTorch multiplies and divides f16/bf16 by a single-element second operand (a
            // Python scalar, a 0-dim tensor of any float dtype) with that operand kept in
            // float32 (`original_scalar_value`), rounding once; other ops round it to f16 first.
            (float_of(common), DType::F32)
        }
        BinaryOp::Div | BinaryOp::Atan2 => (float_of(common), float_of(common)),
        BinaryOp::FloorDivide | BinaryOp::TruncDivide
            if matches!(common, DType::F16 | DType::BF16) && one_element(&args[1]) =>
        {
            // PyTorch divides f16/bf16 by a single-element divisor (a Python scalar, a 0-dim
            // or one-element tensor) in float32, rounding once; two tensors step by step in
            // their dtype (the backends round each step when they compute in f16/bf16).
            (common, DType::F32)
        }
        b if b.gives_bool() => (DType::Bool, common),
        _ => (common, common),
    };
    Ok(Inferred {
        dtype,
        sizes,
        compute,
    })
}

/// A scalar or a tensor of one element.
fn one_element(a: &ArgMeta) -> bool {
    match a {
        ArgMeta::Tensor { sizes, .. } => sizes.iter().product::<usize>() == 1,
        _ => true,
    }
}

/// The error of a bitwise op given a float operand: names the first float one.
fn float_operand_error(name: &str, args: &[ArgMeta]) -> OpError {
    let (i, got) = args
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a {
            ArgMeta::Tensor { dtype, .. } if dtype.is_float() => Some((i, dtype.name().into())),
            ArgMeta::Scalar(s) if s.category() == Category::Float => {
                Some((i, format!("the float scalar {s}")))
            }
            _ => None,
        })
        .expect("a float result type has a float operand");
    OpError::new(
        name,
        format!("input {i}"),
        "an integer or bool tensor or scalar",
        got,
    )
    .hint("bitwise ops take bool and integer operands only")
}

#[cfg(test)]
mod tests {
    use super::super::infer::infer;
    use super::super::op::Scalar;
    use super::*;

    fn t(d: DType) -> ArgMeta {
        ArgMeta::tensor(d, &[3])
    }

    fn binary(b: BinaryOp, x: ArgMeta, y: ArgMeta) -> OpResult<Inferred> {
        infer(&Op::Binary(b), &[x, y])
    }

    #[test]
    fn bitwise_not_of_a_float_names_the_op_like_pytorch() {
        let e = infer(&Op::Unary(UnaryOp::BitwiseNot), &[t(DType::F32)]).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "bitwise_not: input 0: expected an integer or bool tensor, got float32"
            ),
            "{e}"
        );
    }

    #[test]
    fn bitwise_not_keeps_bool_and_integer_dtypes() {
        for d in [DType::Bool, DType::U8, DType::I32, DType::I64] {
            let r = infer(&Op::Unary(UnaryOp::BitwiseNot), &[t(d)]).unwrap();
            assert_eq!((r.dtype, r.compute), (d, d));
        }
    }

    #[test]
    fn trunc_keeps_integers_and_rejects_bool() {
        let r = infer(&Op::Unary(UnaryOp::Trunc), &[t(DType::I64)]).unwrap();
        assert_eq!(r.dtype, DType::I64);
        assert!(infer(&Op::Unary(UnaryOp::Trunc), &[t(DType::Bool)]).is_err());
    }

    #[test]
    fn log_and_trig_ops_of_integers_give_float32() {
        use UnaryOp::*;
        for u in [
            Log2, Log10, Sinh, Cosh, Tan, Asin, Acos, Atan, Asinh, Acosh, Atanh,
        ] {
            let r = infer(&Op::Unary(u), &[t(DType::U8)]).unwrap();
            assert_eq!((r.dtype, r.compute), (DType::F32, DType::F32));
        }
    }

    #[test]
    fn bitwise_binary_ops_promote_like_integers() {
        let r = binary(BinaryOp::BitwiseAnd, t(DType::U8), t(DType::I32)).unwrap();
        assert_eq!(r.dtype, DType::I32);
        let r = binary(
            BinaryOp::BitwiseXor,
            t(DType::Bool),
            ArgMeta::Scalar(Scalar::Bool(true)),
        );
        assert_eq!(r.unwrap().dtype, DType::Bool);
        let r = binary(
            BinaryOp::BitwiseOr,
            t(DType::I32),
            ArgMeta::Scalar(Scalar::Int(1 << 40)),
        );
        assert_eq!(r.unwrap().dtype, DType::I32);
    }

    #[test]
    fn bitwise_binary_ops_name_the_float_operand() {
        let e = binary(BinaryOp::BitwiseOr, t(DType::I32), t(DType::F64)).unwrap_err();
        assert_eq!(
            (e.op.as_str(), e.operand.as_str()),
            ("bitwise_or", "input 1")
        );
        assert_eq!(e.got, "float64");
        let e = binary(
            BinaryOp::BitwiseAnd,
            t(DType::I64),
            ArgMeta::Scalar(Scalar::Float(2.5)),
        )
        .unwrap_err();
        assert_eq!(e.got, "the float scalar 2.5");
    }

    #[test]
    fn half_division_by_one_element_computes_in_float32() {
        for b in [BinaryOp::FloorDivide, BinaryOp::TruncDivide] {
            for d in [
                ArgMeta::Scalar(Scalar::Float(0.7)),
                ArgMeta::tensor(DType::F16, &[]),
                ArgMeta::tensor(DType::F16, &[1, 1]),
            ] {
                let r = binary(b, t(DType::F16), d).unwrap();
                assert_eq!((r.dtype, r.compute), (DType::F16, DType::F32));
            }
            let r = binary(b, t(DType::BF16), t(DType::BF16)).unwrap();
            assert_eq!((r.dtype, r.compute), (DType::BF16, DType::BF16));
        }
    }

    #[test]
    fn half_mul_and_div_by_one_element_compute_in_float32() {
        for b in [BinaryOp::Mul, BinaryOp::Div] {
            for d in [
                ArgMeta::Scalar(Scalar::Float(0.1)),
                ArgMeta::tensor(DType::F32, &[]),
                ArgMeta::tensor(DType::BF16, &[1]),
            ] {
                let r = binary(b, t(DType::BF16), d).unwrap();
                assert_eq!((r.dtype, r.compute), (DType::BF16, DType::F32));
            }
            let r = binary(b, ArgMeta::tensor(DType::F16, &[]), t(DType::F16)).unwrap();
            assert_eq!(
                (r.dtype, r.compute),
                (DType::F16, DType::F16),
                "a one-element first operand is rounded like any other"
            );
        }
        let r = binary(
            BinaryOp::Add,
            t(DType::F16),
            ArgMeta::Scalar(Scalar::Float(0.1)),
        );
        assert_eq!(
            r.unwrap().compute,
            DType::F16,
            "add rounds the scalar to f16"
        );
    }

    #[test]
    fn atan2_of_integers_gives_float32() {
        let r = binary(BinaryOp::Atan2, t(DType::I64), t(DType::Bool)).unwrap();
        assert_eq!((r.dtype, r.compute), (DType::F32, DType::F32));
        let r = binary(BinaryOp::Atan2, t(DType::F64), t(DType::I32)).unwrap();
        assert_eq!(r.dtype, DType::F64);
    }

    #[test]
    fn division_family_keeps_the_common_dtype_and_rejects_two_bools() {
        for b in [BinaryOp::Fmod, BinaryOp::FloorDivide, BinaryOp::TruncDivide] {
            let r = binary(b, t(DType::U8), ArgMeta::Scalar(Scalar::Int(-3))).unwrap();
            assert_eq!((r.dtype, r.compute), (DType::U8, DType::U8));
            let r = binary(b, t(DType::I32), ArgMeta::Scalar(Scalar::Float(0.5))).unwrap();
            assert_eq!(r.dtype, DType::F32);
            let e = binary(b, t(DType::Bool), t(DType::Bool)).unwrap_err();
            assert_eq!(e.got, "two bool operands", "{}", b.name());
        }
    }
}
