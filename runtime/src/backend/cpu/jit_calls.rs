//! Scalar functions the generated code calls per element where inlining does not pay: f64
//! transcendentals, f32 functions with no inline polynomial (sin, cos, tan, atan, asin, acos as
//! their row routines compute them; pow, fmod and the hyperbolic functions from the
//! C library), floor division, integer pow and f16 conversions. Registered by name with the
//! JIT.

use half::{bf16, f16};

macro_rules! f64_unary {
    ($($name:ident => $f:expr),* $(,)?) => {
        $(extern "C" fn $name(x: f64) -> f64 { ($f)(x) })*
    };
}

f64_unary! {
    df_exp_f64 => f64::exp,
    df_log_f64 => f64::ln,
    df_log1p_f64 => f64::ln_1p,
    df_expm1_f64 => f64::exp_m1,
    df_sin_f64 => f64::sin,
    df_cos_f64 => f64::cos,
    df_tanh_f64 => f64::tanh,
    df_erf_f64 => erf64,
    df_log2_f64 => f64::log2,
    df_log10_f64 => f64::log10,
}

extern "C" fn df_atan2_f64(y: f64, x: f64) -> f64 {
    y.atan2(x)
}

/// `torch.floor_divide` of floats, step for step as PyTorch's vectorized
/// `div_floor_floating_vec` runs it, with every step's result rounded by `round` (to the dtype
/// PyTorch computes in: f16 and bf16 tensors round after each step, f32 and f64 compute exactly
/// in f64 and round to f32 in between, which is f32 arithmetic). Division by zero gives `a / b`;
/// a zero quotient takes the sign of `a / b`.
pub fn floor_divide(a: f64, b: f64, round: impl Fn(f64) -> f64) -> f64 {
    let basic = round(a / b);
    if b == 0.0 {
        return basic;
    }
    let m = a % b;
    // PyTorch's fix-up for a quotient that overflows: divide `a` itself.
    let whole = if basic.is_infinite() && a.is_finite() {
        a
    } else {
        round(a - m)
    };
    let mut div = round(whole / b);
    if m != 0.0 && (b < 0.0) != (m < 0.0) {
        div = round(div - 1.0);
    }
    if div == 0.0 {
        return 0f64.copysign(basic);
    }
    let fl = div.floor();
    if round(div - fl) > 0.5 {
        round(fl + 1.0)
    } else {
        fl
    }
}

extern "C" fn df_floordiv_f64(a: f64, b: f64) -> f64 {
    floor_divide(a, b, |x| x)
}
extern "C" fn df_floordiv_f32(a: f32, b: f32) -> f32 {
    floor_divide(a as f64, b as f64, |x| x as f32 as f64) as f32
}
/// Floor division of two float16 tensors' values (in f32 lanes), rounded to f16 at each step.
extern "C" fn df_floordiv_f16(a: f32, b: f32) -> f32 {
    floor_divide(a as f64, b as f64, |x| f16::from_f64(x).to_f64()) as f32
}
/// Floor division of two bfloat16 tensors' values, rounded to bf16 at each step.
extern "C" fn df_floordiv_bf16(a: f32, b: f32) -> f32 {
    floor_divide(a as f64, b as f64, |x| bf16::from_f64(x).to_f64()) as f32
}

// The C library's hyperbolic and inverse trigonometric functions, called per lane: f64 ones,
// and sinh, cosh, asinh and acosh in f32 (which PyTorch's CPU eager computes no faster), all
// accurate to 2 ulp or better (glibc's manual, "Known Maximum Errors"). Registered under
// df_<name>_f32/_f64.
extern "C" {
    fn sinhf(x: f32) -> f32;
    fn sinh(x: f64) -> f64;
    fn coshf(x: f32) -> f32;
    fn cosh(x: f64) -> f64;
    fn tan(x: f64) -> f64;
    fn asin(x: f64) -> f64;
    fn acos(x: f64) -> f64;
    fn atan(x: f64) -> f64;
    fn asinhf(x: f32) -> f32;
    fn asinh(x: f64) -> f64;
    fn acoshf(x: f32) -> f32;
    fn acosh(x: f64) -> f64;
    fn atanh(x: f64) -> f64;
}

/// The inline code's f32 sine and cosine: `trig`'s algorithm, as the row routines run it.
extern "C" fn df_sin_f32(x: f32) -> f32 {
    super::trig::sin_cos(x, false)
}
extern "C" fn df_cos_f32(x: f32) -> f32 {
    super::trig::sin_cos(x, true)
}
/// The inline code's f32 tan, atan, asin and acos (`trig`, `arc_trig`), as the row routines
/// run them.
extern "C" fn df_tan_f32(x: f32) -> f32 {
    super::trig::tan(x)
}
extern "C" fn df_atan_f32(x: f32) -> f32 {
    super::arc_trig::atan(x)
}
extern "C" fn df_asin_f32(x: f32) -> f32 {
    super::arc_trig::asin(x)
}
extern "C" fn df_acos_f32(x: f32) -> f32 {
    super::arc_trig::acos(x)
}
extern "C" fn df_pow_f32(x: f32, y: f32) -> f32 {
    x.powf(y)
}
extern "C" fn df_pow_f64(x: f64, y: f64) -> f64 {
    x.powf(y)
}
extern "C" fn df_fmod_f32(x: f32, y: f32) -> f32 {
    x % y
}
extern "C" fn df_fmod_f64(x: f64, y: f64) -> f64 {
    x % y
}

