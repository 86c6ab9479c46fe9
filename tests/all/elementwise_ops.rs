//! The bitwise ops, the division family (fmod, floor and trunc division), atan2, trunc, log2,
//! log10 and the hyperbolic and inverse trigonometric functions on values PyTorch was run on: the expected numbers below are PyTorch 2.x CPU
//! results (integer division by zero excepted: PyTorch raises, the runtime gives 0). Every
//! program runs in strict, debug and defer mode, which must agree bit for bit; the random-value
//! sweeps against the reference interpreter are in `ops_vs_reference.rs`.

use crate::harness;
use crate::reference;

use deferfuse::{BinaryOp, DType, Handle, Runtime, Scalar, UnaryOp};
use harness::*;

/// `name`'s values from [`run_in_every_mode`]'s outputs.
fn values(outs: &[(String, reference::RefTensor)], name: &str) -> Vec<f64> {
    let (_, t) = outs.iter().find(|(n, _)| n == name).expect(name);
    t.data.clone()
}

/// The dtype of output `name`.
fn dtype_of(outs: &[(String, reference::RefTensor)], name: &str) -> DType {
    outs.iter().find(|(n, _)| n == name).expect(name).1.dtype
}

/// Asserts equal values bit for bit (so -0.0 differs from 0.0 and NaN equals NaN).
fn assert_bits(what: &str, got: &[f64], want: &[f64]) {
    let bits = |v: &[f64]| -> Vec<u64> {
        v.iter()
            .map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() })
            .collect()
    };
    assert_eq!(bits(got), bits(want), "{what}: got {got:?}, want {want:?}");
}

/// `op(x, y)` on two 1-D tensors of `dtype`, in every mode.
fn binary_of(op: BinaryOp, dtype: DType, x: &[f64], y: &[f64]) -> (DType, Vec<f64>) {
    let outs = run_in_every_mode(|rt| {
        let a = tensor(rt, dtype, &[x.len()], x);
        let b = tensor(rt, dtype, &[y.len()], y);
        vec![("r".into(), bin(rt, op, tt(a), tt(b)))]
    });
    (dtype_of(&outs, "r"), values(&outs, "r"))
}

/// `op(x, s)` on a 1-D tensor of `dtype` and a Python scalar, in every mode.
fn binary_scalar_of(op: BinaryOp, dtype: DType, x: &[f64], s: Scalar) -> Vec<f64> {
    let outs = run_in_every_mode(|rt| {
        let a = tensor(rt, dtype, &[x.len()], x);
        let s = deferfuse::Input::Scalar(s);
        vec![("r".into(), run(rt, deferfuse::Op::Binary(op), &[tt(a), s]))]
    });
    values(&outs, "r")
}

/// `op(x)` on a 1-D tensor of `dtype`, in every mode.
fn unary_of(op: UnaryOp, dtype: DType, x: &[f64]) -> (DType, Vec<f64>) {
    let outs = run_in_every_mode(|rt| {
        let a = tensor(rt, dtype, &[x.len()], x);
        vec![("r".into(), un(rt, op, a))]
    });
    (dtype_of(&outs, "r"), values(&outs, "r"))
}

const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

/// Float dividends and divisors with signs, zeros, infinities, NaN and a huge quotient.
const DIVIDENDS: [f64; 17] = [
    -7.5, 7.5, -7.5, 7.5, 1e30, -0.0, 0.0, INF, 5.0, 5.0, 1e-30, -1e-30, 0.3, 1.0, -1.0, 7.0, NAN,
];
const DIVISORS: [f64; 17] = [
    2.0, -2.0, -2.0, 2.0, 7.0, 3.0, -3.0, 2.0, INF, -INF, 1e-30, 3.0, 0.1, 0.0, 0.0, -0.0, 1.0,
];

#[test]
fn float32_floor_divide_matches_pytorch_on_signs_zeros_and_infinities() {
    let (d, got) = binary_of(BinaryOp::FloorDivide, DType::F32, &DIVIDENDS, &DIVISORS);
    assert_eq!(d, DType::F32);
    let q = 1e30f32 / 7.0;
    let want = [
        -4.0,
        -4.0,
        3.0,
        3.0,
        q.floor() as f64,
        -0.0,
        -0.0,
        NAN,
        0.0,
        -1.0,
        1.0,
        -1.0,
        3.0,
        INF,
        -INF,
        -INF,
        NAN,
    ];
    assert_bits("floor_divide", &got, &want);
}

