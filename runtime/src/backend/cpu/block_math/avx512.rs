//! The 16-lane AVX-512F forms of the row routines: `block_math`'s 8-lane functions step for
//! step (same constants, same operand order), with compare masks instead of vector masks for
//! the blends. Only AVX-512F instructions: float and/or/xor go through the integer forms.

use super::super::vmath::{ERF_MID, ERF_SMALL, EXP_POLY, LOG_POLY, TANH_P, TANH_Q};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn splat(c: f32) -> __m512 {
    _mm512_set1_ps(c)
}

/// `mask ? a : b`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn select(mask: __mmask16, a: __m512, b: __m512) -> __m512 {
    _mm512_mask_blend_ps(mask, b, a)
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn and_bits(x: __m512, bits: u32) -> __m512 {
    _mm512_castsi512_ps(_mm512_and_si512(
        _mm512_castps_si512(x),
        _mm512_set1_epi32(bits as i32),
    ))
}

/// `horner` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn horner16(x: __m512, coeffs: &[f32]) -> __m512 {
    let mut acc = splat(coeffs[0]);
    for &c in &coeffs[1..] {
        acc = _mm512_fmadd_ps(acc, x, splat(c));
    }
    acc
}

/// `exp8` on 16 lanes; the blends take compare masks instead of vector masks.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn exp16(x: __m512) -> __m512 {
    let hi = splat(88.722_83);
    let lo = splat(-87.336_54);
    let xc = _mm512_min_ps(hi, x);
    let xc = _mm512_max_ps(lo, xc);
    let t = _mm512_fmadd_ps(xc, splat(std::f32::consts::LOG2_E), splat(0.5));
    // Round down, exceptions suppressed: what `roundps $9` does in the 8-lane form.
    let n = _mm512_roundscale_ps::<0x09>(t);
    let r = _mm512_fmadd_ps(n, splat(-0.693_359_4), xc);
    let r = _mm512_fmadd_ps(n, splat(2.121_944_4e-4), r);
    let p = horner16(r, &EXP_POLY);
    let r2 = _mm512_mul_ps(r, r);
    let y = _mm512_fmadd_ps(p, r2, r);
    let y = _mm512_add_ps(y, splat(1.0));
    let biased = _mm512_add_ps(n, splat(12_582_912.0));
    let e = _mm512_slli_epi32::<23>(_mm512_castps_si512(biased));
    let y = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
    let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, hi);
    let y = _mm512_mask_blend_ps(over, y, splat(f32::INFINITY));
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, lo);
    _mm512_mask_blend_ps(under, y, splat(0.0))
}

/// `tanh8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn tanh16(x: __m512) -> __m512 {
    let xc = _mm512_min_ps(splat(9.0), x);
    let xc = _mm512_max_ps(splat(-9.0), xc);
    let x2 = _mm512_mul_ps(xc, xc);
    let p = _mm512_mul_ps(xc, horner16(x2, &TANH_P));
    let q = horner16(x2, &TANH_Q);
    let r = _mm512_div_ps(p, q);
    let r = _mm512_min_ps(splat(1.0), r);
    let r = _mm512_max_ps(splat(-1.0), r);
    let ax = and_bits(x, 0x7fff_ffff);
    let is_tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(ax, splat(4e-4));
    _mm512_mask_blend_ps(is_tiny, r, x)
}

/// `log8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn log16(x: __m512) -> __m512 {
    let (e, xr, z, y) = log_parts16(x);
    let y = _mm512_fmadd_ps(e, splat(-2.121_944_4e-4), y);
    let y = _mm512_fmadd_ps(z, splat(-0.5), y);
    let r = _mm512_add_ps(xr, y);
    let r = _mm512_fmadd_ps(e, splat(0.693_359_4), r);
    log_special16(x, r)
}

