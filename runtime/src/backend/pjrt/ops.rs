//! Per-element semantics in StableHLO, mirroring the CPU backend's (`cpu/lanes.rs`) so both
//! backends give PyTorch's answers: NaN-propagating max/min, divisor-signed remainder, integer
//! remainder, fmod and division by 0 giving 0, saturating float-to-int casts with NaN to 0,
//! half-to-even round, PyTorch's float floor division, f16/bf16 computed in f32 and rounded by
//! casts.

use super::hlo::{Elem, Func, Val};
use deferfuse_fusion::ir::{BinaryOp, DType, UnaryOp};

fn splat(f: &mut Func, x: f64, like: &Val) -> Val {
    f.fconst(x, like.ty.clone())
}

fn isplat(f: &mut Func, x: i64, like: &Val) -> Val {
    f.iconst(x, like.ty.clone())
}

/// A compare result (i1) as the runtime's bool representation (i32 0/1).
fn to_bool(f: &mut Func, p: &Val) -> Val {
    f.convert(p, Elem::I32)
}

/// `v != 0` as a bool.
pub fn truthy(f: &mut Func, v: &Val) -> Val {
    let z = splat(f, 0.0, v);
    let p = f.compare("NE", v, &z);
    to_bool(f, &p)
}

/// `v != 0` as an i1 predicate (for selects).
pub fn pred(f: &mut Func, v: &Val) -> Val {
    let z = splat(f, 0.0, v);
    f.compare("NE", v, &z)
}

/// u8 values wrap and bools are 0/1, like the CPU backend's `normalize`.
fn normalize(f: &mut Func, v: Val, d: DType) -> Val {
    match d {
        DType::U8 => {
            let m = isplat(f, 0xff, &v);
            f.ew("and", &[&v, &m])
        }
        DType::Bool => truthy(f, &v),
        _ => v,
    }
}

/// Float to integer: truncate toward zero, saturate, NaN gives 0.
fn float_to_int(f: &mut Func, v: &Val, to: Elem) -> Val {
    let (lo, hi) = if to == Elem::I64 {
        (i64::MIN as f64, i64::MAX as f64)
    } else {
        (i32::MIN as f64, i32::MAX as f64)
    };
    let r = f.convert(v, to);
    let lo_c = splat(f, lo, v);
    let hi_c = splat(f, hi, v);
    let too_low = f.compare("LT", v, &lo_c);
    let too_high = f.compare("GE", v, &hi_c);
    let nan = f.compare("NE", v, v);
    let imin = if to == Elem::I64 {
        i64::MIN
    } else {
        i32::MIN as i64
    };
    let imax = if to == Elem::I64 {
        i64::MAX
    } else {
        i32::MAX as i64
    };
    let min_v = isplat(f, imin, &r);
    let max_v = isplat(f, imax, &r);
    let zero = isplat(f, 0, &r);
    let r = f.select(&too_low, &min_v, &r);
    let r = f.select(&too_high, &max_v, &r);
    f.select(&nan, &zero, &r)
}

/// Converts `v` from dtype `from` to `to` (values in compute elements).
pub fn cast(f: &mut Func, v: &Val, from: DType, to: DType) -> Val {
    if from == to {
        return v.clone();
    }
    if to == DType::Bool {
        return truthy(f, v);
    }
    let (fe, te) = (Elem::of(from), Elem::of(to));
    let r = match (fe.is_float(), te.is_float()) {
        (true, false) => float_to_int(f, v, te),
        _ => f.convert(v, te),
    };
    match to {
        DType::BF16 | DType::F16 => {
            let narrow = if to == DType::BF16 { "bf16" } else { "f16" };
            let ty = super::hlo::Ty {
                elem: Elem::F32,
                dims: r.ty.dims.clone(),
            };
            round_to(f, &r, narrow, ty)
        }
        _ => normalize(f, r, to),
    }
}

/// Rounds f32 `v` to the narrow float type `narrow` (nearest even) and widens it back.
fn round_to(f: &mut Func, v: &Val, narrow: &str, ty: super::hlo::Ty) -> Val {
    // The generic form needs the narrow type spelled out; build it by hand.
    let dims: String = ty.dims.iter().map(|d| format!("{d}x")).collect();
    let nt = format!("tensor<{dims}{narrow}>");
    f.raw_convert_through(v, &nt)
}

