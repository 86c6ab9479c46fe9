//! Products of one to four rows by a plain B (rows contiguous: GPT-2's Conv1D `x @ W` at batch
//! 1-4, an input gradient `g @ W`) on AVX2 cores: B read once, row after row, in its memory
//! order.
//!
//! Such a product reads every element of B once, so its time is B's trip from memory.
//! `small_gemm`'s 8-lane kernel walks B 16-64 columns at a time down all of k, a few lines a
//! row stride apart per k, which the prefetchers follow poorly once B is larger than L2 (GPT-2's
//! `[1, 3072] @ [3072, 768]` took 1.3x torch's time). Here each pass takes up to [`NC`] columns
//! of B and walks down its rows, two at a time, adding them into sums kept in an L1-sized
//! buffer: the AVX-512 cores' `gemv_avx512::rows`, at 8 lanes.
//!
//! Bit-identity is `small_gemm`'s (see its module doc): lanes are output columns, every element
//! is summed per `small_gemm::KC`-long k-block in k order, `acc = fma(a, b, acc)` from +0, then
//! `t = fma(alpha, acc, +0)` and `c = t` (first block, `beta == 0`) or `c = c * beta' + t`. So a
//! block of rows may take this kernel in one run and another in the next.

use super::small_gemm::KC;
use std::arch::x86_64::*;

/// Lanes of one vector.
const VL: usize = 8;

/// Most rows this module takes.
const MAX_ROWS: usize = 4;

/// Columns of B per pass down its rows: the rows' sums (`MAX_ROWS * NC` floats, 16 KiB) stay
/// in L1 while B streams past them.
const NC: usize = 1024;

/// Fewest elements of B for [`takes`]: below it B sits in L2 and `small_gemm`'s kernel, which
/// keeps its sums in registers, is as fast.
const MIN_B: usize = 1 << 16;

/// Whether [`sgemm`] takes the shape: at most four rows, B's rows contiguous (`csb == 1`) and
/// B larger than [`MIN_B`], on a CPU with AVX2 and FMA.
pub(super) fn takes((m, k, n): (usize, usize, usize), csb: isize) -> bool {
    (1..=MAX_ROWS).contains(&m)
        && n > 0
        && csb == 1
        && k * n >= MIN_B
        && super::small_gemm::has_fma_avx2()
}

/// `c = alpha * a @ b + beta * c` for `m <= 4` rows and a B with contiguous rows, bit for bit
/// as `matrixmultiply::sgemm`.
///
/// # Safety
/// As `matrixmultiply::sgemm`; [`takes`] holds.
pub(super) unsafe fn sgemm(
    mkn: (usize, usize, usize),
    alpha: f32,
    a: (*const f32, isize, isize),
    b: (*const f32, isize, isize),
    beta: f32,
    c: (*mut f32, isize, isize),
) {
    match mkn.0 {
        1 => rows::<1>(mkn, alpha, a, b, beta, c),
        2 => rows::<2>(mkn, alpha, a, b, beta, c),
        3 => rows::<3>(mkn, alpha, a, b, beta, c),
        _ => rows::<4>(mkn, alpha, a, b, beta, c),
    }
}

/// `R` rows by B: per k-block and [`NC`] columns, the block's rows of B streamed in order into
/// sums kept in memory (L1), two rows of B per pass over the sums (`fma(a1, b1, fma(a0, b0,
/// acc))`: the same order, half the sums' traffic). The sums are kept column group by column
/// group, each group's `R` rows side by side, as `gemv_avx512` keeps them (row by row was
/// 2-10% slower here on Zen 4, and 3x slower there).
// Indexed loops: each vector of B is loaded once and used by every row's sums.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows<const R: usize>(
    (_, k, n): (usize, usize, usize),
    alpha: f32,
    (a, rsa, csa): (*const f32, isize, isize),
    (b, rsb, _): (*const f32, isize, isize),
    beta: f32,
    c: (*mut f32, isize, isize),
) {
    let mut acc = [[_mm256_setzero_ps(); R]; NC / VL];
    for j0 in (0..n).step_by(NC) {
        let w = NC.min(n - j0);
        let nv = w.div_ceil(VL);
        let last = lane_mask(w - (nv - 1) * VL);
        let all = lane_mask(VL);
        let load = |p: *const f32, v: usize| {
            let mask = if v + 1 == nv { last } else { all };
            _mm256_maskload_ps(p.add(v * VL), mask)
        };
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for sums in acc[..nv].iter_mut() {
                sums.fill(_mm256_setzero_ps());
            }
            let a_at = |r: usize, p: usize| {
                _mm256_set1_ps(*a.offset(r as isize * rsa + (k0 + p) as isize * csa))
            };
            let b_row = |p: usize| b.offset((k0 + p) as isize * rsb + j0 as isize);
            let mut p = 0;
            while p + 2 <= kc {
                let (b0, b1) = (b_row(p), b_row(p + 1));
                let x0: [__m256; R] = std::array::from_fn(|r| a_at(r, p));
                let x1: [__m256; R] = std::array::from_fn(|r| a_at(r, p + 1));
                for v in 0..nv {
                    let (y0, y1) = (load(b0, v), load(b1, v));
                    for r in 0..R {
                        acc[v][r] =
                            _mm256_fmadd_ps(x1[r], y1, _mm256_fmadd_ps(x0[r], y0, acc[v][r]));
                    }
                }
                p += 2;
            }
            if p < kc {
                let b0 = b_row(p);
                let x0: [__m256; R] = std::array::from_fn(|r| a_at(r, p));
                for v in 0..nv {
                    let y0 = load(b0, v);
                    for r in 0..R {
                        acc[v][r] = _mm256_fmadd_ps(x0[r], y0, acc[v][r]);
                    }
                }
            }
            let beta = if k0 == 0 { beta } else { 1.0 };
            for (v, sums) in acc.iter().enumerate().take(nv) {
                for (r, &x) in sums.iter().enumerate() {
                    let first = j0 + v * VL;
                    finish(x, alpha, beta, at(c, r, first), c.2, w - v * VL);
                }
            }
        }
    }
}

