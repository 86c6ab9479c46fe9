//! Transcendentals over a whole scratch row, 8 lanes at a time with AVX2 and FMA.
//!
//! Cranelift's x86 backend emits 128-bit vectors only, so an inline `exp` costs ~30
//! instructions per 4 floats; these routines run the very same sequence of IEEE operations
//! (`vmath`'s polynomials, constants, clamps and blends, in the same order) on 256-bit vectors,
//! so they cost half as many instructions per element and give the same bits as the inline
//! code. A loop that needs one of these values stores its operand to a scratch row, calls the
//! routine on the row, and reads the results back (see `stash`).
//!
//! Used only where the host has AVX2 and FMA ([`available`]); elsewhere the inline code runs.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use deferfuse_fusion::ir::UnaryOp;

/// True when the host can run these routines.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The helper symbol that applies `op` to a row in place, if there is one.
pub fn symbol(op: UnaryOp) -> Option<&'static str> {
    match op {
        UnaryOp::Exp => Some("df_block_exp_f32"),
        UnaryOp::Tanh => Some("df_block_tanh_f32"),
        _ => None,
    }
}

/// The routines by symbol name, for the JIT's symbol table.
pub fn symbols() -> Vec<(&'static str, *const u8)> {
    vec![
        ("df_block_exp_f32", df_block_exp_f32 as *const u8),
        ("df_block_tanh_f32", df_block_tanh_f32 as *const u8),
    ]
}

/// Defines `pub unsafe extern "C" fn $name(row: *mut f32, n: i64) -> i64`, which applies the
/// 8-lane `$f` to the row in place 8 floats at a time; the last partial group goes through a
/// padded copy, so every element sees the same instructions. The loop is generated per routine
/// (not a closure) so that it is compiled with AVX2 and `$f` inlines into it.
macro_rules! row_routine {
    ($(#[$doc:meta])* $name:ident, $inner:ident, $f:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `row` points to `n` writable f32s and the host has AVX2 and FMA ([`available`]).
        pub unsafe extern "C" fn $name(row: *mut f32, n: i64) -> i64 {
            #[cfg(target_arch = "x86_64")]
            $inner(row, n.max(0) as usize);
            0
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $inner(row: *mut f32, n: usize) {
            let mut i = 0;
            while i + 8 <= n {
                let p = row.add(i);
                _mm256_storeu_ps(p, $f(_mm256_loadu_ps(p)));
                i += 8;
            }
            if i < n {
                let mut tail = [0f32; 8];
                std::ptr::copy_nonoverlapping(row.add(i), tail.as_mut_ptr(), n - i);
                let y = $f(_mm256_loadu_ps(tail.as_ptr()));
                _mm256_storeu_ps(tail.as_mut_ptr(), y);
                std::ptr::copy_nonoverlapping(tail.as_ptr(), row.add(i), n - i);
            }
        }
    };
}

row_routine!(
    /// `row[..n] = exp(row[..n])`. Returns 0 (a Cranelift call binds one result).
    df_block_exp_f32,
    exp_row,
    exp8
);
row_routine!(
    /// `row[..n] = tanh(row[..n])`. Returns 0.
    df_block_tanh_f32,
    tanh_row,
    tanh8
);

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn splat(c: f32) -> __m256 {
    _mm256_set1_ps(c)
}

/// `vmath`'s `horner`: acc = c0, then acc = acc * x + c_k, fused.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn horner(x: __m256, coeffs: &[f32]) -> __m256 {
    let mut acc = splat(coeffs[0]);
    for &c in &coeffs[1..] {
        acc = _mm256_fmadd_ps(acc, x, splat(c));
    }
    acc
}

/// `vmath::exp`, step for step (`minps`/`maxps` operand order included).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    let hi = splat(88.722_83);
    let lo = splat(-87.336_54);
    let xc = _mm256_min_ps(hi, x);
    let xc = _mm256_max_ps(lo, xc);
    let t = _mm256_fmadd_ps(xc, splat(std::f32::consts::LOG2_E), splat(0.5));
    let n = _mm256_floor_ps(t);
    let r = _mm256_fmadd_ps(n, splat(-0.693_359_4), xc);
    let r = _mm256_fmadd_ps(n, splat(2.121_944_4e-4), r);
    let p = horner(
        r,
        &[
            1.987_569_1e-4,
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ],
    );
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_fmadd_ps(p, r2, r);
    let y = _mm256_add_ps(y, splat(1.0));
    let biased = _mm256_add_ps(n, splat(12_582_912.0));
    let e = _mm256_slli_epi32(_mm256_castps_si256(biased), 23);
    let y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
    let over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    let y = _mm256_blendv_ps(y, splat(f32::INFINITY), over);
    let under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    _mm256_blendv_ps(y, splat(0.0), under)
}

/// `vmath::tanh`, step for step.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tanh8(x: __m256) -> __m256 {
    let xc = _mm256_min_ps(splat(9.0), x);
    let xc = _mm256_max_ps(splat(-9.0), xc);
    let x2 = _mm256_mul_ps(xc, xc);
    let p = horner(
        x2,
        &[
            -2.760_768_5e-16,
            2.000_188e-13,
            -8.604_672e-11,
            5.122_297e-8,
            1.485_722_4e-5,
            6.372_619_3e-4,
            4.893_524_6e-3,
        ],
    );
    let p = _mm256_mul_ps(xc, p);
    let q = horner(
        x2,
        &[1.198_258_4e-6, 1.185_347_1e-4, 2.268_434_6e-3, 4.893_525e-3],
    );
    let r = _mm256_div_ps(p, q);
    let r = _mm256_min_ps(splat(1.0), r);
    let r = _mm256_max_ps(splat(-1.0), r);
    let ax = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
    let is_tiny = _mm256_cmp_ps(ax, splat(4e-4), _CMP_LT_OQ);
    _mm256_blendv_ps(r, x, is_tiny)
}