fn fminmax(f: &mut Func, x: &Val, y: &Val, min: bool) -> Val {
    let c = f.compare(if min { "LT" } else { "GT" }, x, y);
    let r = f.select(&c, x, y);
    let nan = f.compare("NE", x, x);
    f.select(&nan, x, &r)
}

fn sigmoid(f: &mut Func, x: &Val) -> Val {
    let n = f.ew("negate", &[x]);
    let e = f.ew("exponential", &[&n]);
    let one = splat(f, 1.0, x);
    let den = f.ew("add", &[&one, &e]);
    f.ew("divide", &[&one, &den])
}

/// erf, exactly +-1 where the true value rounds to it (|x| >= 4 in f32, 6 in f64): XLA's
/// approximation leaves it a few ulp short there, so gelu(-inf) gave -inf instead of NaN and
/// gelu of large negative x a tiny negative number instead of -0.
fn erf(f: &mut Func, x: &Val) -> Val {
    let e = f.ew("chlo.erf", &[x]);
    let big = if x.ty.elem == Elem::F64 { 6.0 } else { 4.0 };
    let ax = f.ew("abs", &[x]);
    let lim = splat(f, big, x);
    let sat = f.compare("GE", &ax, &lim);
    let one = splat(f, 1.0, x);
    let m1 = splat(f, -1.0, x);
    let zero = splat(f, 0.0, x);
    let neg = f.compare("LT", x, &zero);
    let s = f.select(&neg, &m1, &one);
    f.select(&sat, &s, &e)
}

fn gelu_tail(f: &mut Func, x: &Val, t: &Val) -> Val {
    let one = splat(f, 1.0, x);
    let half = splat(f, 0.5, x);
    let s = f.ew("add", &[&one, t]);
    let hx = f.ew("multiply", &[&half, x]);
    f.ew("multiply", &[&hx, &s])
}

fn funary(f: &mut Func, op: UnaryOp, a: &Val) -> Val {
    use UnaryOp::*;
    let simple = |name: &str| name.to_string();
    let name = match op {
        Neg => simple("negate"),
        Abs => simple("abs"),
        Exp => simple("exponential"),
        Log => simple("log"),
        Log1p => simple("log_plus_one"),
        Expm1 => simple("exponential_minus_one"),
        Sqrt => simple("sqrt"),
        Sin => simple("sine"),
        Cos => simple("cosine"),
        Tanh => simple("tanh"),
        Erf => return erf(f, a),
        Floor => simple("floor"),
        Ceil => simple("ceil"),
        Round => simple("round_nearest_even"),
        // StableHLO has no trunc: ceil below zero, floor above (ceil keeps -0.5 -> -0).
        Trunc => return trunc(f, a),
        Log2 => return log_base(f, a, std::f64::consts::LN_2),
        Log10 => return log_base(f, a, std::f64::consts::LN_10),
        Sinh | Cosh | Tan | Asin | Acos | Atan | Asinh | Acosh | Atanh => {
            return super::trig::trig(f, op, a)
        }
        Rsqrt | Reciprocal => {
            let s = if op == Rsqrt {
                f.ew("sqrt", &[a])
            } else {
                a.clone()
            };
            let one = splat(f, 1.0, a);
            return f.ew("divide", &[&one, &s]);
        }
        Relu => {
            let zero = splat(f, 0.0, a);
            let m = f.compare("LT", a, &zero);
            return f.select(&m, &zero, a);
        }
        Sign => {
            let zero = splat(f, 0.0, a);
            let pos = splat(f, 1.0, a);
            let neg = splat(f, -1.0, a);
            let gt = f.compare("GT", a, &zero);
            let lt = f.compare("LT", a, &zero);
            let r = f.select(&lt, &neg, &zero);
            return f.select(&gt, &pos, &r);
        }
        Sigmoid => return sigmoid(f, a),
        Silu => {
            let s = sigmoid(f, a);
            return f.ew("multiply", &[a, &s]);
        }
        GeluErf => {
            let k = splat(f, std::f64::consts::FRAC_1_SQRT_2, a);
            let t = f.ew("multiply", &[a, &k]);
            let e = erf(f, &t);
            return gelu_tail(f, a, &e);
        }
        GeluTanh => {
            let k0 = splat(f, 0.797_884_560_802_865_4, a);
            let k1 = splat(f, 0.044_715, a);
            let x3 = f.ew("multiply", &[a, a]);
            let x3 = f.ew("multiply", &[&x3, a]);
            let inner = f.ew("multiply", &[&x3, &k1]);
            let inner = f.ew("add", &[a, &inner]);
            let inner = f.ew("multiply", &[&inner, &k0]);
            let t = f.ew("tanh", &[&inner]);
            return gelu_tail(f, a, &t);
        }
        LogicalNot | IsNan | BitwiseNot => unreachable!("handled by unary()"),
    };
    f.ew(&name, &[a])
}