#[test]
fn float64_floor_divide_matches_pytorch_on_signs_zeros_and_infinities() {
    let (_, got) = binary_of(BinaryOp::FloorDivide, DType::F64, &DIVIDENDS, &DIVISORS);
    let want = [
        -4.0,
        -4.0,
        3.0,
        3.0,
        1e30 / 7.0,
        -0.0,
        -0.0,
        NAN,
        0.0,
        -1.0,
        1.0,
        -1.0,
        2.0,
        INF,
        -INF,
        -INF,
        NAN,
    ];
    // 0.3 // 0.1 is 2 in f64 (0.1 is slightly more than a tenth), 3 in f32.
    assert_bits("floor_divide", &got, &want);
}

#[test]
fn float_trunc_divide_rounds_toward_zero() {
    let (_, got) = binary_of(BinaryOp::TruncDivide, DType::F32, &DIVIDENDS, &DIVISORS);
    let q = (1e30f32 / 7.0).trunc() as f64;
    let want = [
        -3.0, -3.0, 3.0, 3.0, q, -0.0, -0.0, INF, 0.0, -0.0, 1.0, -0.0, 3.0, INF, -INF, -INF, NAN,
    ];
    assert_bits("div_trunc", &got, &want);
}

#[test]
fn float_fmod_takes_the_dividends_sign() {
    let (_, got) = binary_of(BinaryOp::Fmod, DType::F32, &DIVIDENDS, &DIVISORS);
    let small = (0.3f32 % 0.1f32) as f64;
    let want = [
        -1.5,
        1.5,
        -1.5,
        1.5,
        1.0,
        -0.0,
        0.0,
        NAN,
        5.0,
        5.0,
        0.0,
        -1e-30f32 as f64,
        small,
        NAN,
        NAN,
        NAN,
        NAN,
    ];
    assert_bits("fmod", &got, &want);
}

#[test]
fn integer_division_family_rounds_like_pytorch() {
    let x = [-7.0, 7.0, -7.0, 7.0, 0.0, i32::MAX as f64, -1.0];
    let y = [2.0, -2.0, -2.0, 2.0, 3.0, 2.0, 3.0];
    for d in [DType::I32, DType::I64] {
        let (dt, floor) = binary_of(BinaryOp::FloorDivide, d, &x, &y);
        assert_eq!(dt, d);
        assert_eq!(
            floor,
            [-4.0, -4.0, 3.0, 3.0, 0.0, 1_073_741_823.0, -1.0],
            "{d}"
        );
        let (_, trunc) = binary_of(BinaryOp::TruncDivide, d, &x, &y);
        assert_eq!(
            trunc,
            [-3.0, -3.0, 3.0, 3.0, 0.0, 1_073_741_823.0, 0.0],
            "{d}"
        );
        let (_, fmod) = binary_of(BinaryOp::Fmod, d, &x, &y);
        assert_eq!(fmod, [-1.0, 1.0, -1.0, 1.0, 0.0, 1.0, -1.0], "{d}");
    }
}

#[test]
fn integer_division_by_zero_gives_zero() {
    let x = [7.0, -7.0, 0.0, 255.0];
    let zeros = [0.0; 4];
    for d in [DType::U8, DType::I32, DType::I64] {
        for op in [
            BinaryOp::FloorDivide,
            BinaryOp::TruncDivide,
            BinaryOp::Fmod,
            BinaryOp::Remainder,
        ] {
            let (_, got) = binary_of(op, d, &x, &zeros);
            assert_eq!(got, [0.0; 4], "{}({d})", op.name());
        }
    }
}

#[test]
fn integer_division_of_the_minimum_by_minus_one_wraps() {
    for (d, min) in [(DType::I32, i32::MIN as f64), (DType::I64, i64::MIN as f64)] {
        let x = [min, min, 6.0];
        let y = [-1.0, 1.0, -1.0];
        let (_, floor) = binary_of(BinaryOp::FloorDivide, d, &x, &y);
        assert_eq!(floor, [min, min, -6.0], "{d}");
        let (_, trunc) = binary_of(BinaryOp::TruncDivide, d, &x, &y);
        assert_eq!(trunc, [min, min, -6.0], "{d}");
        let (_, fmod) = binary_of(BinaryOp::Fmod, d, &x, &y);
        assert_eq!(fmod, [0.0, 0.0, 0.0], "{d}");
    }
}

