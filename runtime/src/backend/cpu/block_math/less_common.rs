//! Row routines for the f32 functions models use less often (tan, atan, asin, acos, log2,
//! log10, atanh), at 8 and 16 lanes. Each runs the very operations of its inline form, in the
//! same order: `trig::tan` and `arc_trig`'s scalar functions (which the inline code calls per
//! lane) and `vmath`'s log2, log10 and atanh, so every form gives the same bits. Lanes a
//! scalar function sends to libm (tan beyond `POLY_MAX`, NaN) take that function itself.

use super::super::arc_trig::{ASIN_POLY, ATAN_POLY, TAN_3PI_8, TAN_PI_8};
use super::super::trig::TAN_POLY;
use super::super::vmath::LOG10_2;
use super::avx512::{
    and_bits, beyond_poly_max16, horner16, log1p16, log_parts16, log_special16, reduce16,
    select as select16, splat as splat16,
};
use super::{
    beyond_poly_max8, horner, log1p8, log_parts8, log_special8, reduce8, select, splat, wide,
};
use std::arch::x86_64::*;
use std::f32::consts::{FRAC_PI_2, FRAC_PI_4, LOG10_E, LOG2_E, PI};

row_routine!(
    /// `row[..n] = tan(row[..n])` (`trig::tan`'s algorithm). Returns 0.
    df_block_tan_f32,
    tan_row,
    tan8,
    tan_row16,
    tan16
);
row_routine!(
    /// `row[..n] = atan(row[..n])` (`arc_trig::atan`'s algorithm). Returns 0.
    df_block_atan_f32,
    atan_row,
    atan8,
    atan_row16,
    atan16
);
row_routine!(
    /// `row[..n] = asin(row[..n])` (`arc_trig::asin`'s algorithm). Returns 0.
    df_block_asin_f32,
    asin_row,
    asin8,
    asin_row16,
    asin16
);
row_routine!(
    /// `row[..n] = acos(row[..n])` (`arc_trig::acos`'s algorithm). Returns 0.
    df_block_acos_f32,
    acos_row,
    acos8,
    acos_row16,
    acos16
);
row_routine!(
    /// `row[..n] = log2(row[..n])` (`vmath::log2`). Returns 0.
    df_block_log2_f32,
    log2_row,
    log2_8,
    log2_row16,
    log2_16
);
row_routine!(
    /// `row[..n] = log10(row[..n])` (`vmath::log10`). Returns 0.
    df_block_log10_f32,
    log10_row,
    log10_8,
    log10_row16,
    log10_16
);
row_routine!(
    /// `row[..n] = atanh(row[..n])` (`vmath::atanh`). Returns 0.
    df_block_atanh_f32,
    atanh_row,
    atanh8,
    atanh_row16,
    atanh16
);

/// `|r|` with the sign bit of `s`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn with_sign_of8(r: __m256, s: __m256) -> __m256 {
    let sign = splat(-0.0);
    _mm256_or_ps(_mm256_andnot_ps(sign, r), _mm256_and_ps(s, sign))
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn with_sign_of16(r: __m512, s: __m512) -> __m512 {
    let r = _mm512_castps_si512(and_bits(r, 0x7fff_ffff));
    let s = _mm512_castps_si512(and_bits(s, 0x8000_0000));
    _mm512_castsi512_ps(_mm512_or_si512(r, s))
}

/// `trig::tan`, step for step.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tan8(x: __m256) -> __m256 {
    let (j, r) = reduce8(x);
    let z = _mm256_mul_ps(r, r);
    let p = horner(z, &TAN_POLY);
    let t = _mm256_fmadd_ps(_mm256_mul_ps(r, z), p, r);
    let inv = _mm256_div_ps(splat(-1.0), t);
    let one = _mm256_set1_epi32(1);
    let q = _mm256_cvtps_epi32(j);
    let odd = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(q, one), one));
    beyond_poly_max8(x, select(odd, inv, t), super::super::trig::tan)
}