fn trunc(f: &mut Func, a: &Val) -> Val {
    let zero = splat(f, 0.0, a);
    let neg = f.compare("LT", a, &zero);
    let up = f.ew("ceil", &[a]);
    let down = f.ew("floor", &[a]);
    f.select(&neg, &up, &down)
}

/// `ln x / ln base`, exact at exact powers of the base (log2(8) = 3 and log10(1000) = 3, as
/// PyTorch gives). f32 computes in f64 and rounds once, which lands on the integer; in f64 the
/// quotient can miss it by an ulp, so a result within an ulp of an integer is that integer
/// (costing at most an ulp next to a power, within the op's tolerance).
fn log_base(f: &mut Func, a: &Val, ln_base: f64) -> Val {
    let wide = f.convert(a, Elem::F64);
    let l = f.ew("log", &[&wide]);
    let k = splat(f, ln_base, &l);
    let r = f.ew("divide", &[&l, &k]);
    if a.ty.elem != Elem::F64 {
        return f.convert(&r, a.ty.elem);
    }
    let n = f.ew("round_nearest_even", &[&r]);
    let off = f.ew("subtract", &[&r, &n]);
    let off = f.ew("abs", &[&off]);
    let an = f.ew("abs", &[&n]);
    let eps = splat(f, f64::EPSILON, &r);
    let tol = f.ew("multiply", &[&an, &eps]);
    let near = f.compare("LE", &off, &tol);
    f.select(&near, &n, &r)
}

/// `op` on `a` (dtype `src`) giving dtype `dst`.
pub fn unary(f: &mut Func, op: UnaryOp, a: &Val, src: DType, dst: DType) -> Val {
    use UnaryOp::*;
    match op {
        LogicalNot => {
            let z = splat(f, 0.0, a);
            let p = f.compare("EQ", a, &z);
            to_bool(f, &p)
        }
        IsNan if src.is_float() => {
            let p = f.compare("NE", a, a);
            to_bool(f, &p)
        }
        IsNan => f.iconst(0, a.ty.with(Elem::I32)),
        // Inference rejects floats; on bool, ~x is logical not.
        BitwiseNot if src == DType::Bool => {
            let z = splat(f, 0.0, a);
            let p = f.compare("EQ", a, &z);
            to_bool(f, &p)
        }
        _ if src.is_float() => funary(f, op, a),
        BitwiseNot => {
            let v = f.ew("not", &[a]);
            normalize(f, v, dst)
        }
        Neg => {
            let v = f.ew("negate", &[a]);
            normalize(f, v, dst)
        }
        Abs => f.ew("abs", &[a]),
        Relu => {
            let z = isplat(f, 0, a);
            f.ew("maximum", &[a, &z])
        }
        Sign => {
            let z = isplat(f, 0, a);
            let one = isplat(f, 1, a);
            let m1 = isplat(f, -1, a);
            let gt = f.compare("GT", a, &z);
            let lt = f.compare("LT", a, &z);
            let r = f.select(&lt, &m1, &z);
            f.select(&gt, &one, &r)
        }
        Floor | Ceil | Round | Trunc => a.clone(),
        other => unreachable!(
            "{} on integers is promoted to float by inference",
            other.name()
        ),
    }
}

