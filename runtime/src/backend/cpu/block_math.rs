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
//! Each routine also has a 16-lane AVX-512 form (`block_math/avx512.rs`), used where the host
//! has AVX-512F: the same operations again, on half as many instructions (one thread: softmax
//! 3.76 -> 3.27 ms, gelu 1M 0.99 -> 0.56 ms).

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
use avx512::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::vmath::{ERF_MID, ERF_SMALL, EXP_POLY, LOG_POLY, TANH_P, TANH_Q};
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

/// Most lanes the routines may use: 16 (AVX-512 where there is one) unless a test lowered it.
static MAX_LANES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(16);

/// Limits the routines to `lanes` (8 or 16) lanes, so that tests on an AVX-512 host can check
/// the 8-lane forms too: every form gives the same bits.
pub fn limit_lanes(lanes: usize) {
    MAX_LANES.store(lanes, std::sync::atomic::Ordering::Relaxed);
}

/// True when the 16-lane forms may run here.
#[cfg(target_arch = "x86_64")]
fn wide() -> bool {
    MAX_LANES.load(std::sync::atomic::Ordering::Relaxed) >= 16
        && std::arch::is_x86_feature_detected!("avx512f")
}

/// The helper symbol that applies `op` to a row in place, if there is one.
pub fn symbol(op: UnaryOp) -> Option<&'static str> {
    match op {
        UnaryOp::Exp => Some("df_block_exp_f32"),
        UnaryOp::Tanh => Some("df_block_tanh_f32"),
        UnaryOp::Log => Some("df_block_log_f32"),
        UnaryOp::Erf => Some("df_block_erf_f32"),
        UnaryOp::Sigmoid => Some("df_block_sigmoid_f32"),
        UnaryOp::Silu => Some("df_block_silu_f32"),
        UnaryOp::GeluTanh => Some("df_block_gelu_tanh_f32"),
        UnaryOp::GeluErf => Some("df_block_gelu_erf_f32"),
        UnaryOp::Log1p => Some("df_block_log1p_f32"),
        UnaryOp::Expm1 => Some("df_block_expm1_f32"),
        UnaryOp::Sin => Some("df_block_sin_f32"),
        UnaryOp::Cos => Some("df_block_cos_f32"),
        UnaryOp::Tan => Some("df_block_tan_f32"),
        UnaryOp::Atan => Some("df_block_atan_f32"),
        UnaryOp::Asin => Some("df_block_asin_f32"),
        UnaryOp::Acos => Some("df_block_acos_f32"),
        UnaryOp::Log2 => Some("df_block_log2_f32"),
        UnaryOp::Log10 => Some("df_block_log10_f32"),
        UnaryOp::Atanh => Some("df_block_atanh_f32"),
        _ => None,
    }
}

/// The routines by symbol name, for the JIT's symbol table.
pub fn symbols() -> Vec<(&'static str, *const u8)> {
    vec![
        ("df_block_exp_f32", df_block_exp_f32 as *const u8),
        ("df_block_tanh_f32", df_block_tanh_f32 as *const u8),
        ("df_block_log_f32", df_block_log_f32 as *const u8),
        ("df_block_erf_f32", df_block_erf_f32 as *const u8),
        ("df_block_sigmoid_f32", df_block_sigmoid_f32 as *const u8),
        ("df_block_silu_f32", df_block_silu_f32 as *const u8),
        (
            "df_block_gelu_tanh_f32",
            df_block_gelu_tanh_f32 as *const u8,
        ),
        ("df_block_gelu_erf_f32", df_block_gelu_erf_f32 as *const u8),
        ("df_block_log1p_f32", df_block_log1p_f32 as *const u8),
        ("df_block_expm1_f32", df_block_expm1_f32 as *const u8),
        ("df_block_sin_f32", df_block_sin_f32 as *const u8),
        ("df_block_cos_f32", df_block_cos_f32 as *const u8),
        ("df_block_tan_f32", df_block_tan_f32 as *const u8),
        ("df_block_atan_f32", df_block_atan_f32 as *const u8),
        ("df_block_asin_f32", df_block_asin_f32 as *const u8),
        ("df_block_acos_f32", df_block_acos_f32 as *const u8),
        ("df_block_log2_f32", df_block_log2_f32 as *const u8),
        ("df_block_log10_f32", df_block_log10_f32 as *const u8),
        ("df_block_atanh_f32", df_block_atanh_f32 as *const u8),
    ]
}

