//! Products whose whole output has one to four rows, by a transposed B (a Linear's `x @ W.t()`
//! at batch 1-4, as in token-by-token generation; `q @ k^T` for one query): each output element
//! is a dot product along one of W's rows, read in its memory order.
//!
//! Everywhere else the CPU backend sums each element in `matrixmultiply`'s order (lanes are
//! output columns, k in order), because the runtime cuts a GEMM into row blocks and a row must
//! get the same bits whichever kernel its block reaches. With a transposed B that order needs W
//! transposed on the fly (8x8 in registers, 24 shuffles per 64 products, or a panel copy), and a
//! one-row product ran at 0.3-0.5x PyTorch's time (MKL's gemv sums along W's rows). A product of
//! at most [`MAX_ROWS`] rows is never cut by rows (a thread takes at least 16, an epilogue block
//! at least 128), only by columns, which leaves each element's sum alone; so the runtime asks
//! for this order by the whole product's row count (`matmul::matmul`'s `whole_rows`), and every
//! row of such a product, in every mode, on every thread count, gets the same bits.
//!
//! The order, which the unit tests pin against a scalar model (`dot_model`): two 8-lane sums,
//! `lo` taking k = 16i..16i+8 and `hi` k = 16i+8..16i+16, each `acc = fma(x, w, acc)` from +0
//! in k order (a last partial group of 16 as if padded with zeros); then `t = lo + hi`, halves
//! added `t[i] + t[i + 4]`, then `u[i] + u[i + 2]`, then `v[0] + v[1]`; then `s * alpha` (unless
//! alpha is 1) and `c * beta + that` (unless beta is 0, when C is not read). It does not depend
//! on how many rows or outputs one pass of the kernel takes. It does depend on the operands'
//! layout: `x @ W.t()` with W as a transposed view takes it, `x @ W.t().contiguous()` (a plain
//! B) or an x whose rows are not contiguous keeps `matrixmultiply`'s; f32 only.

use std::arch::x86_64::*;

/// Most rows of a whole product that take this order.
pub(super) const MAX_ROWS: usize = 4;

/// Whether [`sgemm`] takes a product of `whole_rows` rows in all (`m` of them in this call),
/// A's column stride `csa` and B's row stride `rsb`: A's rows and B's columns (W's rows) must
/// be contiguous along k, and the CPU must have AVX2 and FMA.
pub(super) fn takes(
    whole_rows: usize,
    (m, k, n): (usize, usize, usize),
    csa: isize,
    rsb: isize,
) -> bool {
    (1..=MAX_ROWS).contains(&whole_rows)
        && m <= whole_rows
        && m > 0
        && k > 0
        && n > 0
        && csa == 1
        && rsb == 1
        && super::small_gemm::has_fma_avx2()
}

/// `c = alpha * a @ b + beta * c` for `a: [m, k]` (rows contiguous), `b: [k, n]` with
/// contiguous columns (`rsb == 1`), summed in this module's order.
///
/// # Safety
/// The pointers are valid for every element the strides address, `c` overlaps neither `a`
/// nor `b`, and [`takes`] holds.
pub(super) unsafe fn sgemm(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    (a, rsa, _): (*const f32, isize, isize),
    (b, _, csb): (*const f32, isize, isize),
    beta: f32,
    c: (*mut f32, isize, isize),
) {
    let row = |r: usize| a.offset(r as isize * rsa);
    let mut r = 0;
    while r < m {
        // Six to eight running sums per pass (two per row and output): about as many as an
        // FMA's latency times the two FMA ports keep busy, with few streams of W to prefetch.
        match m - r {
            1 => pass::<1, 4>(k, n, [row(r)], (b, csb), alpha, beta, c, r),
            2 => pass::<2, 2>(k, n, [row(r), row(r + 1)], (b, csb), alpha, beta, c, r),
            3 => pass::<3, 1>(
                k,
                n,
                [row(r), row(r + 1), row(r + 2)],
                (b, csb),
                alpha,
                beta,
                c,
                r,
            ),
            _ => {
                let rows = [row(r), row(r + 1), row(r + 2), row(r + 3)];
                pass::<4, 1>(k, n, rows, (b, csb), alpha, beta, c, r)
            }
        }
        r += (m - r).min(4);
    }
}

