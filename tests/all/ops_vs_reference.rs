//! Elementwise ops against the reference interpreter, in strict, debug and defer mode.
//!
//! Every case runs on one runtime per mode; the three results must be identical bytes, and the
//! strict result must match `reference` within the case's tolerance (see `harness::Tol`):
//! * `EXACT` for integer/bool results and for ops rounded once from exact inputs (add, sub, mul,
//!   div, neg, abs, floor, ceil, round, trunc, sqrt, reciprocal, relu, sign, maximum, minimum,
//!   remainder, fmod, floor and trunc division, comparisons, bitwise ops, casts) in every float
//!   dtype: f16/bf16 compute in f32, and rounding an f32-rounded +,-,*,/,sqrt to f16/bf16 equals
//!   rounding the exact value (24 >= 2p + 2);
//! * `F32_TRANSCENDENTAL` (rel 2e-6 + abs 1e-6) for f32 exp, log, log2, log10, log1p, expm1,
//!   rsqrt, sin, cos, tanh, sigmoid, erf, gelu, gelu_tanh, silu, pow, atan2, sinh, cosh, tan,
//!   asin, acos, atan, asinh, acosh and atanh;
//! * `F64_TRANSCENDENTAL` (rel 1e-13 + abs 1e-14) for those in f64;
//! * `F16_TOL` (rel 1e-3) and `BF16_TOL` (rel 8e-3): one ulp of the storage type, for those in
//!   f16/bf16 and for casts that round twice (f64/int -> f32 -> f16/bf16).

use crate::harness;
use crate::reference;

use deferfuse::{BinaryOp, DType, Op, Scalar, UnaryOp};
use harness::*;
use reference::{check, unary_is_exact, Arg, RefTensor};

const SHAPES: [&[usize]; 7] = [&[1], &[3], &[4], &[7], &[33], &[1000], &[5, 7]];

/// Binary ops whose float result is not the exact result rounded once (the others are: floor
/// and trunc division round each step as PyTorch does, and the reference does the same).
fn binary_is_exact(op: BinaryOp) -> bool {
    !matches!(op, BinaryOp::Pow | BinaryOp::Atan2)
}

fn result_tol(op: &Op, args: &[Arg], exact: bool) -> Tol {
    let dtype = check(op, args).expect("valid").dtype;
    float_tol(dtype, exact)
}

#[test]
fn reference_interpreter_self_check() {
    // Known erf values (Abramowitz & Stegun) and identities the reference relies on.
    for (x, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.0, 0.999_977_909_503_001_4),
        (-1.5, -0.966_105_146_475_310_7),
    ] {
        let got = reference::erf(x);
        assert!((got - want).abs() < 1e-15, "erf({x}) = {got}, want {want}");
    }
    assert_eq!(reference::int_pow(3, 4), 81);
    assert_eq!(reference::int_pow(-1, -3), -1);
    assert_eq!(reference::int_pow(2, -1), 0);
    assert_eq!(reference::int_pow(2, 64), 0);
    assert_eq!(reference::cast_value(-1.5, DType::F32, DType::U8), 255.0);
    assert_eq!(reference::cast_value(300.0, DType::I32, DType::U8), 44.0);
    assert_eq!(
        reference::cast_value(3e9, DType::F64, DType::I32),
        i32::MAX as f64
    );
    assert_eq!(reference::cast_value(f64::NAN, DType::F32, DType::I64), 0.0);
    assert_eq!(
        reference::cast_value(f64::NAN, DType::F32, DType::Bool),
        1.0
    );
    assert_eq!(
        reference::binary_value(BinaryOp::Remainder, -7.0, 3.0, DType::I32),
        2.0
    );
    assert_eq!(
        reference::binary_value(BinaryOp::Remainder, 7.0, -3.0, DType::F32),
        -2.0
    );
    assert_eq!(
        reference::binary_value(BinaryOp::Remainder, 7.0, 0.0, DType::I64),
        0.0
    );
    let t = RefTensor::new(
        DType::BF16,
        &[2],
        vec![1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0],
    );
    assert_eq!(t.data, vec![1.0, 1.0 + 1.0 / 64.0]);
}

#[test]
fn unary_ops_match_reference_in_every_mode() {
    let mut rng = Rng::new(1);
    let mut cases = Vec::new();
    for dtype in DType::ALL {
        for (si, shape) in SHAPES.iter().enumerate() {
            let x = rng.tensor(dtype, shape, 6.0, 20, true);
            let place = PLACES[si % 3];
            for op in UnaryOp::ALL {
                let o = Op::Unary(op);
                if check(&o, &[Arg::T(&x)]).is_err() {
                    continue;
                }
                let tol = result_tol(&o, &[Arg::T(&x)], unary_is_exact(op));
                let name = format!("{}({dtype}{shape:?} {place:?})", op.name());
                cases.push(Case::new(name, o, vec![In::T(x.clone(), place)], tol));
            }
        }
    }
    assert!(cases.len() > 800, "{} cases", cases.len());
    assert_no_failures(&run_cases(&cases));
}

