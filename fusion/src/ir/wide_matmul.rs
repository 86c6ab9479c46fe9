//! The widening product (`KernelOp::WideMatmul`): `a @ b` of two float16 or bfloat16 operands
//! summed in float32 and returned in float32, not rounded to the operands' dtype.
//!
//! A half-precision convolution's input gradient adds each tap's contribution back where its
//! windows overlap; rounded to the half type before those adds, the result erred up to 0.17 of
//! itself where CPU's kernels (which sum in float32 and round once) err 0.004. So those
//! contributions are made in float32: before this op by widening both operands and running a
//! float32 product, at the float32 rate; here the products stay half precision (each product
//! of two half values is exact in float32) and only the sums are float32, at the half-precision
//! kernel's rate. Batch dims broadcast as `torch.matmul`'s do; both operands at least 2-D.

use super::dtype::DType;
use super::error::{OpError, OpResult};
use super::infer::{ArgMeta, Inferred};
use super::kernel::tensor;
use super::shapes::{check_numel, matmul_shape};

const NAME: &str = "wide_matmul";

/// Shape and dtype of `wide_matmul(a, b)`: the product's shape, float32.
pub(super) fn infer_wide_matmul(args: &[ArgMeta]) -> OpResult<Inferred> {
    if args.len() != 2 {
        return Err(OpError::new(
            NAME,
            "inputs",
            "2 tensors (a, b)",
            format!("{} inputs", args.len()),
        ));
    }
    let (ad, a) = tensor(NAME, args, 0, "a")?;
    let (bd, b) = tensor(NAME, args, 1, "b")?;
    if !matches!(ad, DType::F16 | DType::BF16) {
        return Err(
            OpError::new(NAME, "input 0 (a)", "float16 or bfloat16", format!("{ad}"))
                .hint("a float32 product needs no widening: use matmul"),
        );
    }
    if bd != ad {
        return Err(OpError::new(
            NAME,
            "input 1 (b)",
            format!("dtype {ad} (same as a)"),
            format!("{bd}"),
        ));
    }
    for (i, s) in [(0, a), (1, b)] {
        if s.len() < 2 {
            return Err(OpError::new(
                NAME,
                format!("input {i}"),
                "at least 2 dims",
                format!("{} dims", s.len()),
            ));
        }
    }
    let sizes = matmul_shape(NAME, a, b)?;
    check_numel(NAME, &sizes)?;
    Ok(Inferred {
        dtype: DType::F32,
        sizes,
        compute: DType::F32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    fn t(dtype: DType, sizes: &[usize]) -> ArgMeta {
        ArgMeta::Tensor {
            dtype,
            sizes: sizes.into(),
        }
    }

    #[test]
    fn a_bf16_product_has_the_product_s_shape_in_float32() {
        let r = infer_wide_matmul(&[t(DType::BF16, &[3, 4, 5]), t(DType::BF16, &[5, 7])]).unwrap();
        assert_eq!((r.dtype, r.sizes), (DType::F32, smallvec![3, 4, 7]));
    }

    #[test]
    fn a_float32_operand_fails_naming_it_and_pointing_to_matmul() {
        let e = infer_wide_matmul(&[t(DType::F32, &[4, 5]), t(DType::F32, &[5, 7])]).unwrap_err();
        assert!(e.to_string().contains("input 0 (a)"), "{e}");
        assert!(e.to_string().contains("use matmul"), "{e}");
    }

    #[test]
    fn operands_of_two_dtypes_fail_naming_b() {
        let e = infer_wide_matmul(&[t(DType::F16, &[4, 5]), t(DType::BF16, &[5, 7])]).unwrap_err();
        assert!(e.to_string().contains("input 1 (b)"), "{e}");
    }

    #[test]
    fn mismatched_inner_sizes_fail() {
        assert!(infer_wide_matmul(&[t(DType::F16, &[4, 5]), t(DType::F16, &[6, 7])]).is_err());
    }
}