/// Integer power by squaring with wrapping, like PyTorch's integral pow. Negative exponents give
/// 0 except for bases 1 and -1 (PyTorch's rule for integer tensors).
pub extern "C" fn df_pow_i64(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut b, mut e, mut r) = (base, exp as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            r = r.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    r
}

extern "C" fn df_f16_to_f32(bits: u32) -> f32 {
    f16::from_bits(bits as u16).to_f32()
}
extern "C" fn df_f32_to_f16(x: f32) -> u32 {
    f16::from_f32(x).to_bits() as u32
}
/// Rounds an f32 to the nearest f16 and back (casts to float16 inside a region).
extern "C" fn df_round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// erf for f64: `libm`'s is not in Rust's std, so use the relation with the regularized gamma
/// function via a high-precision series/continued fraction (max abs error ~1e-15).
pub fn erf64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Maclaurin series: erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let mut sum = ax;
        let mut term = ax;
        let x2 = ax * ax;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() <= 1e-17 * sum.abs() || n > 300.0 {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if ax < 6.0 {
        // Continued fraction for erfc (Lentz), converges fast for x >= 2.5.
        let x2 = ax * ax;
        let mut f = ax;
        let mut c = ax;
        let mut d = 0.0;
        let tiny = 1e-300;
        for i in 1..200 {
            let a = i as f64 / 2.0;
            d = ax + a * d;
            d = if d.abs() < tiny { tiny } else { d };
            c = ax + a / c;
            c = if c.abs() < tiny { tiny } else { c };
            d = 1.0 / d;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-x2).exp() / (f * std::f64::consts::PI.sqrt())
    } else {
        1.0
    };
    r.copysign(x)
}

/// Every helper with the symbol name the generated code imports.
pub fn symbols() -> Vec<(&'static str, *const u8)> {
    vec![
        ("df_exp_f64", df_exp_f64 as *const u8),
        ("df_log_f64", df_log_f64 as *const u8),
        ("df_log1p_f64", df_log1p_f64 as *const u8),
        ("df_expm1_f64", df_expm1_f64 as *const u8),
        ("df_sin_f64", df_sin_f64 as *const u8),
        ("df_cos_f64", df_cos_f64 as *const u8),
        ("df_tanh_f64", df_tanh_f64 as *const u8),
        ("df_erf_f64", df_erf_f64 as *const u8),
        ("df_log2_f64", df_log2_f64 as *const u8),
        ("df_log10_f64", df_log10_f64 as *const u8),
        ("df_atan2_f64", df_atan2_f64 as *const u8),
        ("df_floordiv_f64", df_floordiv_f64 as *const u8),
        ("df_floordiv_f32", df_floordiv_f32 as *const u8),
        ("df_floordiv_f16", df_floordiv_f16 as *const u8),
        ("df_floordiv_bf16", df_floordiv_bf16 as *const u8),
        ("df_sin_f32", df_sin_f32 as *const u8),
        ("df_cos_f32", df_cos_f32 as *const u8),
        ("df_pow_f32", df_pow_f32 as *const u8),
        ("df_pow_f64", df_pow_f64 as *const u8),
        ("df_fmod_f32", df_fmod_f32 as *const u8),
        ("df_fmod_f64", df_fmod_f64 as *const u8),
        ("df_pow_i64", df_pow_i64 as *const u8),
        ("df_f16_to_f32", df_f16_to_f32 as *const u8),
        ("df_f32_to_f16", df_f32_to_f16 as *const u8),
        ("df_round_f16", df_round_f16 as *const u8),
        ("df_sinh_f32", sinhf as *const u8),
        ("df_sinh_f64", sinh as *const u8),
        ("df_cosh_f32", coshf as *const u8),
        ("df_cosh_f64", cosh as *const u8),
        ("df_tan_f32", df_tan_f32 as *const u8),
        ("df_tan_f64", tan as *const u8),
        ("df_asin_f32", df_asin_f32 as *const u8),
        ("df_asin_f64", asin as *const u8),
        ("df_acos_f32", df_acos_f32 as *const u8),
        ("df_acos_f64", acos as *const u8),
        ("df_atan_f32", df_atan_f32 as *const u8),
        ("df_atan_f64", atan as *const u8),
        ("df_asinh_f32", asinhf as *const u8),
        ("df_asinh_f64", asinh as *const u8),
        ("df_acosh_f32", acoshf as *const u8),
        ("df_acosh_f64", acosh as *const u8),
        ("df_atanh_f64", atanh as *const u8),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf64_matches_known_values() {
        assert!((erf64(0.5) - 0.520_499_877_813_046_5).abs() < 1e-15);
        assert!((erf64(-3.0) + 0.999_977_909_503_001_4).abs() < 1e-15);
        assert_eq!(erf64(10.0), 1.0);
    }

    #[test]
    fn integer_pow_wraps_and_handles_negative_exponents() {
        assert_eq!(df_pow_i64(3, 4), 81);
        assert_eq!(df_pow_i64(-1, -3), -1);
        assert_eq!(df_pow_i64(2, -1), 0);
        assert_eq!(df_pow_i64(2, 64), 0);
    }
}