#[test]
fn f32_transcendentals_are_accurate_across_their_range() {
    // Normal-range arguments up to where each result is still finite and normal.
    let vals: Vec<f64> = vec![
        0.0, -0.0, 1.0, -1.0, 0.5, 0.624, 0.626, 0.999, 1.001, 2.499, 2.5, 3.999, 4.0, 7.5, -7.5,
        20.0, -20.0, 80.0, 88.0, -80.0, -87.0, 1e-30, -1e-30, 1e-5, 1.5e-38, 3.0e38, 1e30,
    ];
    let x = RefTensor::new(DType::F32, &[vals.len()], vals);
    let mut cases = Vec::new();
    for op in UnaryOp::ALL.into_iter().filter(|&o| !unary_is_exact(o)) {
        let name = format!("{}(edge values)", op.name());
        let c = Case::new(
            name,
            Op::Unary(op),
            vec![In::T(x.clone(), Place::Contig)],
            F32_TRANSCENDENTAL,
        );
        cases.push(c);
    }
    assert_no_failures(&run_cases(&cases));
}

#[test]
fn f32_exp_near_overflow_is_finite() {
    let vals = vec![88.3, 88.4, 88.5, 88.7, 88.72];
    let x = RefTensor::new(DType::F32, &[vals.len()], vals);
    let cases = [Case::new(
        "exp(near overflow)",
        Op::Unary(UnaryOp::Exp),
        vec![In::T(x, Place::Contig)],
        F32_TRANSCENDENTAL,
    )];
    assert_no_failures(&run_cases(&cases));
}

/// Dtype pairs: every dtype with itself, plus pairs that exercise promotion.
const PAIRS: [(DType, DType); 18] = [
    (DType::F32, DType::F32),
    (DType::F64, DType::F64),
    (DType::F16, DType::F16),
    (DType::BF16, DType::BF16),
    (DType::I32, DType::I32),
    (DType::I64, DType::I64),
    (DType::U8, DType::U8),
    (DType::Bool, DType::Bool),
    (DType::I32, DType::F32),
    (DType::U8, DType::I64),
    (DType::Bool, DType::F16),
    (DType::F16, DType::BF16),
    (DType::I64, DType::F64),
    (DType::Bool, DType::U8),
    (DType::F32, DType::F64),
    (DType::BF16, DType::I32),
    (DType::U8, DType::I32),
    (DType::I32, DType::Bool),
];

#[test]
fn binary_ops_with_broadcasting_match_reference() {
    let shapes: [(&[usize], &[usize]); 9] = [
        (&[7], &[7]),
        (&[1000], &[1000]),
        (&[3, 1], &[1, 4]),
        (&[33], &[]),
        (&[], &[5]),
        (&[2, 3, 5], &[5]),
        (&[4, 1, 3], &[2, 1]),
        (&[5, 7], &[5, 7]),
        (&[6, 4], &[4]),
    ];
    let mut rng = Rng::new(2);
    let mut cases = Vec::new();
    for (da, db) in PAIRS {
        for (si, (sa, sb)) in shapes.iter().enumerate() {
            let a = rng.tensor(da, sa, 10.0, 9, true);
            let b = rng.tensor(db, sb, 10.0, 9, true);
            let (pa, pb) = (PLACES[si % 3], PLACES[(si + 1) % 3]);
            for op in BinaryOp::ALL {
                let o = Op::Binary(op);
                let args = [Arg::T(&a), Arg::T(&b)];
                if check(&o, &args).is_err() {
                    continue;
                }
                let tol = result_tol(&o, &args, binary_is_exact(op));
                let name = format!("{}({da}{sa:?} {pa:?}, {db}{sb:?} {pb:?})", op.name());
                let ins = vec![In::T(a.clone(), pa), In::T(b.clone(), pb)];
                cases.push(Case::new(name, o, ins, tol));
            }
        }
    }
    assert!(cases.len() > 2000, "{} cases", cases.len());
    assert_no_failures(&run_cases(&cases));
}