#[test]
fn uint8_division_by_a_negative_scalar_divides_by_its_wrapped_value() {
    // -3 becomes 253 in uint8, as in PyTorch.
    let x = [7.0, 200.0, 255.0, 0.0];
    let floor = binary_scalar_of(BinaryOp::FloorDivide, DType::U8, &x, Scalar::Int(-3));
    assert_eq!(floor, [0.0, 0.0, 1.0, 0.0]);
    let fmod = binary_scalar_of(BinaryOp::Fmod, DType::U8, &x, Scalar::Int(-3));
    assert_eq!(fmod, [7.0, 200.0, 2.0, 0.0]);
}

#[test]
fn half_tensors_divide_rounding_each_step_to_their_dtype() {
    // PyTorch rounds every step of an f16/bf16 tensor-by-tensor division to the dtype: these
    // quotients differ from the float32 quotient rounded once.
    // (op, dtype, dividends, divisors, PyTorch's quotients)
    type Case = (BinaryOp, DType, [f64; 3], [f64; 3], [f64; 3]);
    let cases: [Case; 4] = [
        (
            BinaryOp::FloorDivide,
            DType::F16,
            [-4792.0, 2794.0, 1378.0],
            [0.590_332_031_25, 0.922_363_281_25, 1.646_484_375],
            [-8116.0, 3030.0, 835.0],
        ),
        (
            BinaryOp::TruncDivide,
            DType::F16,
            [1080.0, -860.5, 784.5],
            [2.421_875, 1.523_437_5, 1.111_328_125],
            [446.0, -565.0, 706.0],
        ),
        (
            BinaryOp::FloorDivide,
            DType::BF16,
            [-3872.0, 2512.0, -4672.0],
            [1.304_687_5, 2.031_25, 0.546_875],
            [-2960.0, 1240.0, -8512.0],
        ),
        (
            BinaryOp::TruncDivide,
            DType::BF16,
            [-2320.0, 2512.0, -1020.0],
            [1.046_875, 2.031_25, 1.476_562_5],
            [-2224.0, 1240.0, -692.0],
        ),
    ];
    for (op, d, x, y, want) in cases {
        let (dt, got) = binary_of(op, d, &x, &y);
        assert_eq!(dt, d);
        assert_eq!(got, want, "{}({d})", op.name());
    }
}

#[test]
fn half_tensors_divided_by_one_element_compute_in_float32() {
    // A Python scalar, a 0-dim or a one-element divisor: PyTorch divides in float32 and rounds
    // once.
    let cases = [
        (
            BinaryOp::FloorDivide,
            DType::F16,
            -4792.0,
            0.590_332_031_25,
            -8120.0,
        ),
        (BinaryOp::TruncDivide, DType::F16, 1080.0, 2.421_875, 445.0),
        (
            BinaryOp::FloorDivide,
            DType::BF16,
            -3872.0,
            1.304_687_5,
            -2976.0,
        ),
        (
            BinaryOp::TruncDivide,
            DType::BF16,
            -2320.0,
            1.046_875,
            -2208.0,
        ),
    ];
    for (op, d, x, y, want) in cases {
        let got = binary_scalar_of(op, d, &[x], Scalar::Float(y));
        assert_eq!(got, [want], "{}({d}) by a scalar", op.name());
        let outs = run_in_every_mode(|rt| {
            let a = tensor(rt, d, &[2], &[x, x]);
            let zero_dim = tensor(rt, d, &[], &[y]);
            let one = tensor(rt, d, &[1], &[y]);
            vec![
                ("0-dim".into(), bin(rt, op, tt(a), tt(zero_dim))),
                ("[1]".into(), bin(rt, op, tt(a), tt(one))),
            ]
        });
        assert_eq!(values(&outs, "0-dim"), [want, want], "{}({d})", op.name());
        assert_eq!(values(&outs, "[1]"), [want, want], "{}({d})", op.name());
    }
}

#[test]
fn bitwise_not_is_logical_not_on_bool_and_ones_complement_on_integers() {
    assert_eq!(
        unary_of(UnaryOp::BitwiseNot, DType::Bool, &[1.0, 0.0]),
        (DType::Bool, vec![0.0, 1.0])
    );
    assert_eq!(
        unary_of(UnaryOp::BitwiseNot, DType::U8, &[7.0, 200.0, 255.0, 0.0]).1,
        [248.0, 55.0, 0.0, 255.0]
    );
    let (max, min) = (i32::MAX as f64, i32::MIN as f64);
    assert_eq!(
        unary_of(UnaryOp::BitwiseNot, DType::I32, &[0.0, -1.0, max, min]).1,
        [-1.0, 0.0, min, max]
    );
    let outs = run_in_every_mode_raw(|rt| {
        let bytes: Vec<u8> = [0i64, i64::MIN, 1 << 40]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let x = rt.from_host(&bytes, DType::I64, &[3]).unwrap();
        vec![("r".into(), un(rt, UnaryOp::BitwiseNot, x))]
    });
    assert_eq!(i64s(&outs[0].1), [-1, i64::MAX, !(1i64 << 40)]);
}

