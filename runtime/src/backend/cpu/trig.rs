//! f32 sine and cosine: one algorithm for the inline code (a helper call per lane) and the
//! 8/16-lane row routines (`block_math`), so every form gives the same bits.
//!
//! Per-lane libm calls ran 5x behind PyTorch's CPU eager (`sin` on 262,144 floats 1,813 us
//! against 323): SIREN's sine activations and NeRF's positional encodings apply them to every
//! activation. Here x is reduced by the nearest multiple j of pi/2 (pi/2 in three parts, one FMA
//! each, Cody and Waite), then Cephes' sinf/cosf polynomials on |r| <= pi/4 give sin or cos by
//! j mod 4. Beyond |x| = [`POLY_MAX`] (and for NaN and infinities) the reduction loses digits:
//! such lanes take libm's f64 sin and cos, rounded.

/// 2/pi, rounded to f32.
pub(crate) const TWO_OVER_PI: f32 = std::f32::consts::FRAC_2_PI;

/// pi/2 as the sum of three f32s, the first two with trailing zero bits so that j * part is
/// exact for the |j| this range needs.
pub(crate) const PIO2: [f32; 3] = [1.570_796_4, -4.371_139e-8, -1.715_124_6e-15];

/// Cephes sinf: sin r = r + r^3 P(r^2) on |r| <= pi/4 (highest power first).
pub(crate) const SIN_POLY: [f32; 3] = [-1.951_529_6e-4, 8.332_161e-3, -1.666_665_5e-1];

/// Cephes cosf: cos r = 1 - r^2 / 2 + r^4 Q(r^2) on |r| <= pi/4 (highest power first).
pub(crate) const COS_POLY: [f32; 3] = [2.443_315_7e-5, -1.388_731_6e-3, 4.166_664_6e-2];

/// Largest |x| the polynomial path takes (its error stays within the tested bound up to here).
pub(crate) const POLY_MAX: f32 = 8192.0;

/// x = j pi/2 + r with j the nearest integer to x 2/pi and |r| <= pi/4: pi/2 in three parts,
/// one FMA each (Cody and Waite); r is x itself where j is 0 (no reduction; keeps -0 as -0).
fn reduce(x: f32) -> (f32, f32) {
    let j = (x * TWO_OVER_PI).round_ties_even();
    let r = (-j).mul_add(PIO2[0], x);
    let r = (-j).mul_add(PIO2[1], r);
    let r = (-j).mul_add(PIO2[2], r);
    (j, if j == 0.0 { x } else { r })
}

/// sin x (`cos` false) or cos x (`cos` true), the operations the vector forms run, in order.
pub(crate) fn sin_cos(x: f32, cos: bool) -> f32 {
    if x.is_nan() || x.abs() > POLY_MAX {
        let v = x as f64;
        return (if cos { v.cos() } else { v.sin() }) as f32;
    }
    let (j, r) = reduce(x);
    let q = (j as i32).wrapping_add(cos as i32);
    let z = r * r;
    let ps = SIN_POLY[0].mul_add(z, SIN_POLY[1]).mul_add(z, SIN_POLY[2]);
    let sin = (r * z).mul_add(ps, r);
    // r itself at r = -0, where -0 + (+0) would lose the sign.
    let sin = if r == 0.0 { r } else { sin };
    let pc = COS_POLY[0].mul_add(z, COS_POLY[1]).mul_add(z, COS_POLY[2]);
    let cos_v = (z * z).mul_add(pc, z.mul_add(-0.5, 1.0));
    let v = if q & 1 == 1 { cos_v } else { sin };
    f32::from_bits(v.to_bits() ^ (((q & 2) as u32) << 30))
}

/// Cephes tanf: tan r = r + r^3 P(r^2) on |r| <= pi/4 (highest power first).
pub(crate) const TAN_POLY: [f32; 6] = [
    9.385_402e-3,
    3.119_922_3e-3,
    2.443_013_5e-2,
    5.341_128e-2,
    1.333_879_9e-1,
    3.333_315_7e-1,
];

/// tan x, the operations the vector forms run, in order: `sin_cos`'s reduction, Cephes'
/// polynomial on r, and -1 / tan r where j is odd (tan(r + pi/2) = -cot r). Lanes beyond
/// [`POLY_MAX`] (and NaN) take libm's f64 tan, rounded.
pub(crate) fn tan(x: f32) -> f32 {
    if x.is_nan() || x.abs() > POLY_MAX {
        return (x as f64).tan() as f32;
    }
    let (j, r) = reduce(x);
    let z = r * r;
    let p = horner(z, &TAN_POLY);
    let t = (r * z).mul_add(p, r);
    if (j as i32) & 1 == 1 {
        -1.0 / t
    } else {
        t
    }
}

/// `acc = c0`, then `acc = acc * z + c_k`, fused: the vector forms' `horner`.
pub(crate) fn horner(z: f32, coeffs: &[f32]) -> f32 {
    coeffs[1..]
        .iter()
        .fold(coeffs[0], |acc, &c| acc.mul_add(z, c))
}