#[test]
fn binary_ops_with_scalar_operands_match_reference() {
    let scalars = [
        Scalar::Float(2.5),
        Scalar::Float(-0.75),
        Scalar::Int(3),
        Scalar::Int(-2),
        Scalar::Bool(true),
    ];
    let mut rng = Rng::new(3);
    let mut cases = Vec::new();
    for dtype in DType::ALL {
        let x = rng.tensor(dtype, &[33], 10.0, 9, true);
        for s in scalars {
            // uint8 with a negative Python int is out of its range (PyTorch rejects or wraps).
            if dtype == DType::U8 && s == Scalar::Int(-2) {
                continue;
            }
            for op in BinaryOp::ALL {
                for scalar_first in [false, true] {
                    let o = Op::Binary(op);
                    let (ins, args) = if scalar_first {
                        (
                            vec![In::S(s), In::T(x.clone(), Place::Strided)],
                            [Arg::S(s), Arg::T(&x)],
                        )
                    } else {
                        (
                            vec![In::T(x.clone(), Place::Strided), In::S(s)],
                            [Arg::T(&x), Arg::S(s)],
                        )
                    };
                    if check(&o, &args).is_err() {
                        continue;
                    }
                    let tol = result_tol(&o, &args, binary_is_exact(op));
                    let name = format!(
                        "{}({dtype}, {s:?}, scalar first: {scalar_first})",
                        op.name()
                    );
                    cases.push(Case::new(name, o, ins, tol));
                }
            }
        }
    }
    // Zero-dim tensors rank between dimensioned tensors and Python scalars.
    let zero_dim = [
        (DType::F64, DType::F32),
        (DType::I64, DType::I32),
        (DType::F32, DType::I32),
        (DType::F16, DType::U8),
        (DType::I32, DType::F16),
    ];
    for (zd, td) in zero_dim {
        let z = rng.tensor(zd, &[], 4.0, 5, false);
        let t = rng.tensor(td, &[4, 3], 4.0, 5, false);
        for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Lt] {
            let o = Op::Binary(op);
            let name = format!("{}(0-dim {zd}, {td}[4, 3])", op.name());
            let ins = vec![
                In::T(z.clone(), Place::Contig),
                In::T(t.clone(), Place::Transposed),
            ];
            cases.push(Case::new(name, o, ins, EXACT));
        }
    }
    assert_no_failures(&run_cases(&cases));
}

fn cast_inputs(dtype: DType) -> Vec<f64> {
    let floats = vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.5,
        -1.0,
        255.9,
        256.5,
        300.7,
        -300.7,
        65504.0,
        65519.0,
        65520.0,
        1e-8,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        1.0 + 1.0 / 2048.0,
        3e9,
        -3e9,
        1e20,
        -1e20,
    ];
    // XLA's CPU runtime flushes subnormals to zero (FTZ/DAZ), so on the pjrt backend a
    // subnormal input is 0; the CPU backend keeps the exact subnormal case.
    let floats = if harness::on_pjrt() {
        floats
    } else {
        [floats, vec![1e-40]].concat()
    };
    let ints32 = vec![
        -1.0,
        0.0,
        1.0,
        127.0,
        128.0,
        255.0,
        256.0,
        300.0,
        -300.0,
        65520.0,
        16_777_217.0,
        i32::MAX as f64,
        i32::MIN as f64,
    ];
    match dtype {
        DType::Bool => vec![0.0, 1.0],
        DType::U8 => vec![0.0, 1.0, 127.0, 128.0, 200.0, 255.0],
        DType::I32 => ints32,
        DType::I64 => {
            let mut v = ints32;
            v.extend([
                (1u64 << 40) as f64 + 7.0,
                -((1u64 << 40) as f64) - 7.0,
                (1u64 << 53) as f64,
                i32::MAX as f64 + 1.0,
            ]);
            v
        }
        _ => floats,
    }
}

#[test]
fn casts_between_every_dtype_pair_match_reference() {
    let mut cases = Vec::new();
    for from in DType::ALL {
        let vals = cast_inputs(from);
        let x = RefTensor::new(from, &[vals.len()], vals);
        for to in DType::ALL {
            // f64 and integers reach f16/bf16 through f32, rounding twice.
            let twice = matches!(to, DType::F16 | DType::BF16)
                && matches!(from, DType::F64 | DType::I32 | DType::I64);
            let tol = float_tol(to, !twice);
            for place in [Place::Contig, Place::Strided] {
                let name = format!("{from} -> {to} ({place:?})");
                let ins = vec![In::T(x.clone(), place)];
                cases.push(Case::new(name, Op::Cast(to), ins, tol));
            }
        }
        cases.push(Case::new(
            format!("copy {from}"),
            Op::Copy,
            vec![In::T(x.clone(), Place::Strided)],
            EXACT,
        ));
    }
    assert_no_failures(&run_cases(&cases));
}