#[test]
fn bitwise_and_or_xor_promote_like_integer_arithmetic() {
    let outs = run_in_every_mode(|rt: &Runtime| -> Vec<(String, Handle)> {
        let u = tensor(rt, DType::U8, &[4], &[7.0, 200.0, 255.0, 0.0]);
        let i = tensor(rt, DType::I32, &[4], &[256.0, 1.0, -1.0, 8.0]);
        let b = tensor(rt, DType::Bool, &[2], &[1.0, 0.0]);
        let bi = tensor(rt, DType::I64, &[2], &[3.0, 2.0]);
        let s = |v| deferfuse::Input::Scalar(Scalar::Int(v));
        vec![
            (
                "u8 | i32".into(),
                bin(rt, BinaryOp::BitwiseOr, tt(u), tt(i)),
            ),
            (
                "u8 & -1".into(),
                bin(rt, BinaryOp::BitwiseAnd, tt(u), s(-1)),
            ),
            (
                "bool ^ true".into(),
                bin(
                    rt,
                    BinaryOp::BitwiseXor,
                    tt(b),
                    deferfuse::Input::Scalar(Scalar::Bool(true)),
                ),
            ),
            (
                "bool & i64".into(),
                bin(rt, BinaryOp::BitwiseAnd, tt(b), tt(bi)),
            ),
            (
                "i32 ^ u8".into(),
                bin(rt, BinaryOp::BitwiseXor, tt(i), tt(u)),
            ),
        ]
    });
    assert_eq!(dtype_of(&outs, "u8 | i32"), DType::I32);
    assert_eq!(values(&outs, "u8 | i32"), [263.0, 201.0, -1.0, 8.0]);
    assert_eq!(dtype_of(&outs, "u8 & -1"), DType::U8);
    assert_eq!(values(&outs, "u8 & -1"), [7.0, 200.0, 255.0, 0.0]);
    assert_eq!(dtype_of(&outs, "bool ^ true"), DType::Bool);
    assert_eq!(values(&outs, "bool ^ true"), [0.0, 1.0]);
    assert_eq!(dtype_of(&outs, "bool & i64"), DType::I64);
    assert_eq!(values(&outs, "bool & i64"), [1.0, 0.0]);
    assert_eq!(values(&outs, "i32 ^ u8"), [263.0, 201.0, -256.0, 8.0]);
}

#[test]
fn atan2_of_integers_gives_float32_angles() {
    let (d, got) = binary_of(
        BinaryOp::Atan2,
        DType::I32,
        &[1.0, -1.0, 0.0, 0.0, -3.0],
        &[0.0, 0.0, -1.0, 1.0, 4.0],
    );
    assert_eq!(d, DType::F32);
    let want = [
        std::f32::consts::FRAC_PI_2,
        -std::f32::consts::FRAC_PI_2,
        std::f32::consts::PI,
        0.0,
        (-3f32).atan2(4.0),
    ];
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w as f64).abs() <= 1e-7,
            "atan2: got {got:?}, want {want:?}"
        );
    }
}

#[test]
fn trunc_rounds_toward_zero_and_keeps_integers() {
    let (_, got) = unary_of(
        UnaryOp::Trunc,
        DType::F32,
        &[-2.7, 2.7, -0.5, 0.5, -0.0, INF, NAN],
    );
    assert_bits("trunc", &got, &[-2.0, 2.0, -0.0, 0.0, -0.0, INF, NAN]);
    let (d, ints) = unary_of(UnaryOp::Trunc, DType::I64, &[-7.0, 3.0]);
    assert_eq!((d, ints), (DType::I64, vec![-7.0, 3.0]));
}

#[test]
fn log2_and_log10_are_exact_at_powers_of_their_base() {
    for d in [DType::F32, DType::F64] {
        let (_, l2) = unary_of(UnaryOp::Log2, d, &[8.0, 0.125, 1.0, 0.0, -1.0, 1024.0]);
        assert_bits("log2", &l2, &[3.0, -3.0, 0.0, -INF, NAN, 10.0]);
        let (_, l10) = unary_of(UnaryOp::Log10, d, &[1000.0, 0.001, 1.0, 1e10]);
        assert_bits("log10", &l10, &[3.0, -3.0, 0.0, 10.0]);
    }
    let (d, _) = unary_of(UnaryOp::Log2, DType::I32, &[4.0]);
    assert_eq!(d, DType::F32);
}