/// A mask selecting the first `len` (at most 8) lanes for `_mm256_maskload_ps`; masked-off
/// lanes are neither read nor faulted and load as zero.
#[inline(always)]
unsafe fn lane_mask(len: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(len.min(VL) as i32), idx)
}

/// C's element (r, j).
#[inline(always)]
unsafe fn at((c, rsc, csc): (*mut f32, isize, isize), r: usize, j: usize) -> *mut f32 {
    c.offset(r as isize * rsc + j as isize * csc)
}

/// Writes one vector of sums to the `min(valid, 8)` elements of C from `cp` (stride `csc`):
/// `t = fma(alpha, acc, +0)`, then `c = t` (`beta == 0`: C is not read) or `c * beta + t`.
#[inline(always)]
unsafe fn finish(acc: __m256, alpha: f32, beta: f32, cp: *mut f32, csc: isize, valid: usize) {
    let t = _mm256_fmadd_ps(_mm256_set1_ps(alpha), acc, _mm256_setzero_ps());
    if csc == 1 && valid >= VL {
        let out = if beta == 0.0 {
            t
        } else {
            _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(cp), _mm256_set1_ps(beta)), t)
        };
        _mm256_storeu_ps(cp, out);
        return;
    }
    let mut lanes = [0f32; VL];
    _mm256_storeu_ps(lanes.as_mut_ptr(), t);
    for (l, &x) in lanes.iter().enumerate().take(valid) {
        let p = cp.offset(l as isize * csc);
        *p = if beta == 0.0 { x } else { *p * beta + x };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::small_gemm::tests::{assert_same_bits, both_with};

    /// This kernel's C and `matrixmultiply`'s, C row-major with column stride `csc`.
    fn both(mkn: (usize, usize, usize), ab: (f32, f32), csc: usize) -> (Vec<f32>, Vec<f32>) {
        both_with(sgemm, mkn, ("rows", "rows"), ab, csc)
    }

    #[test]
    fn few_rows_by_a_large_plain_b_match_matrixmultiply_bit_for_bit() {
        if !super::super::small_gemm::has_fma_avx2() {
            return;
        }
        // k across blocks, odd, and with a last block of one row; n with a partial last vector
        // and more than one pass of NC columns; C row-major and with a column stride.
        for m in 1..=MAX_ROWS {
            for (k, n) in [(256, 256), (513, 130), (97, 1030), (3072, 768), (20, 3300)] {
                for (alpha, beta) in [(1.0, 0.0), (1.0, 1.0), (1.0, 0.5), (0.5, 2.0)] {
                    for csc in [1usize, 2] {
                        assert!(takes((m, k, n), 1), "{m}x{k}x{n}");
                        let (ours, theirs) = both((m, k, n), (alpha, beta), csc);
                        let what = format!("{m}x{k}x{n} alpha {alpha} beta {beta} csc {csc}");
                        assert_same_bits(&ours, &theirs, &what);
                    }
                }
            }
        }
    }

    #[test]
    fn small_or_transposed_b_is_left_to_the_other_kernels() {
        assert!(!takes((1, 128, 384), 1), "B in L2");
        assert!(!takes((1, 1024, 1024), 1024), "B transposed");
        assert!(!takes((5, 1024, 1024), 1), "five rows");
    }
}