#[test]
fn where_and_clamp_match_reference() {
    let mut rng = Rng::new(4);
    let cond = rng.tensor(DType::Bool, &[4, 5], 0.0, 0, false);
    let cond_row = rng.tensor(DType::Bool, &[5], 0.0, 0, false);
    let f = |rng: &mut Rng, d: DType, s: &[usize]| rng.tensor(d, s, 8.0, 9, true);
    let t = |x: &RefTensor, p: Place| In::T(x.clone(), p);
    let (a45, b5) = (
        f(&mut rng, DType::F32, &[4, 5]),
        f(&mut rng, DType::F32, &[5]),
    );
    let (i15, f41) = (
        f(&mut rng, DType::I32, &[1, 5]),
        f(&mut rng, DType::F32, &[4, 1]),
    );
    let h45 = f(&mut rng, DType::F16, &[4, 5]);
    let u45 = f(&mut rng, DType::U8, &[4, 5]);
    let bo45 = f(&mut rng, DType::Bool, &[4, 5]);
    let i45 = f(&mut rng, DType::I32, &[4, 5]);
    let i64_45 = f(&mut rng, DType::I64, &[4, 5]);
    let x1000 = f(&mut rng, DType::F32, &[1000]);
    let (lo5, hi5) = (
        f(&mut rng, DType::F32, &[5]),
        f(&mut rng, DType::F32, &[1, 5]),
    );
    let (ilo, ihi) = (
        f(&mut rng, DType::I32, &[5]),
        f(&mut rng, DType::I32, &[4, 1]),
    );
    let (c, w) = (Place::Contig, Op::Where);
    let (s, tr) = (Place::Strided, Place::Transposed);
    let sf = |v: f64| In::S(Scalar::Float(v));
    let si = |v: i64| In::S(Scalar::Int(v));
    let cases = vec![
        Case::new(
            "where f32/f32[5]",
            w.clone(),
            vec![t(&cond, tr), t(&a45, s), t(&b5, c)],
            EXACT,
        ),
        Case::new(
            "where i32/f32",
            w.clone(),
            vec![t(&cond, c), t(&i15, c), t(&f41, s)],
            EXACT,
        ),
        Case::new(
            "where 1.5/f16",
            w.clone(),
            vec![t(&cond, s), sf(1.5), t(&h45, tr)],
            EXACT,
        ),
        Case::new(
            "where ints",
            w.clone(),
            vec![t(&cond_row, s), si(7), si(-3)],
            EXACT,
        ),
        Case::new(
            "where u8/bool",
            w.clone(),
            vec![t(&cond, c), t(&u45, s), t(&bo45, tr)],
            EXACT,
        ),
        Case::new(
            "where row cond",
            w.clone(),
            vec![t(&cond_row, c), t(&a45, tr), sf(-0.5)],
            EXACT,
        ),
        Case::new(
            "clamp -1..1",
            Op::Clamp,
            vec![t(&a45, tr), sf(-1.0), sf(1.0)],
            EXACT,
        ),
        Case::new(
            "clamp max",
            Op::Clamp,
            vec![t(&x1000, c), In::Absent, sf(0.5)],
            EXACT,
        ),
        Case::new(
            "clamp min t",
            Op::Clamp,
            vec![t(&a45, c), t(&lo5, s), In::Absent],
            EXACT,
        ),
        Case::new(
            "clamp t t",
            Op::Clamp,
            vec![t(&a45, s), t(&lo5, c), t(&hi5, tr)],
            EXACT,
        ),
        Case::new(
            "clamp i32",
            Op::Clamp,
            vec![t(&i45, s), si(-3), si(4)],
            EXACT,
        ),
        Case::new(
            "clamp i32 f",
            Op::Clamp,
            vec![t(&i45, c), sf(-2.5), sf(2.5)],
            EXACT,
        ),
        Case::new(
            "clamp f16",
            Op::Clamp,
            vec![t(&h45, s), sf(-1.0), sf(1.0)],
            EXACT,
        ),
        Case::new(
            "clamp min>max",
            Op::Clamp,
            vec![t(&a45, c), sf(2.0), sf(-2.0)],
            EXACT,
        ),
        Case::new(
            "clamp u8",
            Op::Clamp,
            vec![t(&u45, tr), si(10), si(200)],
            EXACT,
        ),
        Case::new(
            "clamp i64 t",
            Op::Clamp,
            vec![t(&i64_45, c), t(&ilo, s), t(&ihi, c)],
            EXACT,
        ),
    ];
    assert!(cases.iter().all(Case::is_valid));
    assert_no_failures(&run_cases(&cases));
}
