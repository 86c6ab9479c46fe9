//! The widening product's host routine (`KernelOp::WideMatmul`): a float16/bfloat16 `a @ b`
//! whose float32 sums are written as they are (`half_gemm::matmul_f32_out`: on AVX512-BF16
//! cores `vdpbf16ps` pair dot products, at twice the float32 kernels' rate). Batch dims
//! broadcast; each batch's rows are split over threads when there is work enough, every block
//! taking the whole product's kernel, so the bits do not depend on the split.

use super::{jobs, View};
use crate::backend::cpu::half_gemm::{matmul_f32_out, HalfMat};
use crate::backend::SideBySide;
use crate::error::Result;

/// Fewest multiply-adds worth splitting a product's rows over threads.
const SERIAL_BELOW_MACS: usize = 1 << 22;

/// Fewest rows a thread's block takes.
const MIN_ROWS: usize = 16;

/// `out = a @ b` (see the module doc).
///
/// # Safety
/// Every view lies inside its buffer; `a` and `b` hold 16-bit floats of one dtype, `out` f32
/// of the product's shape, overlapping neither.
pub(super) unsafe fn run(
    a: &View,
    b: &View,
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    let r = out.sizes.len();
    let (m, k, n) = (
        out.sizes[r - 2],
        a.sizes[a.sizes.len() - 1],
        out.sizes[r - 1],
    );
    let batch = &out.sizes[..r - 2];
    let batches: usize = batch.iter().product();
    let blocks = match threads {
        Some(t) if m * k * n * batches >= SERIAL_BELOW_MACS => t.threads().min(m / MIN_ROWS).max(1),
        _ => 1,
    };
    // Element offset of batch `i` (row-major over `batch`) in view `v`, its batch dims
    // right-aligned with out's and broadcast where of size 1.
    let offset = |v: &View, mut i: usize| -> isize {
        let vb = v.sizes.len() - 2;
        let mut at = v.offset;
        for d in (0..batch.len()).rev() {
            let idx = i % batch[d];
            i /= batch[d];
            if let Some(vd) = (d + vb).checked_sub(batch.len()) {
                if v.sizes[vd] != 1 {
                    at += idx as isize * v.strides[vd];
                }
            }
        }
        at
    };
    let half = |v: &View, at: isize, rows: std::ops::Range<usize>, cols: usize| {
        let (rs, cs) = (v.strides[v.sizes.len() - 2], v.strides[v.sizes.len() - 1]);
        HalfMat {
            ptr: (v.base as *mut u16).offset(at + rows.start as isize * rs),
            rows: rows.len(),
            cols,
            rs,
            cs,
        }
    };
    let (rs, cs) = (out.strides[r - 2], out.strides[r - 1]);
    let dtype = a.dtype;
    let job = |j: usize| {
        let rows = (m * (j % blocks) / blocks)..(m * (j % blocks + 1) / blocks);
        let i = j / blocks;
        // SAFETY: the caller's contract; each job writes only its own rows of its batch.
        unsafe {
            let c = (out.base as *mut f32).offset(offset(out, i) + rows.start as isize * rs);
            let (a, b) = (
                half(a, offset(a, i), rows, k),
                half(b, offset(b, i), 0..k, n),
            );
            matmul_f32_out(dtype, m, a, b, (c, rs, cs));
        }
        Ok(())
    };
    jobs(threads.filter(|_| blocks > 1), batches * blocks, &job)
}
