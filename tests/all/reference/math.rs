//! Scalar functions of the reference with no one-line Rust form: erf, sigmoid, wrapping integer
//! power, PyTorch's float floor division, and the hyperbolic and inverse trigonometric functions.

/// erf in f64: Maclaurin series below 2, Laplace's continued fraction for erfc above.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 2.0 {
        let a2 = a * a;
        let (mut term, mut sum) = (a, a);
        for n in 1..400 {
            term *= -a2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-18 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a < 30.0 {
        // erfc(a) = e^{-a^2} / sqrt(pi) / (a + (1/2)/(a + 1/(a + (3/2)/(a + ...))))
        let mut f = a;
        for k in (1..=300).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
    } else {
        1.0
    };
    r.copysign(x)
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Wrapping integer power (repeated multiplication, by squaring); a negative exponent gives 0
/// except for bases 1 and -1.
pub fn int_pow(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 if exp % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        };
    }
    let (mut b, mut e, mut acc) = (base, exp as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    acc
}

/// `torch.floor_divide` of floats as PyTorch's `div_floor_floating_vec` computes it (ATen's
/// BinaryOpsKernel.cpp), each step rounded by `round` to the type PyTorch computes in: f16 and
/// bf16 tensors compute in their own dtype, a single-element divisor in float32.
pub fn floor_divide(a: f64, b: f64, round: impl Fn(f64) -> f64) -> f64 {
    let basic_div = round(a / b);
    let m = a % b;
    let floor = if basic_div.abs() == f64::INFINITY && a.abs() != f64::INFINITY {
        a
    } else {
        round(a - m)
    };
    let mut div = round(floor / b);
    if m != 0.0 && ((b < 0.0) ^ (m < 0.0)) {
        div = round(div - 1.0);
    }
    let mut floordiv = div.floor();
    if round(div - floordiv) > 0.5 {
        floordiv = round(floordiv + 1.0);
    }
    if div == 0.0 {
        floordiv = 0f64.copysign(basic_div);
    }
    if b == 0.0 {
        floordiv = basic_div;
    }
    floordiv
}

/// The hyperbolic and inverse trigonometric functions from their definitions in f64, in forms
/// accurate near 0 (expm1, log1p) and for large arguments (ln 2|x|), so they check the backends'
/// libm calls and StableHLO compositions independently.
pub fn trig(op: deferfuse::UnaryOp, x: f64) -> f64 {
    use deferfuse::UnaryOp::*;
    let ax = x.abs();
    // sqrt((1 - x)(1 + x)): cos(asin x), NaN beyond +-1.
    let co = || ((1.0 - x) * (1.0 + x)).sqrt();
    match op {
        Sinh if ax > 20.0 => (0.5 * ax.exp()).copysign(x),
        Sinh => {
            let u = ax.exp_m1();
            (0.5 * (u + u / (u + 1.0))).copysign(x)
        }
        Cosh => 0.5 * (ax.exp() + (-ax).exp()),
        Tan => x.sin() / x.cos(),
        Asin => x.atan2(co()),
        Acos => co().atan2(x),
        Atan => x.atan2(1.0),
        Asinh if ax > 1e8 => (ax.ln() + std::f64::consts::LN_2).copysign(x),
        Asinh => (ax + ax * ax / (1.0 + (1.0 + ax * ax).sqrt()))
            .ln_1p()
            .copysign(x),
        Acosh if x < 1.0 => f64::NAN,
        Acosh if x > 1e8 => x.ln() + std::f64::consts::LN_2,
        Acosh => ((x - 1.0) + ((x - 1.0) * (x + 1.0)).sqrt()).ln_1p(),
        Atanh => 0.5 * (2.0 * x / (1.0 - x)).ln_1p(),
        other => unreachable!("{} is not a trigonometric op", other.name()),
    }
}