/// Defines `pub unsafe extern "C" fn $name(row: *mut f32, n: i64) -> i64`, which applies the
/// 8-lane `$f` to the row in place 8 floats at a time (or the 16-lane `$wide_f`, if given, on
/// AVX-512 hosts); the last partial group goes through a padded copy, so every element sees
/// the same instructions. The loops are generated per routine (not closures) so that they are
/// compiled with the right target features and `$f` inlines into them.
macro_rules! row_routine {
    ($(#[$doc:meta])* $name:ident, $inner:ident, $f:ident $(, $wide_inner:ident, $wide_f:ident)?) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `row` points to `n` writable f32s and the host has AVX2 and FMA ([`available`]).
        pub unsafe extern "C" fn $name(row: *mut f32, n: i64) -> i64 {
            #[cfg(target_arch = "x86_64")]
            {
                $(
                    if wide() {
                        $wide_inner(row, n.max(0) as usize);
                        return 0;
                    }
                )?
                $inner(row, n.max(0) as usize);
            }
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

        $(
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn $wide_inner(row: *mut f32, n: usize) {
                let mut i = 0;
                while i + 16 <= n {
                    let p = row.add(i);
                    _mm512_storeu_ps(p, $wide_f(_mm512_loadu_ps(p)));
                    i += 16;
                }
                if i < n {
                    let mut tail = [0f32; 16];
                    std::ptr::copy_nonoverlapping(row.add(i), tail.as_mut_ptr(), n - i);
                    let y = $wide_f(_mm512_loadu_ps(tail.as_ptr()));
                    _mm512_storeu_ps(tail.as_mut_ptr(), y);
                    std::ptr::copy_nonoverlapping(tail.as_ptr(), row.add(i), n - i);
                }
            }
        )?
    };
}

#[cfg(target_arch = "x86_64")]
mod less_common;
#[cfg(target_arch = "x86_64")]
use less_common::*;

row_routine!(
    /// `row[..n] = exp(row[..n])`. Returns 0 (a Cranelift call binds one result).
    df_block_exp_f32,
    exp_row,
    exp8,
    exp_row16,
    exp16
);
row_routine!(
    /// `row[..n] = tanh(row[..n])`. Returns 0.
    df_block_tanh_f32,
    tanh_row,
    tanh8,
    tanh_row16,
    tanh16
);
row_routine!(
    /// `row[..n] = ln(row[..n])`. Returns 0.
    df_block_log_f32,
    log_row,
    log8,
    log_row16,
    log16
);
row_routine!(
    /// `row[..n] = erf(row[..n])`. Returns 0.
    df_block_erf_f32,
    erf_row,
    erf8,
    erf_row16,
    erf16
);
row_routine!(
    /// `row[..n] = sigmoid(row[..n])`. Returns 0.
    df_block_sigmoid_f32,
    sigmoid_row,
    sigmoid8,
    sigmoid_row16,
    sigmoid16
);
row_routine!(
    /// `row[..n] = silu(row[..n])` (x * sigmoid(x)). Returns 0.
    df_block_silu_f32,
    silu_row,
    silu8,
    silu_row16,
    silu16
);
row_routine!(
    /// `row[..n] = gelu(row[..n])`, tanh approximation. Returns 0.
    df_block_gelu_tanh_f32,
    gelu_tanh_row,
    gelu_tanh8,
    gelu_tanh_row16,
    gelu_tanh16
);
row_routine!(
    /// `row[..n] = ln(1 + row[..n])`. Returns 0.
    df_block_log1p_f32,
    log1p_row,
    log1p8,
    log1p_row16,
    log1p16
);
row_routine!(
    /// `row[..n] = e^row[..n] - 1`. Returns 0.
    df_block_expm1_f32,
    expm1_row,
    expm1_8,
    expm1_row16,
    expm1_16
);
row_routine!(
    /// `row[..n] = sin(row[..n])` (`trig::sin_cos`'s algorithm). Returns 0.
    df_block_sin_f32,
    sin_row,
    sin8,
    sin_row16,
    sin16
);
row_routine!(
    /// `row[..n] = cos(row[..n])` (`trig::sin_cos`'s algorithm). Returns 0.
    df_block_cos_f32,
    cos_row,
    cos8,
    cos_row16,
    cos16
);
row_routine!(
    /// `row[..n] = gelu(row[..n])`, erf form. Returns 0.
    df_block_gelu_erf_f32,
    gelu_erf_row,
    gelu_erf8,
    gelu_erf_row16,
    gelu_erf16
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
    let p = horner(r, &EXP_POLY);
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
    let p = horner(x2, &TANH_P);
    let p = _mm256_mul_ps(xc, p);
    let q = horner(x2, &TANH_Q);
    let r = _mm256_div_ps(p, q);
    let r = _mm256_min_ps(splat(1.0), r);
    let r = _mm256_max_ps(splat(-1.0), r);
    let ax = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
    let is_tiny = _mm256_cmp_ps(ax, splat(4e-4), _CMP_LT_OQ);
    _mm256_blendv_ps(r, x, is_tiny)
}

/// `mask ? a : b` (`vmath`'s `select`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn select(mask: __m256, a: __m256, b: __m256) -> __m256 {
    _mm256_blendv_ps(b, a, mask)
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn splat_bits(bits: u32) -> __m256i {
    _mm256_set1_epi32(bits as i32)
}

/// `vmath::log`, step for step.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn log8(x: __m256) -> __m256 {
    let (e, xr, z, y) = log_parts8(x);
    let y = _mm256_fmadd_ps(e, splat(-2.121_944_4e-4), y);
    let y = _mm256_fmadd_ps(z, splat(-0.5), y);
    let r = _mm256_add_ps(xr, y);
    let r = _mm256_fmadd_ps(e, splat(0.693_359_4), r);
    log_special8(x, r)
}

/// `vmath::log_parts`, step for step: (e, xr, z, y) with x = 2^e (1 + xr), z = xr^2 and
/// y = xr^3 P(xr).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn log_parts8(x: __m256) -> (__m256, __m256, __m256, __m256) {
    let small = _mm256_cmp_ps(x, splat(f32::MIN_POSITIVE), _CMP_LT_OQ);
    let xs = _mm256_mul_ps(x, splat(8_388_608.0));
    let xv = select(small, xs, x);
    let adj = select(small, splat(23.0), splat(0.0));
    let bits = _mm256_castps_si256(xv);
    let e = _mm256_cvtepi32_ps(_mm256_srli_epi32(bits, 23));
    let e = _mm256_sub_ps(e, splat(126.0));
    let e = _mm256_sub_ps(e, adj);
    let m = _mm256_and_si256(bits, splat_bits(0x807f_ffff));
    let m = _mm256_castsi256_ps(_mm256_or_si256(m, splat_bits(0x3f00_0000)));
    let lt = _mm256_cmp_ps(m, splat(std::f32::consts::FRAC_1_SQRT_2), _CMP_LT_OQ);
    let e = select(lt, _mm256_sub_ps(e, splat(1.0)), e);
    let mm = select(lt, _mm256_add_ps(m, m), m);
    let xr = _mm256_sub_ps(mm, splat(1.0));
    let z = _mm256_mul_ps(xr, xr);
    let p = horner(xr, &LOG_POLY);
    let y = _mm256_mul_ps(p, xr);
    let y = _mm256_mul_ps(y, z);
    (e, xr, z, y)
}

