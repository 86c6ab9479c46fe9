//! The hyperbolic and inverse trigonometric functions in StableHLO, which has sine, cosine and
//! atan2 but none of these: each is composed in f64 (f32 is widened and rounded once at the end,
//! so the composition's few-ulp f64 error disappears in the rounding), in forms that neither
//! cancel near 0 (built on expm1 and log1p) nor overflow before the true result does.

use super::hlo::{Elem, Func, Val};
use deferfuse_fusion::ir::UnaryOp;

/// Past this magnitude asinh(x) and acosh(x) are ln(2|x|) to within f64 rounding, and the
/// squares in their small-argument forms would overflow.
const LOG_REGIME: f64 = 1e8;
/// Past this magnitude e^-|x| no longer changes sinh in f64 (e^-40 < 2^-53).
const SINH_EXP_REGIME: f64 = 20.0;

fn k(f: &mut Func, x: f64, like: &Val) -> Val {
    f.fconst(x, like.ty.clone())
}

/// `op(a)` for one of sinh, cosh, tan, asin, acos, atan, asinh, acosh, atanh.
pub fn trig(f: &mut Func, op: UnaryOp, a: &Val) -> Val {
    use UnaryOp::*;
    let wide = a.ty.elem != Elem::F64;
    let x = if wide {
        f.convert(a, Elem::F64)
    } else {
        a.clone()
    };
    let r = match op {
        Sinh => sinh(f, &x),
        Cosh => cosh(f, &x),
        Tan => {
            let s = f.ew("sine", &[&x]);
            let c = f.ew("cosine", &[&x]);
            f.ew("divide", &[&s, &c])
        }
        Asin | Acos => {
            // sqrt((1 - x)(1 + x)) = cos(asin x), exact factors near +-1; NaN beyond them.
            let one = k(f, 1.0, &x);
            let l = f.ew("subtract", &[&one, &x]);
            let h = f.ew("add", &[&one, &x]);
            let p = f.ew("multiply", &[&l, &h]);
            let c = f.ew("sqrt", &[&p]);
            if op == Asin {
                f.ew("atan2", &[&x, &c])
            } else {
                f.ew("atan2", &[&c, &x])
            }
        }
        Atan => {
            let one = k(f, 1.0, &x);
            f.ew("atan2", &[&x, &one])
        }
        Asinh => asinh(f, &x),
        Acosh => acosh(f, &x),
        Atanh => {
            // atanh x = 0.5 log1p(2x / (1 - x)): +-inf at +-1, NaN beyond.
            let one = k(f, 1.0, &x);
            let two = k(f, 2.0, &x);
            let half = k(f, 0.5, &x);
            let n = f.ew("multiply", &[&two, &x]);
            let d = f.ew("subtract", &[&one, &x]);
            let q = f.ew("divide", &[&n, &d]);
            let l = f.ew("log_plus_one", &[&q]);
            f.ew("multiply", &[&half, &l])
        }
        other => unreachable!("{} is not a trigonometric op", other.name()),
    };
    if wide {
        f.convert(&r, a.ty.elem)
    } else {
        r
    }
}

/// sign(x) * sinh|x|: 0.5 (u + u / (u + 1)) with u = expm1|x|, and (0.5 h) h with h = e^(|x|/2)
/// for large |x| (finite as long as sinh is).
fn sinh(f: &mut Func, x: &Val) -> Val {
    let ax = f.ew("abs", &[x]);
    let one = k(f, 1.0, x);
    let half = k(f, 0.5, x);
    let u = f.ew("exponential_minus_one", &[&ax]);
    let u1 = f.ew("add", &[&u, &one]);
    let q = f.ew("divide", &[&u, &u1]);
    let s = f.ew("add", &[&u, &q]);
    let small = f.ew("multiply", &[&half, &s]);
    let big = half_exp_squared(f, &ax);
    let lim = k(f, SINH_EXP_REGIME, x);
    let is_big = f.compare("GT", &ax, &lim);
    let r = f.select(&is_big, &big, &small);
    // sign(-0) = -0 keeps sinh(-0) = -0; sign(NaN) = NaN.
    let s = f.ew("sign", &[x]);
    f.ew("multiply", &[&r, &s])
}

/// 0.5 e^|x| computed as (0.5 h) h with h = e^(|x|/2), so it overflows only where the result does.
fn half_exp_squared(f: &mut Func, ax: &Val) -> Val {
    let half = k(f, 0.5, ax);
    let hx = f.ew("multiply", &[&half, ax]);
    let h = f.ew("exponential", &[&hx]);
    let hh = f.ew("multiply", &[&half, &h]);
    f.ew("multiply", &[&hh, &h])
}

/// 0.5 e^|x| + 0.5 e^-|x| (no cancellation: both terms are positive).
fn cosh(f: &mut Func, x: &Val) -> Val {
    let ax = f.ew("abs", &[x]);
    let big = half_exp_squared(f, &ax);
    let half = k(f, 0.5, x);
    let n = f.ew("negate", &[&ax]);
    let e = f.ew("exponential", &[&n]);
    let small = f.ew("multiply", &[&half, &e]);
    f.ew("add", &[&big, &small])
}

/// ln|x| + ln 2, the large-argument form of asinh|x| and acosh x.
fn log_2x(f: &mut Func, ax: &Val) -> Val {
    let l = f.ew("log", &[ax]);
    let ln2 = k(f, std::f64::consts::LN_2, ax);
    f.ew("add", &[&l, &ln2])
}

/// sign(x) * log1p(|x| + x^2 / (1 + sqrt(1 + x^2))).
fn asinh(f: &mut Func, x: &Val) -> Val {
    let ax = f.ew("abs", &[x]);
    let one = k(f, 1.0, x);
    let x2 = f.ew("multiply", &[&ax, &ax]);
    let r = f.ew("add", &[&one, &x2]);
    let r = f.ew("sqrt", &[&r]);
    let d = f.ew("add", &[&one, &r]);
    let q = f.ew("divide", &[&x2, &d]);
    let t = f.ew("add", &[&ax, &q]);
    let small = f.ew("log_plus_one", &[&t]);
    let big = log_2x(f, &ax);
    let lim = k(f, LOG_REGIME, x);
    let is_big = f.compare("GT", &ax, &lim);
    let r = f.select(&is_big, &big, &small);
    let s = f.ew("sign", &[x]);
    f.ew("multiply", &[&r, &s])
}

/// log1p(t + sqrt(t (x + 1))) with t = x - 1 (exact near 1); NaN below 1.
fn acosh(f: &mut Func, x: &Val) -> Val {
    let one = k(f, 1.0, x);
    let t = f.ew("subtract", &[x, &one]);
    let p = f.ew("add", &[x, &one]);
    let p = f.ew("multiply", &[&t, &p]);
    let r = f.ew("sqrt", &[&p]);
    let s = f.ew("add", &[&t, &r]);
    let small = f.ew("log_plus_one", &[&s]);
    let big = log_2x(f, x);
    let lim = k(f, LOG_REGIME, x);
    let is_big = f.compare("GT", x, &lim);
    let r = f.select(&is_big, &big, &small);
    let nan = k(f, f64::NAN, x);
    let below = f.compare("LT", x, &one);
    f.select(&below, &nan, &r)
}