/// Python-style remainder fix-up: a non-zero `r` whose sign differs from `y`'s gets `y` added.
fn remainder_fix(f: &mut Func, r: &Val, y: &Val) -> Val {
    let fix = off_sign(f, r, y);
    let adj = f.ew("add", &[r, y]);
    f.select(&fix, &adj, r)
}

/// `op` on `x`, `y` (dtype `src`) giving dtype `dst`.
pub fn binary(f: &mut Func, op: BinaryOp, x: &Val, y: &Val, src: DType, dst: DType) -> Val {
    use BinaryOp::*;
    if matches!(op, LogicalAnd | LogicalOr) {
        let a = truthy(f, x);
        let b = truthy(f, y);
        return f.ew(if op == LogicalAnd { "and" } else { "or" }, &[&a, &b]);
    }
    if let Eq | Ne | Lt | Le | Gt | Ge = op {
        let dir = match op {
            Eq => "EQ",
            Ne => "NE",
            Lt => "LT",
            Le => "LE",
            Gt => "GT",
            _ => "GE",
        };
        let p = f.compare(dir, x, y);
        return to_bool(f, &p);
    }
    let float = src.is_float();
    let r = match op {
        Add => f.ew("add", &[x, y]),
        Sub => f.ew("subtract", &[x, y]),
        Mul => f.ew("multiply", &[x, y]),
        Div => f.ew("divide", &[x, y]),
        Maximum if float => fminmax(f, x, y, false),
        Minimum if float => fminmax(f, x, y, true),
        Maximum => f.ew("maximum", &[x, y]),
        Minimum => f.ew("minimum", &[x, y]),
        Pow if float => f.ew("power", &[x, y]),
        Pow => {
            // Exponentiation by squaring with wrapping products (XLA's integer power does not
            // wrap like this); negative exponents give 0 except for bases 1 and -1 (the CPU
            // backend's df_pow_i64).
            let zero_e = isplat(f, 0, y);
            let nonneg = f.compare("GE", y, &zero_e);
            let e = f.select(&nonneg, y, &zero_e);
            let bits = if x.ty.elem == Elem::I64 { 63 } else { 31 };
            let mut acc = isplat(f, 1, x);
            let mut base = x.clone();
            for bit in 0..bits {
                let m = isplat(f, 1i64 << bit, y);
                let set = f.ew("and", &[&e, &m]);
                let on = f.compare("NE", &set, &zero_e);
                let prod = f.ew("multiply", &[&acc, &base]);
                acc = f.select(&on, &prod, &acc);
                if bit + 1 < bits {
                    base = f.ew("multiply", &[&base, &base]);
                }
            }
            let one = isplat(f, 1, x);
            let m1 = isplat(f, -1, x);
            let two = isplat(f, 2, y);
            let zero = isplat(f, 0, x);
            let is1 = f.compare("EQ", x, &one);
            let ism1 = f.compare("EQ", x, &m1);
            let yr = f.ew("remainder", &[y, &two]);
            let odd = f.compare("NE", &yr, &zero_e);
            let m1pow = f.select(&odd, &m1, &one);
            let neg = f.select(&ism1, &m1pow, &zero);
            let neg = f.select(&is1, &one, &neg);
            f.select(&nonneg, &acc, &neg)
        }
        Remainder | Fmod | FloorDivide | TruncDivide if !float => int_division(f, op, x, y),
        Remainder | Fmod => {
            // StableHLO's remainder is C's fmod.
            let r = f.ew("remainder", &[x, y]);
            if op == Remainder {
                remainder_fix(f, &r, y)
            } else {
                r
            }
        }
        FloorDivide => floor_divide(f, x, y, src),
        TruncDivide => {
            let q = f.ew("divide", &[x, y]);
            let q = round_steps(f, q, src);
            trunc(f, &q)
        }
        Atan2 => f.ew("atan2", &[x, y]),
        BitwiseAnd => f.ew("and", &[x, y]),
        BitwiseOr => f.ew("or", &[x, y]),
        BitwiseXor => f.ew("xor", &[x, y]),
        LogicalAnd | LogicalOr | Eq | Ne | Lt | Le | Gt | Ge => unreachable!(),
    };
    // Integer results wrap to u8 and become 0/1 bools (bool + bool is true, not 2).
    if float {
        r
    } else {
        normalize(f, r, dst)
    }
}