/// `vmath::log_special_values`: -inf at 0, NaN below 0, +inf at +inf, x at NaN.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn log_special8(x: __m256, r: __m256) -> __m256 {
    let zero = splat(0.0);
    let r = select(
        _mm256_cmp_ps(x, zero, _CMP_EQ_OQ),
        splat(f32::NEG_INFINITY),
        r,
    );
    let r = select(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), splat(f32::NAN), r);
    let inf = splat(f32::INFINITY);
    let r = select(_mm256_cmp_ps(x, inf, _CMP_EQ_OQ), inf, r);
    select(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), x, r)
}

/// `vmath::erf`, step for step, except that a group whose lanes are all below 1 in magnitude
/// skips the second polynomial, which `vmath::erf` computes and then discards there: the same
/// bits, about a third of the time (GELU inputs of a model at initialization are all in range;
/// on N(0, 1) inputs a quarter of the groups are). A NaN lane is not below 1, so it always
/// takes the whole path.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn erf8(x: __m256) -> __m256 {
    let ax = _mm256_and_ps(x, _mm256_castsi256_ps(splat_bits(0x7fff_ffff)));
    let z = _mm256_mul_ps(x, x);
    let p = horner(z, &ERF_SMALL);
    let small = _mm256_mul_ps(p, x);
    let one = splat(1.0);
    let is_small = _mm256_cmp_ps(ax, one, _CMP_LT_OQ);
    if _mm256_movemask_ps(is_small) == 0xff {
        return small;
    }
    let t = _mm256_sub_ps(ax, splat(2.5));
    let m = horner(t, &ERF_MID);
    let big = _mm256_min_ps(one, m);
    let sat = _mm256_cmp_ps(ax, splat(4.0), _CMP_GE_OQ);
    let big = select(sat, one, big);
    let sign = _mm256_and_ps(x, splat(-0.0));
    let big = _mm256_or_ps(big, sign);
    let r = select(is_small, small, big);
    select(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), x, r)
}