/// Inputs of [`trig_matches_pytorch_at_edges`]: signed zero, tiny, inside and on the domain
/// edges +-1, beyond them, large, NaN.
const TRIG_X: [f64; 10] = [-0.0, 1e-20, 0.5, -0.75, 1.0, -1.0, 1.5, 30.0, 100.0, NAN];

#[test]
fn trig_matches_pytorch_at_edges() {
    // PyTorch 2.x CPU float32 results: NaN outside the domains, +-inf for atanh(+-1) and the
    // overflowing sinh/cosh(100), -0 kept where the function is odd; float64 is checked
    // against the reference's definitions at the same points.
    #[rustfmt::skip]
    let want: [(UnaryOp, [f64; 10]); 9] = [
        (UnaryOp::Sinh, [-0.0, 9.999999682655225e-21, 0.5210952758789062, -0.8223167061805725, 1.175201177597046, -1.175201177597046, 2.129279375076294, 5343237111808.0, INF, NAN]),
        (UnaryOp::Cosh, [1.0, 1.0, 1.1276259422302246, 1.2946833372116089, 1.5430805683135986, 1.5430805683135986, 2.352409601211548, 5343237111808.0, INF, NAN]),
        (UnaryOp::Tan, [-0.0, 9.999999682655225e-21, 0.5463024973869324, -0.9315964579582214, 1.5574077367782593, -1.5574077367782593, 14.101419448852539, -6.405331134796143, -0.587213933467865, NAN]),
        (UnaryOp::Asin, [-0.0, 9.999999682655225e-21, 0.5235987901687622, -0.8480620980262756, 1.5707963705062866, -1.5707963705062866, NAN, NAN, NAN, NAN]),
        (UnaryOp::Acos, [1.5707963705062866, 1.5707963705062866, 1.0471975803375244, 2.418858528137207, 0.0, 3.1415927410125732, NAN, NAN, NAN, NAN]),
        (UnaryOp::Atan, [-0.0, 9.999999682655225e-21, 0.46364760398864746, -0.6435011029243469, 0.7853981852531433, -0.7853981852531433, 0.9827936887741089, 1.537475347518921, 1.5607966184616089, NAN]),
        (UnaryOp::Asinh, [-0.0, 9.999999682655225e-21, 0.4812118411064148, -0.6931471824645996, 0.8813735842704773, -0.8813735842704773, 1.19476318359375, 4.0946221351623535, 5.298342227935791, NAN]),
        (UnaryOp::Acosh, [NAN, NAN, NAN, NAN, 0.0, NAN, 0.9624236822128296, 4.094066619873047, 5.29829216003418, NAN]),
        (UnaryOp::Atanh, [-0.0, 9.999999682655225e-21, 0.5493061542510986, -0.9729551076889038, INF, -INF, NAN, NAN, NAN, NAN]),
    ];
    for (op, want) in want {
        let (_, got32) = unary_of(op, DType::F32, &TRIG_X);
        // float64 keeps sinh/cosh(100) finite: its values are the f64 reference's.
        let (_, got64) = unary_of(op, DType::F64, &TRIG_X);
        let want64: Vec<f64> = TRIG_X
            .iter()
            .map(|&x| reference::unary_value(op, x, DType::F64))
            .collect();
        for (d, got, want, rel) in [
            (DType::F32, &got32, &want[..], 2e-6),
            (DType::F64, &got64, &want64[..], 1e-13),
        ] {
            for ((g, w), x) in got.iter().zip(want).zip(TRIG_X) {
                let same = if w.is_finite() && *w != 0.0 {
                    (g - w).abs() <= rel * w.abs()
                } else {
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())
                };
                assert!(same, "{}({x}) in {d}: got {g}, want {w}", op.name());
            }
        }
    }
}

#[test]
fn trig_of_integers_and_bools_gives_float32() {
    for op in [UnaryOp::Sinh, UnaryOp::Atan, UnaryOp::Acosh] {
        for d in [DType::I32, DType::Bool] {
            let (out, got) = unary_of(op, d, &[1.0]);
            assert_eq!(out, DType::F32, "{}({d})", op.name());
            let want = reference::unary_value(op, 1.0, DType::F64);
            assert!((got[0] - want).abs() <= 2e-6 * want.abs().max(1e-30));
        }
    }
}