/// Integer remainder, fmod, floor and trunc division: a divisor of 0 gives 0 and one of -1 is
/// replaced by 1 (fixing up the quotient) so `MIN / -1` wraps, like the CPU backend.
fn int_division(f: &mut Func, op: BinaryOp, x: &Val, y: &Val) -> Val {
    let zero = isplat(f, 0, y);
    let one = isplat(f, 1, y);
    let m1 = isplat(f, -1, y);
    let by_zero = f.compare("EQ", y, &zero);
    let by_m1 = f.compare("EQ", y, &m1);
    let bad = f.ew("or", &[&by_zero, &by_m1]);
    let d = f.select(&bad, &one, y);
    let r = f.ew("remainder", &[x, &d]);
    match op {
        BinaryOp::Fmod => r,
        BinaryOp::Remainder => remainder_fix(f, &r, y),
        _ => {
            let mut q = f.ew("divide", &[x, &d]);
            if op == BinaryOp::FloorDivide {
                let fix = off_sign(f, &r, y);
                let down = f.ew("subtract", &[&q, &one]);
                q = f.select(&fix, &down, &q);
            }
            let neg = f.ew("negate", &[x]);
            let q = f.select(&by_m1, &neg, &q);
            f.select(&by_zero, &zero, &q)
        }
    }
}

/// A value rounded to `src` when that is f16 or bf16: PyTorch rounds each step of a division
/// of two such tensors to their dtype.
fn round_steps(f: &mut Func, v: Val, src: DType) -> Val {
    if matches!(src, DType::F16 | DType::BF16) {
        cast(f, &v, DType::F32, src)
    } else {
        v
    }
}

/// PyTorch's float floor division (`div_floor_floating_vec`), step for step; see the CPU
/// backend's `jit_calls::floor_divide`.
fn floor_divide(f: &mut Func, x: &Val, y: &Val, src: DType) -> Val {
    let basic = f.ew("divide", &[x, y]);
    let basic = round_steps(f, basic, src);
    let m = f.ew("remainder", &[x, y]);
    let inf = splat(f, f64::INFINITY, x);
    let ab = f.ew("abs", &[&basic]);
    let ax = f.ew("abs", &[x]);
    let q_inf = f.compare("EQ", &ab, &inf);
    let x_fin = f.compare("NE", &ax, &inf);
    let overflow = f.ew("and", &[&q_inf, &x_fin]);
    let xm = f.ew("subtract", &[x, &m]);
    let xm = round_steps(f, xm, src);
    let whole = f.select(&overflow, x, &xm);
    let div = f.ew("divide", &[&whole, y]);
    let div = round_steps(f, div, src);
    let one = splat(f, 1.0, x);
    let fix = off_sign(f, &m, y);
    let dm1 = f.ew("subtract", &[&div, &one]);
    let dm1 = round_steps(f, dm1, src);
    let div = f.select(&fix, &dm1, &div);
    let fl = f.ew("floor", &[&div]);
    let frac = f.ew("subtract", &[&div, &fl]);
    let frac = round_steps(f, frac, src);
    let half = splat(f, 0.5, x);
    let up = f.compare("GT", &frac, &half);
    let fl1 = f.ew("add", &[&fl, &one]);
    let fl1 = round_steps(f, fl1, src);
    let r = f.select(&up, &fl1, &fl);
    // A zero quotient takes the sign of a / b (0 * basic: basic is finite there).
    let zero = splat(f, 0.0, x);
    let signed_zero = f.ew("multiply", &[&zero, &basic]);
    let is_zero = f.compare("EQ", &div, &zero);
    let r = f.select(&is_zero, &signed_zero, &r);
    let by_zero = f.compare("EQ", y, &zero);
    f.select(&by_zero, &basic, &r)
}

/// A non-zero `r` whose sign differs from `y`'s (as an i1 predicate).
fn off_sign(f: &mut Func, r: &Val, y: &Val) -> Val {
    let z = splat(f, 0.0, r);
    let nz = f.compare("NE", r, &z);
    let rn = f.compare("LT", r, &z);
    let yn = f.compare("LT", y, &z);
    let diff = f.ew("xor", &[&rn, &yn]);
    f.ew("and", &[&nz, &diff])
}