/// `log_parts8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn log_parts16(x: __m512) -> (__m512, __m512, __m512, __m512) {
    let small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, splat(f32::MIN_POSITIVE));
    let xs = _mm512_mul_ps(x, splat(8_388_608.0));
    let xv = select(small, xs, x);
    let adj = select(small, splat(23.0), splat(0.0));
    let bits = _mm512_castps_si512(xv);
    let e = _mm512_cvtepi32_ps(_mm512_srli_epi32::<23>(bits));
    let e = _mm512_sub_ps(e, splat(126.0));
    let e = _mm512_sub_ps(e, adj);
    let m = _mm512_and_si512(bits, _mm512_set1_epi32(0x807f_ffffu32 as i32));
    let m = _mm512_castsi512_ps(_mm512_or_si512(m, _mm512_set1_epi32(0x3f00_0000)));
    let lt = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(m, splat(std::f32::consts::FRAC_1_SQRT_2));
    let e = select(lt, _mm512_sub_ps(e, splat(1.0)), e);
    let mm = select(lt, _mm512_add_ps(m, m), m);
    let xr = _mm512_sub_ps(mm, splat(1.0));
    let z = _mm512_mul_ps(xr, xr);
    let p = horner16(xr, &LOG_POLY);
    let y = _mm512_mul_ps(p, xr);
    let y = _mm512_mul_ps(y, z);
    (e, xr, z, y)
}

/// `log_special8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn log_special16(x: __m512, r: __m512) -> __m512 {
    let zero = splat(0.0);
    let r = select(
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, zero),
        splat(f32::NEG_INFINITY),
        r,
    );
    let r = select(
        _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, zero),
        splat(f32::NAN),
        r,
    );
    let inf = splat(f32::INFINITY);
    let r = select(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, inf), inf, r);
    select(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), x, r)
}

/// `erf8` on 16 lanes (with its shortcut for a group whose lanes are all below 1).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn erf16(x: __m512) -> __m512 {
    let ax = and_bits(x, 0x7fff_ffff);
    let z = _mm512_mul_ps(x, x);
    let p = horner16(z, &ERF_SMALL);
    let small = _mm512_mul_ps(p, x);
    let one = splat(1.0);
    let is_small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(ax, one);
    if is_small == 0xffff {
        return small;
    }
    let t = _mm512_sub_ps(ax, splat(2.5));
    let m = horner16(t, &ERF_MID);
    let big = _mm512_min_ps(one, m);
    let sat = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(ax, splat(4.0));
    let big = select(sat, one, big);
    let sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN));
    let big = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(big), sign));
    let r = select(is_small, small, big);
    select(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), x, r)
}

/// `sigmoid8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn sigmoid16(x: __m512) -> __m512 {
    let nx = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(x),
        _mm512_set1_epi32(i32::MIN),
    ));
    let e = exp16(nx);
    let one = splat(1.0);
    _mm512_div_ps(one, _mm512_add_ps(one, e))
}

/// `silu8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn silu16(x: __m512) -> __m512 {
    _mm512_mul_ps(x, sigmoid16(x))
}

/// `gelu_tail` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gelu_tail16(x: __m512, t: __m512) -> __m512 {
    let s = _mm512_add_ps(splat(1.0), t);
    let hx = _mm512_mul_ps(splat(0.5), x);
    _mm512_mul_ps(hx, s)
}

/// `gelu_tanh8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn gelu_tanh16(x: __m512) -> __m512 {
    let x3 = _mm512_mul_ps(x, x);
    let x3 = _mm512_mul_ps(x3, x);
    let inner = _mm512_mul_ps(x3, splat(0.044_715_f64 as f32));
    let inner = _mm512_add_ps(x, inner);
    let inner = _mm512_mul_ps(inner, splat(0.797_884_560_802_865_4_f64 as f32));
    gelu_tail16(x, tanh16(inner))
}

/// `gelu_erf8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn gelu_erf16(x: __m512) -> __m512 {
    let t = _mm512_mul_ps(x, splat(std::f64::consts::FRAC_1_SQRT_2 as f32));
    gelu_tail16(x, erf16(t))
}

/// `log1p8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn log1p16(x: __m512) -> __m512 {
    let one = splat(1.0);
    let u = _mm512_add_ps(x, one);
    let l = log16(u);
    let k = _mm512_div_ps(x, _mm512_sub_ps(u, one));
    let r = _mm512_mul_ps(l, k);
    let r = select(_mm512_cmp_ps_mask(l, l, _CMP_UNORD_Q), l, r);
    let r = select(_mm512_cmp_ps_mask(u, one, _CMP_EQ_OQ), x, r);
    let inf = splat(f32::INFINITY);
    select(_mm512_cmp_ps_mask(u, inf, _CMP_EQ_OQ), inf, r)
}

