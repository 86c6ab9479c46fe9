//! bf16 products of at most four rows in all by a transposed B (`x @ W.t()`: a Linear applied
//! to one token at a time, as generation does under autocast or in a model cast to bf16) on
//! AVX512-BF16 cores. Each output is the dot product of a row of A with a row of W, both
//! contiguous, so `vdpbf16ps` reads them in place: W once per call, no packing. Widened to f32
//! (the path such products took), every call converted all of W first: a `[1, 768] @ [768,
//! 3072]` product took 634 us against CPU eager's 85.
//!
//! Numbers: each output keeps one 16-lane f32 sum; lane `l` adds, for each 32-element chunk of
//! k in order, the products of elements `2l + 1` and then `2l` of the chunk (the instruction's
//! order, each addition rounded, subnormals as zero; the last chunk padded with zeros), and
//! the lanes are then added in a fixed tree ([`lane_sum`]). The order depends on k alone, and
//! a product of at most four rows in all always comes here (`half_gemm` chooses by the whole
//! product's rows), so a column block of it has the whole product's bits.

use super::half_gemm::{bf16_to_f32, f32_to_bf16, HalfMat};
use std::arch::x86_64::*;

/// Rows of A one call takes at most.
pub(super) const MAX_ROWS: usize = 4;

/// Outputs (columns of B) computed side by side: their sums are independent, which hides the
/// instruction's latency that one chain of sums would wait on.
const COLS: usize = 4;

/// Whether this core runs the kernel (it also uses AVX512-BW's masked 16-bit loads).
pub(super) fn available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| super::bf16_gemm::available() && is_x86_feature_detected!("avx512bw"))
}

/// Whether a product of `whole_rows` rows in all with these operand layouts comes here: A's
/// rows and B's columns (W's rows) contiguous. Every block of the product (a column block of
/// B, a row block of A) has the same layouts, so all of them take the same path.
pub(super) fn takes(whole_rows: usize, a: &HalfMat, b: &HalfMat) -> bool {
    whole_rows <= MAX_ROWS && (a.cs == 1 || a.cols <= 1) && b.rs == 1 && available()
}

/// `c = alpha * a @ b + beta * c` for bf16 `a` `[m, k]` (m <= [`MAX_ROWS`], rows contiguous),
/// `b` `[k, n]` (columns contiguous), `c` `[m, n]`.
///
/// # Safety
/// [`takes`]; the pointers are valid for every element their strides address; `c` overlaps
/// neither operand.
pub(super) unsafe fn matmul(alpha: f32, a: HalfMat, b: HalfMat, beta: f32, c: HalfMat) {
    debug_assert!(a.rows <= MAX_ROWS && b.rs == 1);
    let mut j = 0;
    while j < b.cols {
        let cols = COLS.min(b.cols - j);
        let mut sums = [[0f32; COLS]; MAX_ROWS];
        if cols == COLS {
            dots::<COLS>(&a, &b, j, &mut sums);
        } else {
            for q in 0..cols {
                let mut one = [[0f32; 1]; MAX_ROWS];
                dots::<1>(&a, &b, j + q, &mut one);
                for (row, s) in sums.iter_mut().zip(&one) {
                    row[q] = s[0];
                }
            }
        }
        for (i, row) in sums.iter().enumerate().take(a.rows) {
            for (q, &s) in row.iter().enumerate().take(cols) {
                let out = c.ptr.offset(i as isize * c.rs + (j + q) as isize * c.cs);
                let t = alpha * s;
                let v = if beta == 0.0 {
                    t
                } else {
                    bf16_to_f32(*out).mul_add(beta, t)
                };
                *out = f32_to_bf16(v);
            }
        }
        j += cols;
    }
}

/// The dot products of A's rows with B's columns `j0..j0 + J`, into `sums[row][column]`.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw")]
unsafe fn dots<const J: usize>(
    a: &HalfMat,
    b: &HalfMat,
    j0: usize,
    sums: &mut [[f32; J]; MAX_ROWS],
) {
    let k = a.cols;
    let (chunks, rest) = (k / 32, k % 32);
    let rows: [*const u16; MAX_ROWS] =
        std::array::from_fn(|r| a.ptr.offset(r.min(a.rows - 1) as isize * a.rs) as *const u16);
    let cols: [*const u16; J] =
        std::array::from_fn(|q| b.ptr.offset((j0 + q) as isize * b.cs) as *const u16);
    let mut acc = [[_mm512_setzero_ps(); J]; MAX_ROWS];
    let step = |acc: &mut [[__m512; J]; MAX_ROWS], load: &dyn Fn(*const u16) -> __m512bh| {
        let w: [__m512bh; J] = std::array::from_fn(|q| load(cols[q]));
        for (r, row) in acc.iter_mut().enumerate().take(a.rows) {
            let x = load(rows[r]);
            for (q, s) in row.iter_mut().enumerate() {
                *s = _mm512_dpbf16_ps(*s, x, w[q]);
            }
        }
    };
    for chunk in 0..chunks {
        step(&mut acc, &|p| {
            std::mem::transmute(_mm512_loadu_si512(p.add(32 * chunk) as *const _))
        });
    }
    if rest > 0 {
        let mask: __mmask32 = (1u32 << rest) - 1;
        step(&mut acc, &|p| {
            std::mem::transmute(_mm512_maskz_loadu_epi16(
                mask,
                p.add(32 * chunks) as *const i16,
            ))
        });
    }
    for (r, row) in acc.iter().enumerate().take(a.rows) {
        for (q, s) in row.iter().enumerate() {
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), *s);
            sums[r][q] = lane_sum(&lanes);
        }
    }
}

