//! The grouped matrix product's host routine (`KernelOp::GroupedMatmul`): the offsets are read
//! when the op runs, and each group is one product of its own block through the CPU backend's
//! GEMM (`cpu::matmul`, the same kernels and summation order as `mm` on that block).

use super::elem::{read_i64, write_f64};
use super::{for_each_row, View};
use crate::backend::cpu::matmul::{matmul, Mat};
use deferfuse_fusion::ir::{GroupedMatmul, Layout};
use smallvec::smallvec;

/// A 2-D block of `v` starting at element `[r0, c0]` of its last two dims, `batch` picking
/// the index of a leading dim (3-D operands).
fn block(
    v: &View,
    batch: Option<usize>,
    (r0, c0): (usize, usize),
    rows: usize,
    cols: usize,
) -> Layout {
    let d = v.sizes.len();
    let (rs, cs) = (v.strides[d - 2], v.strides[d - 1]);
    let lead = batch.map_or(0, |g| g as isize * v.strides[0]);
    let offset = v.offset + lead + r0 as isize * rs + c0 as isize * cs;
    Layout {
        sizes: smallvec![rows, cols],
        strides: smallvec![rs, cs],
        offset: offset as usize,
    }
}

/// `out = grouped product of a and b` cut by `offs` (see [`GroupedMatmul`] for the cases and
/// how out-of-range offsets are clamped); what no group covers is zero.
///
/// # Safety
/// Every view must lie inside its buffer; `out` must not overlap `a`, `b` or `offs`.
pub(super) unsafe fn run(case: GroupedMatmul, a: &View, b: &View, offs: &View, out: &View) {
    zero(out);
    let groups = offs.sizes[0];
    let extent = match case {
        GroupedMatmul::Rows => a.sizes[0],
        GroupedMatmul::Cols => b.sizes[1],
        GroupedMatmul::Contraction => a.sizes[1],
    };
    let clamp = |v: i64| v.clamp(0, extent as i64) as usize;
    let (m_all, k_all, n_all) = match case {
        GroupedMatmul::Rows => (a.sizes[0], a.sizes[1], b.sizes[2]),
        GroupedMatmul::Cols => (a.sizes[1], a.sizes[2], b.sizes[1]),
        GroupedMatmul::Contraction => (a.sizes[0], a.sizes[1], b.sizes[1]),
    };
    let mut start = 0i64;
    for g in 0..groups {
        let end = read_i64(
            offs.dtype,
            offs.base,
            offs.offset + g as isize * offs.strides[0],
        );
        let (lo, hi) = (clamp(start), clamp(end));
        start = end;
        if hi <= lo {
            continue;
        }
        let len = hi - lo;
        let (la, lb, lc) = match case {
            GroupedMatmul::Rows => (
                block(a, None, (lo, 0), len, k_all),
                block(b, Some(g), (0, 0), k_all, n_all),
                block(out, None, (lo, 0), len, n_all),
            ),
            GroupedMatmul::Cols => (
                block(a, Some(g), (0, 0), m_all, k_all),
                block(b, None, (0, lo), k_all, len),
                block(out, None, (0, lo), m_all, len),
            ),
            GroupedMatmul::Contraction => (
                block(a, None, (0, lo), m_all, len),
                block(b, None, (lo, 0), len, n_all),
                block(out, Some(g), (0, 0), m_all, n_all),
            ),
        };
        let rows = lc.sizes[0];
        matmul(
            out.dtype,
            Mat {
                ptr: a.base,
                layout: &la,
            },
            Mat {
                ptr: b.base,
                layout: &lb,
            },
            Mat {
                ptr: out.base,
                layout: &lc,
            },
            1.0,
            0.0,
            rows,
        );
    }
}

/// Writes zero to every element of `v`.
unsafe fn zero(v: &View) {
    let last = v.sizes.len() - 1;
    let (n, step) = (v.sizes[last], v.strides[last]);
    for_each_row(&v.sizes, last, &[v], |_, o| {
        for i in 0..n as isize {
            // SAFETY: the caller's contract: the view lies inside its buffer.
            unsafe { write_f64(v.dtype, v.base, o[0] + i * step, 0.0) };
        }
    });
}