/// `tan8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn tan16(x: __m512) -> __m512 {
    let (j, r) = reduce16(x);
    let z = _mm512_mul_ps(r, r);
    let p = horner16(z, &TAN_POLY);
    let t = _mm512_fmadd_ps(_mm512_mul_ps(r, z), p, r);
    let inv = _mm512_div_ps(splat16(-1.0), t);
    let one = _mm512_set1_epi32(1);
    let q = _mm512_cvtps_epi32(j);
    let odd = _mm512_cmpeq_epi32_mask(_mm512_and_si512(q, one), one);
    beyond_poly_max16(x, select16(odd, inv, t), super::super::trig::tan)
}

/// `arc_trig::atan`, step for step.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn atan8(x: __m256) -> __m256 {
    let a = _mm256_andnot_ps(splat(-0.0), x);
    let big = _mm256_cmp_ps(a, splat(TAN_3PI_8), _CMP_GT_OQ);
    let mid = _mm256_cmp_ps(a, splat(TAN_PI_8), _CMP_GT_OQ);
    let one = splat(1.0);
    let num = select(big, splat(-1.0), select(mid, _mm256_sub_ps(a, one), a));
    let den = select(big, a, select(mid, _mm256_add_ps(a, one), one));
    let base = select(
        big,
        splat(FRAC_PI_2),
        select(mid, splat(FRAC_PI_4), splat(0.0)),
    );
    let t = _mm256_div_ps(num, den);
    let z = _mm256_mul_ps(t, t);
    let p = horner(z, &ATAN_POLY);
    let r = _mm256_fmadd_ps(_mm256_mul_ps(p, z), t, t);
    with_sign_of8(_mm256_add_ps(base, r), x)
}

/// `atan8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn atan16(x: __m512) -> __m512 {
    let a = and_bits(x, 0x7fff_ffff);
    let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, splat16(TAN_3PI_8));
    let mid = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, splat16(TAN_PI_8));
    let one = splat16(1.0);
    let num = select16(big, splat16(-1.0), select16(mid, _mm512_sub_ps(a, one), a));
    let den = select16(big, a, select16(mid, _mm512_add_ps(a, one), one));
    let base = select16(
        big,
        splat16(FRAC_PI_2),
        select16(mid, splat16(FRAC_PI_4), splat16(0.0)),
    );
    let t = _mm512_div_ps(num, den);
    let z = _mm512_mul_ps(t, t);
    let p = horner16(z, &ATAN_POLY);
    let r = _mm512_fmadd_ps(_mm512_mul_ps(p, z), t, t);
    with_sign_of16(_mm512_add_ps(base, r), x)
}

/// `arc_trig`'s reduction and polynomial on 8 lanes: (|x| > 0.5, asin's polynomial at t),
/// t being `small` where |x| <= 0.5.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn asin_core8(a: __m256, small: __m256) -> (__m256, __m256) {
    let big = _mm256_cmp_ps(a, splat(0.5), _CMP_GT_OQ);
    let zb = _mm256_mul_ps(splat(0.5), _mm256_sub_ps(splat(1.0), a));
    let z = select(big, zb, _mm256_mul_ps(a, a));
    let t = select(big, _mm256_sqrt_ps(z), small);
    let p = _mm256_fmadd_ps(_mm256_mul_ps(horner(z, &ASIN_POLY), z), t, t);
    (big, p)
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn asin_core16(a: __m512, small: __m512) -> (__mmask16, __m512) {
    let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, splat16(0.5));
    let zb = _mm512_mul_ps(splat16(0.5), _mm512_sub_ps(splat16(1.0), a));
    let z = select16(big, zb, _mm512_mul_ps(a, a));
    let t = select16(big, _mm512_sqrt_ps(z), small);
    let p = _mm512_fmadd_ps(_mm512_mul_ps(horner16(z, &ASIN_POLY), z), t, t);
    (big, p)
}

/// `arc_trig::asin`, step for step.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn asin8(x: __m256) -> __m256 {
    let a = _mm256_andnot_ps(splat(-0.0), x);
    let (big, p) = asin_core8(a, a);
    let r = select(big, _mm256_sub_ps(splat(FRAC_PI_2), _mm256_add_ps(p, p)), p);
    with_sign_of8(r, x)
}

