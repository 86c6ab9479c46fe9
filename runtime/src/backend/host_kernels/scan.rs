//! `cumsum` / `cumprod` along one dim. The input is first converted to the result dtype (torch's
//! `dtype=`); floats accumulate in torch's CPU accumulation type (f64 for f32 and f64, f32 for
//! f16 and bf16) and each output is rounded to the result dtype; integers accumulate in int64,
//! wrapping.

use super::elem::{read_f64, read_i64, round_to, wrap_to, write_f64, write_i64};
use super::{for_each_row, View};
use deferfuse_fusion::ir::{DType, ScanOp};

/// Scans `input` along `dim` into `out` (of the result dtype).
pub(super) fn run(op: ScanOp, dim: usize, input: &View, out: &View) {
    let n = input.sizes[dim];
    let (is, os) = (input.strides[dim], out.strides[dim]);
    let rt = out.dtype;
    let acc_dt = match rt {
        DType::F16 | DType::BF16 => DType::F32,
        _ => DType::F64,
    };
    for_each_row(&input.sizes, dim, &[input, out], |_, o| {
        if rt.is_float() {
            let mut acc = match op {
                ScanOp::Sum => 0.0,
                ScanOp::Prod => 1.0,
            };
            for j in 0..n as isize {
                // SAFETY: both views lie inside their buffers.
                unsafe {
                    let x = round_to(rt, read_f64(input.dtype, input.base, o[0] + j * is));
                    acc = round_to(
                        acc_dt,
                        match op {
                            ScanOp::Sum => acc + x,
                            ScanOp::Prod => acc * x,
                        },
                    );
                    write_f64(rt, out.base, o[1] + j * os, acc);
                }
            }
        } else {
            let mut acc: i64 = match op {
                ScanOp::Sum => 0,
                ScanOp::Prod => 1,
            };
            for j in 0..n as isize {
                // SAFETY: both views lie inside their buffers.
                unsafe {
                    let x = wrap_to(rt, read_i64(input.dtype, input.base, o[0] + j * is));
                    acc = match op {
                        ScanOp::Sum => acc.wrapping_add(x),
                        ScanOp::Prod => acc.wrapping_mul(x),
                    };
                    write_i64(rt, out.base, o[1] + j * os, acc);
                }
            }
        }
    });
}