/// The 16 lane sums added in a fixed tree: lane `l` with lane `l + 8`, then with `l + 4`, `l +
/// 2`, `l + 1` (each halving step in order).
fn lane_sum(lanes: &[f32; 16]) -> f32 {
    let mut v = *lanes;
    let mut width = 8;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::half_gemm::tests::values;
    use deferfuse_fusion::ir::DType;
    use half::bf16;

    /// An output as the module doc defines it: per lane, chunk by chunk, the odd element's
    /// exact product and then the even one's, each addition rounded, subnormals as zero; then
    /// [`lane_sum`].
    fn reference(x: &[f32], w: &[f32]) -> f32 {
        let flush = |v: f32| {
            if v.is_subnormal() {
                0.0 * v.signum()
            } else {
                v
            }
        };
        let mut lanes = [0f32; 16];
        for chunk in 0..x.len().div_ceil(32) {
            for (l, lane) in lanes.iter_mut().enumerate() {
                for e in [2 * l + 1, 2 * l] {
                    let i = 32 * chunk + e;
                    let (p, q) = if i < x.len() {
                        (x[i], w[i])
                    } else {
                        (0.0, 0.0)
                    };
                    *lane = flush(*lane + flush(p) * flush(q));
                }
            }
        }
        lane_sum(&lanes)
    }

    #[test]
    fn few_row_bf16_products_are_lane_sums_of_pair_dot_products() {
        if !available() {
            eprintln!("no AVX512-BF16/BW on this core: bf16_gemv is not used here");
            return;
        }
        let bits = |n: usize, seed: u32| values(DType::BF16, n, seed, |_| None);
        let f = |h: u16| bf16::from_bits(h).to_f32();
        for (m, k, n) in [(1, 768, 37), (4, 70, 9), (3, 31, 4), (2, 1, 5), (1, 64, 1)] {
            for (alpha, beta) in [(1.0f32, 0.0f32), (0.5, -2.0)] {
                let mut a = bits(m * k, 1);
                // W [n, k] row-major: B = W.t() has contiguous columns.
                let mut w = bits(n * k, 2);
                let mut c = bits(m * n, 3);
                let old = c.clone();
                let va = HalfMat {
                    ptr: a.as_mut_ptr(),
                    rows: m,
                    cols: k,
                    rs: k as isize,
                    cs: 1,
                };
                let vb = HalfMat {
                    ptr: w.as_mut_ptr(),
                    rows: k,
                    cols: n,
                    rs: 1,
                    cs: k as isize,
                };
                let vc = HalfMat {
                    ptr: c.as_mut_ptr(),
                    rows: m,
                    cols: n,
                    rs: n as isize,
                    cs: 1,
                };
                // The f32 sums themselves, before rounding hides their order.
                for j in 0..n {
                    let mut sums = [[0f32; 1]; MAX_ROWS];
                    unsafe { dots::<1>(&va, &vb, j, &mut sums) };
                    for (i, s) in sums.iter().enumerate().take(m) {
                        let x: Vec<f32> = a[i * k..][..k].iter().map(|&h| f(h)).collect();
                        let y: Vec<f32> = w[j * k..][..k].iter().map(|&h| f(h)).collect();
                        let want = reference(&x, &y);
                        assert_eq!(s[0].to_bits(), want.to_bits(), "{m}x{k}x{n} sum [{i},{j}]");
                    }
                }
                unsafe { matmul(alpha, va, vb, beta, vc) };
                for i in 0..m {
                    for j in 0..n {
                        let x: Vec<f32> = a[i * k..][..k].iter().map(|&h| f(h)).collect();
                        let y: Vec<f32> = w[j * k..][..k].iter().map(|&h| f(h)).collect();
                        let t = alpha * reference(&x, &y);
                        let v = if beta == 0.0 {
                            t
                        } else {
                            f(old[i * n + j]).mul_add(beta, t)
                        };
                        let want = bf16::from_f32(v).to_bits();
                        assert_eq!(c[i * n + j], want, "{m}x{k}x{n} [{i},{j}]");
                    }
                }
            }
        }
    }
}