/// `expm1_8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn expm1_16(x: __m512) -> __m512 {
    let one = splat(1.0);
    let u = exp16(x);
    let um1 = _mm512_sub_ps(u, one);
    let k = _mm512_div_ps(x, log16(u));
    let r = _mm512_mul_ps(um1, k);
    let r = select(_mm512_cmp_ps_mask(u, one, _CMP_EQ_OQ), x, r);
    let minus_one = splat(-1.0);
    let r = select(_mm512_cmp_ps_mask(um1, minus_one, _CMP_EQ_OQ), minus_one, r);
    let inf = splat(f32::INFINITY);
    select(_mm512_cmp_ps_mask(u, inf, _CMP_EQ_OQ), inf, r)
}

/// `sin_cos8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn sin_cos16(x: __m512, cos: bool) -> __m512 {
    use super::super::trig::{COS_POLY, SIN_POLY};
    let (j, r) = reduce16(x);
    let q = _mm512_add_epi32(_mm512_cvtps_epi32(j), _mm512_set1_epi32(cos as i32));
    let z = _mm512_mul_ps(r, r);
    let ps = horner16(z, &SIN_POLY);
    let sin = _mm512_fmadd_ps(_mm512_mul_ps(r, z), ps, r);
    let sin = select(_mm512_cmp_ps_mask(r, splat(0.0), _CMP_EQ_OQ), r, sin);
    let pc = horner16(z, &COS_POLY);
    let c0 = _mm512_fmadd_ps(z, splat(-0.5), splat(1.0));
    let cos_v = _mm512_fmadd_ps(_mm512_mul_ps(z, z), pc, c0);
    let one = _mm512_set1_epi32(1);
    let odd = _mm512_cmpeq_epi32_mask(_mm512_and_si512(q, one), one);
    let v = select(odd, cos_v, sin);
    let sign = _mm512_slli_epi32(_mm512_and_si512(q, _mm512_set1_epi32(2)), 30);
    let y = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), sign));
    beyond_poly_max16(x, y, |v| super::super::trig::sin_cos(v, cos))
}

/// `reduce8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn reduce16(x: __m512) -> (__m512, __m512) {
    use super::super::trig::{PIO2, TWO_OVER_PI};
    let j = _mm512_roundscale_ps(
        _mm512_mul_ps(x, splat(TWO_OVER_PI)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm512_fnmadd_ps(j, splat(PIO2[0]), x);
    let r = _mm512_fnmadd_ps(j, splat(PIO2[1]), r);
    let r = _mm512_fnmadd_ps(j, splat(PIO2[2]), r);
    (
        j,
        select(_mm512_cmp_ps_mask(j, splat(0.0), _CMP_EQ_OQ), x, r),
    )
}

/// `beyond_poly_max8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn beyond_poly_max16(
    x: __m512,
    y: __m512,
    scalar: impl Fn(f32) -> f32,
) -> __m512 {
    use super::super::trig::POLY_MAX;
    let ax = and_bits(x, 0x7fff_ffff);
    let far = _mm512_cmp_ps_mask(ax, splat(POLY_MAX), _CMP_NLE_UQ);
    if far == 0 {
        return y;
    }
    let (mut xs, mut ys) = ([0f32; 16], [0f32; 16]);
    _mm512_storeu_ps(xs.as_mut_ptr(), x);
    _mm512_storeu_ps(ys.as_mut_ptr(), y);
    for l in (0..16).filter(|l| far & (1 << l) != 0) {
        ys[l] = scalar(xs[l]);
    }
    _mm512_loadu_ps(ys.as_ptr())
}

/// `sin8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn sin16(x: __m512) -> __m512 {
    sin_cos16(x, false)
}

/// `cos8` on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn cos16(x: __m512) -> __m512 {
    sin_cos16(x, true)
}