/// `asin8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn asin16(x: __m512) -> __m512 {
    let a = and_bits(x, 0x7fff_ffff);
    let (big, p) = asin_core16(a, a);
    let r = select16(
        big,
        _mm512_sub_ps(splat16(FRAC_PI_2), _mm512_add_ps(p, p)),
        p,
    );
    with_sign_of16(r, x)
}

/// `arc_trig::acos`, step for step.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn acos8(x: __m256) -> __m256 {
    let a = _mm256_andnot_ps(splat(-0.0), x);
    let (big, p) = asin_core8(a, x);
    let q = _mm256_add_ps(p, p);
    let neg = _mm256_cmp_ps(x, splat(0.0), _CMP_LT_OQ);
    let far = select(neg, _mm256_sub_ps(splat(PI), q), q);
    select(big, far, _mm256_sub_ps(splat(FRAC_PI_2), p))
}

/// `acos8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn acos16(x: __m512) -> __m512 {
    let a = and_bits(x, 0x7fff_ffff);
    let (big, p) = asin_core16(a, x);
    let q = _mm512_add_ps(p, p);
    let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, splat16(0.0));
    let far = select16(neg, _mm512_sub_ps(splat16(PI), q), q);
    select16(big, far, _mm512_sub_ps(splat16(FRAC_PI_2), p))
}

/// `vmath::log2`, step for step.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn log2_8(x: __m256) -> __m256 {
    let (e, xr, z, y) = log_parts8(x);
    let ln_m = _mm256_add_ps(xr, _mm256_fmadd_ps(z, splat(-0.5), y));
    log_special8(x, _mm256_fmadd_ps(ln_m, splat(LOG2_E), e))
}

/// `log2_8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn log2_16(x: __m512) -> __m512 {
    let (e, xr, z, y) = log_parts16(x);
    let ln_m = _mm512_add_ps(xr, _mm512_fmadd_ps(z, splat16(-0.5), y));
    log_special16(x, _mm512_fmadd_ps(ln_m, splat16(LOG2_E), e))
}

/// `vmath::log10`, step for step.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn log10_8(x: __m256) -> __m256 {
    let (e, xr, z, y) = log_parts8(x);
    let ln_m = _mm256_add_ps(xr, _mm256_fmadd_ps(z, splat(-0.5), y));
    let t = _mm256_mul_ps(e, splat(LOG10_2[1]));
    let t = _mm256_fmadd_ps(ln_m, splat(LOG10_E), t);
    log_special8(x, _mm256_fmadd_ps(e, splat(LOG10_2[0]), t))
}

/// `log10_8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn log10_16(x: __m512) -> __m512 {
    let (e, xr, z, y) = log_parts16(x);
    let ln_m = _mm512_add_ps(xr, _mm512_fmadd_ps(z, splat16(-0.5), y));
    let t = _mm512_mul_ps(e, splat16(LOG10_2[1]));
    let t = _mm512_fmadd_ps(ln_m, splat16(LOG10_E), t);
    log_special16(x, _mm512_fmadd_ps(e, splat16(LOG10_2[0]), t))
}

/// `vmath::atanh`, step for step.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn atanh8(x: __m256) -> __m256 {
    let a = _mm256_andnot_ps(splat(-0.0), x);
    let v = _mm256_div_ps(_mm256_add_ps(a, a), _mm256_sub_ps(splat(1.0), a));
    let r = _mm256_mul_ps(log1p8(v), splat(0.5));
    with_sign_of8(r, x)
}

/// `atanh8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn atanh16(x: __m512) -> __m512 {
    let a = and_bits(x, 0x7fff_ffff);
    let v = _mm512_div_ps(_mm512_add_ps(a, a), _mm512_sub_ps(splat16(1.0), a));
    let r = _mm512_mul_ps(log1p16(v), splat16(0.5));
    with_sign_of16(r, x)
}