/// `vmath::sigmoid`: 1 / (1 + e^-x).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sigmoid8(x: __m256) -> __m256 {
    let nx = _mm256_xor_ps(x, splat(-0.0));
    let e = exp8(nx);
    let one = splat(1.0);
    _mm256_div_ps(one, _mm256_add_ps(one, e))
}

/// `lanes`' silu: x * sigmoid(x).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu8(x: __m256) -> __m256 {
    _mm256_mul_ps(x, sigmoid8(x))
}

/// `lanes`' gelu tail: 0.5 * x * (1 + t).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_tail(x: __m256, t: __m256) -> __m256 {
    let s = _mm256_add_ps(splat(1.0), t);
    let hx = _mm256_mul_ps(splat(0.5), x);
    _mm256_mul_ps(hx, s)
}

/// `lanes`' tanh-approximated gelu, step for step.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_tanh8(x: __m256) -> __m256 {
    let x3 = _mm256_mul_ps(x, x);
    let x3 = _mm256_mul_ps(x3, x);
    let inner = _mm256_mul_ps(x3, splat(0.044_715_f64 as f32));
    let inner = _mm256_add_ps(x, inner);
    let inner = _mm256_mul_ps(inner, splat(0.797_884_560_802_865_4_f64 as f32));
    gelu_tail(x, tanh8(inner))
}

/// `lanes`' erf gelu, step for step.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_erf8(x: __m256) -> __m256 {
    let t = _mm256_mul_ps(x, splat(std::f64::consts::FRAC_1_SQRT_2 as f32));
    gelu_tail(x, erf8(t))
}

/// `vmath::log1p`, step for step: log of the rounded u = 1 + x times x / (u - 1) (log's NaN
/// where that is NaN); x where u rounds to 1, +inf where u is +inf.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn log1p8(x: __m256) -> __m256 {
    let one = splat(1.0);
    let u = _mm256_add_ps(x, one);
    let l = log8(u);
    let k = _mm256_div_ps(x, _mm256_sub_ps(u, one));
    let r = _mm256_mul_ps(l, k);
    let r = select(_mm256_cmp_ps(l, l, _CMP_UNORD_Q), l, r);
    let r = select(_mm256_cmp_ps(u, one, _CMP_EQ_OQ), x, r);
    let inf = splat(f32::INFINITY);
    select(_mm256_cmp_ps(u, inf, _CMP_EQ_OQ), inf, r)
}