/// `R` rows of A against every column of B, `J` columns at a time.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn pass<const R: usize, const J: usize>(
    k: usize,
    n: usize,
    rows: [*const f32; R],
    (b, csb): (*const f32, isize),
    alpha: f32,
    beta: f32,
    (c, rsc, csc): (*mut f32, isize, isize),
    first_row: usize,
) {
    let store = |r: usize, j: usize, s: f32| {
        let p = c.offset((first_row + r) as isize * rsc + j as isize * csc);
        let t = if alpha == 1.0 { s } else { s * alpha };
        *p = if beta == 0.0 { t } else { *p * beta + t };
    };
    let mut j0 = 0;
    while j0 + J <= n {
        let cols: [*const f32; J] = std::array::from_fn(|j| b.offset((j0 + j) as isize * csb));
        let sums = dots::<R, J>(k, rows, cols);
        for (r, row) in sums.iter().enumerate() {
            for (j, &s) in row.iter().enumerate() {
                store(r, j0 + j, s);
            }
        }
        j0 += J;
    }
    for j in j0..n {
        let sums = dots::<R, 1>(k, rows, [b.offset(j as isize * csb)]);
        for (r, row) in sums.iter().enumerate() {
            store(r, j, row[0]);
        }
    }
}

/// The `R x J` dot products of `rows` with `cols`, each `k` long, in this module's order.
#[target_feature(enable = "avx2,fma")]
unsafe fn dots<const R: usize, const J: usize>(
    k: usize,
    rows: [*const f32; R],
    cols: [*const f32; J],
) -> [[f32; J]; R] {
    let mut lo = [[_mm256_setzero_ps(); J]; R];
    let mut hi = [[_mm256_setzero_ps(); J]; R];
    let full = k - k % 16;
    let mut p = 0;
    while p < full {
        let x0: [__m256; R] = std::array::from_fn(|r| _mm256_loadu_ps(rows[r].add(p)));
        let x1: [__m256; R] = std::array::from_fn(|r| _mm256_loadu_ps(rows[r].add(p + 8)));
        for j in 0..J {
            let w0 = _mm256_loadu_ps(cols[j].add(p));
            let w1 = _mm256_loadu_ps(cols[j].add(p + 8));
            for r in 0..R {
                lo[r][j] = _mm256_fmadd_ps(x0[r], w0, lo[r][j]);
                hi[r][j] = _mm256_fmadd_ps(x1[r], w1, hi[r][j]);
            }
        }
        p += 16;
    }
    if p < k {
        // The last partial group, zero-padded; masked-off lanes are neither read nor faulted.
        // The upper half's address may lie past the operand's end (`wrapping_add`: no
        // in-bounds promise) when its mask selects nothing.
        let (m0, m1) = (lane_mask(k - p), lane_mask((k - p).saturating_sub(8)));
        for j in 0..J {
            let w0 = _mm256_maskload_ps(cols[j].add(p), m0);
            let w1 = _mm256_maskload_ps(cols[j].wrapping_add(p + 8), m1);
            for r in 0..R {
                let x0 = _mm256_maskload_ps(rows[r].add(p), m0);
                let x1 = _mm256_maskload_ps(rows[r].wrapping_add(p + 8), m1);
                lo[r][j] = _mm256_fmadd_ps(x0, w0, lo[r][j]);
                hi[r][j] = _mm256_fmadd_ps(x1, w1, hi[r][j]);
            }
        }
    }
    std::array::from_fn(|r| std::array::from_fn(|j| reduce(_mm256_add_ps(lo[r][j], hi[r][j]))))
}

/// A mask selecting the first `len` (at most 8) lanes for `_mm256_maskload_ps`.
#[target_feature(enable = "avx2")]
unsafe fn lane_mask(len: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(len.min(8) as i32), idx)
}

