//! `cumsum` / `cumprod` along one dim. The input is first converted to the result dtype (torch's
//! `dtype=`); floats accumulate in torch's CPU accumulation type (f64 for f32 and f64, f32 for
//! f16 and bf16) and each output is rounded to the result dtype; integers accumulate in int64,
//! wrapping.
//!
//! Rows whose input already has the result dtype (f32, f64, int64: a model's cumsum of
//! probabilities, of an int64 attention mask into position ids) take a loop typed for it: the
//! generic loop converts every element through `f64` by a dtype match, ~7 ns an element (a
//! [4096, 64] f32 cumsum ran 1.8 ms against CPU eager's 0.2). Same operations, same bits.

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
    if input.dtype == rt && matches!(rt, DType::F32 | DType::F64 | DType::I64) {
        for_each_row(&input.sizes, dim, &[input, out], |_, o| {
            // SAFETY: both views lie inside their buffers and have dtype `rt`.
            unsafe {
                let (x, y) = (input.base.cast_const(), out.base);
                match rt {
                    DType::F32 => scan_row::<f32>(op, x, y, o, (n, is, os)),
                    DType::F64 => scan_row::<f64>(op, x, y, o, (n, is, os)),
                    _ => scan_row::<i64>(op, x, y, o, (n, is, os)),
                }
            }
        });
        return;
    }
    for_each_row(&input.sizes, dim, &[input, out], |_, o| {
        if rt.is_float() {
            let mut acc = f64::start(op);
            for j in 0..n as isize {
                // SAFETY: both views lie inside their buffers.
                unsafe {
                    let x = round_to(rt, read_f64(input.dtype, input.base, o[0] + j * is));
                    acc = round_to(acc_dt, acc.step(op, x));
                    write_f64(rt, out.base, o[1] + j * os, acc);
                }
            }
        } else {
            let mut acc = i64::start(op);
            for j in 0..n as isize {
                // SAFETY: both views lie inside their buffers.
                unsafe {
                    let x = wrap_to(rt, read_i64(input.dtype, input.base, o[0] + j * is));
                    acc = acc.step(op, x);
                    write_i64(rt, out.base, o[1] + j * os, acc);
                }
            }
        }
    });
}

/// A scan's accumulator, in both loops: f64 (floats; the generic loop rounds it to f32 for the
/// half dtypes) or wrapping int64.
trait Acc: Copy {
    /// The start value of `op`'s scan and one step of it.
    fn start(op: ScanOp) -> Self;
    fn step(self, op: ScanOp, x: Self) -> Self;
}

impl Acc for f64 {
    fn start(op: ScanOp) -> f64 {
        (op == ScanOp::Prod) as u8 as f64
    }
    fn step(self, op: ScanOp, x: f64) -> f64 {
        if op == ScanOp::Sum {
            self + x
        } else {
            self * x
        }
    }
}

impl Acc for i64 {
    fn start(op: ScanOp) -> i64 {
        (op == ScanOp::Prod) as i64
    }
    fn step(self, op: ScanOp, x: i64) -> i64 {
        if op == ScanOp::Sum {
            self.wrapping_add(x)
        } else {
            self.wrapping_mul(x)
        }
    }
}

/// An element type a row may be scanned in directly: its accumulator, and each output the
/// accumulator rounded to it (f32), or itself.
trait Scanned: Copy {
    type Acc: Acc;
    fn widen(self) -> Self::Acc;
    fn narrow(acc: Self::Acc) -> Self;
}

impl Scanned for f32 {
    type Acc = f64;
    fn widen(self) -> f64 {
        self as f64
    }
    fn narrow(acc: f64) -> f32 {
        acc as f32
    }
}

impl Scanned for f64 {
    type Acc = f64;
    fn widen(self) -> f64 {
        self
    }
    fn narrow(acc: f64) -> f64 {
        acc
    }
}

impl Scanned for i64 {
    type Acc = i64;
    fn widen(self) -> i64 {
        self
    }
    fn narrow(acc: i64) -> i64 {
        acc
    }
}

/// Scans one row of `n` elements of `T`, the input's at element offset `o[0]` (stride `is`),
/// the output's at `o[1]` (stride `os`).
///
/// # Safety
/// Both rows lie inside their buffers, which hold `T`s.
unsafe fn scan_row<T: Scanned>(
    op: ScanOp,
    x: *const u8,
    y: *mut u8,
    o: &[isize],
    (n, is, os): (usize, isize, isize),
) {
    let (x, y) = (x.cast::<T>().offset(o[0]), y.cast::<T>().offset(o[1]));
    let mut acc = T::Acc::start(op);
    for j in 0..n as isize {
        acc = acc.step(op, (*x.offset(j * is)).widen());
        *y.offset(j * os) = T::narrow(acc);
    }
}