/// `vmath::expm1`, step for step: (u - 1) x / ln u for the rounded u = e^x; x where u rounds
/// to 1, -1 where u - 1 is -1, +inf where u is +inf.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn expm1_8(x: __m256) -> __m256 {
    let one = splat(1.0);
    let u = exp8(x);
    let um1 = _mm256_sub_ps(u, one);
    let k = _mm256_div_ps(x, log8(u));
    let r = _mm256_mul_ps(um1, k);
    let r = select(_mm256_cmp_ps(u, one, _CMP_EQ_OQ), x, r);
    let minus_one = splat(-1.0);
    let r = select(_mm256_cmp_ps(um1, minus_one, _CMP_EQ_OQ), minus_one, r);
    let inf = splat(f32::INFINITY);
    select(_mm256_cmp_ps(u, inf, _CMP_EQ_OQ), inf, r)
}

/// `trig::sin_cos` on 8 lanes, step for step; lanes outside its polynomial's range (or NaN)
/// take the scalar function itself.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sin_cos8(x: __m256, cos: bool) -> __m256 {
    use super::trig::{COS_POLY, SIN_POLY};
    let (j, r) = reduce8(x);
    let q = _mm256_add_epi32(_mm256_cvtps_epi32(j), _mm256_set1_epi32(cos as i32));
    let z = _mm256_mul_ps(r, r);
    let ps = horner(z, &SIN_POLY);
    let sin = _mm256_fmadd_ps(_mm256_mul_ps(r, z), ps, r);
    let sin = select(_mm256_cmp_ps(r, splat(0.0), _CMP_EQ_OQ), r, sin);
    let pc = horner(z, &COS_POLY);
    let c0 = _mm256_fmadd_ps(z, splat(-0.5), splat(1.0));
    let cos_v = _mm256_fmadd_ps(_mm256_mul_ps(z, z), pc, c0);
    let one = _mm256_set1_epi32(1);
    let odd = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(q, one), one));
    let v = select(odd, cos_v, sin);
    let sign = _mm256_slli_epi32(_mm256_and_si256(q, _mm256_set1_epi32(2)), 30);
    let y = _mm256_xor_ps(v, _mm256_castsi256_ps(sign));
    beyond_poly_max8(x, y, |v| super::trig::sin_cos(v, cos))
}

/// `trig::reduce` on 8 lanes: (j, r) with x = j pi/2 + r.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce8(x: __m256) -> (__m256, __m256) {
    use super::trig::{PIO2, TWO_OVER_PI};
    let j = _mm256_round_ps(
        _mm256_mul_ps(x, splat(TWO_OVER_PI)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_fnmadd_ps(j, splat(PIO2[0]), x);
    let r = _mm256_fnmadd_ps(j, splat(PIO2[1]), r);
    let r = _mm256_fnmadd_ps(j, splat(PIO2[2]), r);
    (j, select(_mm256_cmp_ps(j, splat(0.0), _CMP_EQ_OQ), x, r))
}

/// `y`, except that lanes where |x| exceeds `trig::POLY_MAX` (or x is NaN) take `scalar(x)`:
/// the trigonometric routines' libm fallback, lane by lane, rare enough to leave scalar.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn beyond_poly_max8(x: __m256, y: __m256, scalar: impl Fn(f32) -> f32) -> __m256 {
    let ax = _mm256_andnot_ps(splat(-0.0), x);
    let far = _mm256_movemask_ps(_mm256_cmp_ps(ax, splat(super::trig::POLY_MAX), _CMP_NLE_UQ));
    if far == 0 {
        return y;
    }
    let (mut xs, mut ys) = ([0f32; 8], [0f32; 8]);
    _mm256_storeu_ps(xs.as_mut_ptr(), x);
    _mm256_storeu_ps(ys.as_mut_ptr(), y);
    for l in (0..8).filter(|l| far & (1 << l) != 0) {
        ys[l] = scalar(xs[l]);
    }
    _mm256_loadu_ps(ys.as_ptr())
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sin8(x: __m256) -> __m256 {
    sin_cos8(x, false)
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn cos8(x: __m256) -> __m256 {
    sin_cos8(x, true)
}