/// `t[i] + t[i + 4]`, then `u[i] + u[i + 2]`, then `v[0] + v[1]`.
#[target_feature(enable = "avx2")]
unsafe fn reduce(t: __m256) -> f32 {
    let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

/// The order [`sgemm`] sums one element in, one float at a time: the unit tests' model of it.
#[cfg(test)]
pub(super) fn dot_model(x: &[f32], w: &[f32]) -> f32 {
    let (mut lo, mut hi) = ([0f32; 8], [0f32; 8]);
    for (p, (&a, &b)) in x.iter().zip(w).enumerate() {
        let acc = if p % 16 < 8 { &mut lo } else { &mut hi };
        acc[p % 8] = a.mul_add(b, acc[p % 8]);
    }
    let t: [f32; 8] = std::array::from_fn(|i| lo[i] + hi[i]);
    let u: [f32; 4] = std::array::from_fn(|i| t[i] + t[i + 4]);
    let v = [u[0] + u[2], u[1] + u[3]];
    v[0] + v[1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values of mixed sign and magnitude, so a changed order changes bits.
    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 2f32.powi((s % 7) as i32 - 3)
            })
            .collect()
    }

    /// Runs [`sgemm`] on `m` rows of `x @ w.t()` (w: `[n, k]`, row stride `ldw >= k`) into a C
    /// of row stride `n + 3`, and the model per element, and compares bits.
    fn check(m: usize, k: usize, n: usize, ldw: usize, alpha: f32, beta: f32) {
        if !super::super::small_gemm::has_fma_avx2() {
            return;
        }
        let x = values(m * k, 1);
        let w = values(n * ldw, 2);
        let ldc = n + 3;
        let c0 = values(m * ldc, 3);
        let mut c = c0.clone();
        unsafe {
            sgemm(
                (m, k, n),
                alpha,
                (x.as_ptr(), k as isize, 1),
                (w.as_ptr(), 1, ldw as isize),
                beta,
                (c.as_mut_ptr(), ldc as isize, 1),
            );
        }
        for i in 0..m {
            for j in 0..n {
                let s = dot_model(&x[i * k..][..k], &w[j * ldw..][..k]);
                let t = if alpha == 1.0 { s } else { s * alpha };
                let want = if beta == 0.0 {
                    t
                } else {
                    c0[i * ldc + j] * beta + t
                };
                let got = c[i * ldc + j];
                assert_eq!(got.to_bits(), want.to_bits(), "{m}x{k}x{n} ({i}, {j})");
            }
            for j in n..ldc {
                assert_eq!(
                    c[i * ldc + j].to_bits(),
                    c0[i * ldc + j].to_bits(),
                    "gap written"
                );
            }
        }
    }

    #[test]
    fn every_element_is_the_model_order_for_each_row_count() {
        for m in 1..=MAX_ROWS {
            check(m, 1024, 37, 1024, 1.0, 0.0);
        }
    }

    #[test]
    fn k_not_a_multiple_of_16_pads_the_last_group_with_zeros() {
        for k in [1, 5, 8, 9, 15, 16, 17, 23, 24, 31, 100] {
            check(1, k, 9, k, 1.0, 0.0);
            check(3, k, 5, k, 1.0, 0.0);
        }
    }

    #[test]
    fn alpha_and_beta_scale_as_documented() {
        check(1, 64, 10, 64, 0.5, 0.0);
        check(2, 64, 10, 64, 1.0, 1.0);
        check(4, 40, 10, 40, 0.5, 0.25);
    }

    #[test]
    fn gapped_weight_rows_are_read_in_place() {
        check(1, 48, 7, 64, 1.0, 0.0);
        check(4, 48, 7, 53, 1.0, 0.0);
    }

    #[test]
    fn beta_zero_ignores_what_c_held() {
        if !super::super::small_gemm::has_fma_avx2() {
            return;
        }
        let (x, w) = (values(16, 4), values(16 * 3, 5));
        let mut c = vec![f32::NAN; 3];
        unsafe {
            sgemm(
                (1, 16, 3),
                1.0,
                (x.as_ptr(), 16, 1),
                (w.as_ptr(), 1, 16),
                0.0,
                (c.as_mut_ptr(), 3, 1),
            );
        }
        assert!(c.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn the_sums_are_close_to_exact_ones() {
        let (k, n) = (3000, 4);
        let x = values(k, 6);
        let w = values(n * k, 7);
        for j in 0..n {
            let exact: f64 = (0..k).map(|p| x[p] as f64 * w[j * k + p] as f64).sum();
            let abs: f64 = (0..k)
                .map(|p| (x[p] as f64 * w[j * k + p] as f64).abs())
                .sum();
            let got = dot_model(&x, &w[j * k..][..k]) as f64;
            assert!((got - exact).abs() <= 1e-6 * abs, "{got} vs {exact}");
        }
    }
}
