//! Numeric corner cases against exact expectations and the reference, in strict, debug and
//! defer mode: integer wrap-around, f16/bf16 rounding on every store, arange and full, and NaN
//! payloads through bf16. Every comparison here is exact.

use crate::harness;

use deferfuse::{BinaryOp, DType, Op, ReduceOp, Scalar, UnaryOp};
use harness::*;

fn i64_tensor(rt: &deferfuse::Runtime, vals: &[i64]) -> deferfuse::Handle {
    let bytes: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
    rt.from_host(&bytes, DType::I64, &[vals.len()]).unwrap()
}

#[test]
fn integer_overflow_wraps() {
    use BinaryOp::*;
    use DType::*;
    let (max32, min32) = (i32::MAX as f64, i32::MIN as f64);
    let outs = run_in_every_mode_raw(|rt| {
        let a = tensor(rt, I32, &[5], &[max32, min32, 65536.0, min32, 7.0]);
        let b = tensor(rt, I32, &[5], &[1.0, -1.0, 65536.0, 1.0, 3.0]);
        let u = tensor(rt, U8, &[4], &[200.0, 0.0, 16.0, 255.0]);
        let v = tensor(rt, U8, &[4], &[100.0, 1.0, 16.0, 1.0]);
        let big = i64_tensor(rt, &[i64::MAX, i64::MIN, (1 << 32) + 7]);
        let two32 = i64_tensor(rt, &[1 << 32, 1 << 32, 3]);
        let e = tensor(rt, I32, &[3], &[2.0, 3.0, 3.0]);
        let p = tensor(rt, I32, &[3], &[31.0, 21.0, 0.0]);
        let (t, s) = (tt, is);
        let sum = red(ReduceOp::Sum, &[], false);
        vec![
            ("i32 add".into(), bin(rt, Add, t(a), t(b))),
            ("i32 sub".into(), bin(rt, Sub, t(a), t(b))),
            ("i32 mul".into(), bin(rt, Mul, t(a), t(a))),
            ("i32 neg".into(), un(rt, UnaryOp::Neg, a)),
            ("i32 abs".into(), un(rt, UnaryOp::Abs, a)),
            ("i32 + 1".into(), bin(rt, Add, t(a), s(1))),
            ("u8 add".into(), bin(rt, Add, t(u), t(v))),
            ("u8 sub".into(), bin(rt, Sub, t(v), t(u))),
            ("u8 mul".into(), bin(rt, Mul, t(u), t(v))),
            ("u8 neg".into(), un(rt, UnaryOp::Neg, v)),
            ("u8 + 100".into(), bin(rt, Add, t(u), s(100))),
            ("i64 + 1".into(), bin(rt, Add, t(big), s(1))),
            ("i64 * 2".into(), bin(rt, Mul, t(big), s(2))),
            ("i32 pow".into(), bin(rt, Pow, t(e), t(p))),
            ("i64 pow".into(), bin(rt, Pow, t(two32), s(40))),
            ("sum i32".into(), run(rt, sum.clone(), &[t(a)])),
            ("sum i64".into(), run(rt, sum, &[t(big)])),
            (
                "prod i64".into(),
                run(rt, red(ReduceOp::Prod, &[], false), &[t(two32)]),
            ),
            ("i64 -> i32".into(), run(rt, Op::Cast(I32), &[t(big)])),
            ("i32 -> u8".into(), run(rt, Op::Cast(U8), &[t(a)])),
        ]
    });
    let get = |name: &str| &outs.iter().find(|(n, _)| n == name).unwrap().1;
    let i32s = |name: &str| -> Vec<i32> {
        let raw = get(name);
        assert_eq!(raw.0, I32, "{name}");
        raw.2
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let u8s = |name: &str| get(name).2.clone();
    let (mx, mn) = (i32::MAX, i32::MIN);
    assert_eq!(i32s("i32 add"), [mn, mx, 131_072, mn + 1, 10]);
    assert_eq!(i32s("i32 sub"), [mx - 1, mn + 1, 0, mx, 4]);
    assert_eq!(i32s("i32 mul"), [1, 0, 0, 0, 49]);
    assert_eq!(i32s("i32 neg"), [-mx, mn, -65536, mn, -7]);
    assert_eq!(i32s("i32 abs"), [mx, mn, 65536, mn, 7]);
    assert_eq!(i32s("i32 + 1"), [mn, mn + 1, 65537, mn + 1, 8]);
    assert_eq!(u8s("u8 add"), [44, 1, 32, 0]);
    assert_eq!(u8s("u8 sub"), [156, 1, 0, 2]);
    assert_eq!(u8s("u8 mul"), [32, 0, 0, 255]);
    assert_eq!(u8s("u8 neg"), [156, 255, 240, 255]);
    assert_eq!(u8s("u8 + 100"), [44, 100, 116, 99]);
    assert_eq!(
        i64s(get("i64 + 1")),
        [i64::MIN, i64::MIN + 1, (1 << 32) + 8]
    );
    assert_eq!(i64s(get("i64 * 2")), [-2, 0, (1 << 33) + 14]);
    assert_eq!(i32s("i32 pow"), [mn, 3i32.wrapping_pow(21), 1]);
    assert_eq!(i64s(get("i64 pow")), [0, 0, 3i64.wrapping_pow(40)]);
    assert_eq!(
        i64s(get("sum i32")),
        [mx as i64 + 2 * mn as i64 + 65536 + 7]
    );
    assert_eq!(i64s(get("sum i64")), [(1 << 32) + 6]);
    assert_eq!(i64s(get("prod i64")), [0]);
    assert_eq!(i32s("i64 -> i32"), [-1, 0, 7]);
    assert_eq!(u8s("i32 -> u8"), [255, 0, 0, 0, 7]);
}

#[test]
fn f16_and_bf16_round_on_store() {
    use BinaryOp::*;
    use DType::*;
    let (t10, t11) = (2f64.powi(-10), 2f64.powi(-11));
    let outs = run_in_every_mode(|rt| {
        // Each op's result is rounded to the storage type before the next op reads it, also
        // when the intermediate's handle is gone and defer keeps it in a register.
        let a = tensor(rt, F16, &[4], &[1024.0, 1024.0, 1.0, 1.0 + t10]);
        let b = tensor(rt, F16, &[4], &[1.5, 2.5, t11, t11]);
        let c = bin(rt, Add, tt(a), tt(b));
        let d = bin(rt, Sub, tt(c), tt(a));
        rt.release(c).unwrap();
        let ba = tensor(rt, BF16, &[3], &[256.0, 1.0, 1.0]);
        let bb = tensor(rt, BF16, &[3], &[1.5, 1.0 / 256.0, 3.0 / 256.0]);
        let bc = bin(rt, Add, tt(ba), tt(bb));
        let bd = bin(rt, Sub, tt(bc), tt(ba));
        let x = tensor(
            rt,
            F32,
            &[6],
            &[65519.0, 65520.0, 1e-8, 3e-8, 0.1, -70000.0],
        );
        let h = run(rt, Op::Cast(F16), &[tt(x)]);
        let hb = run(rt, Op::Cast(BF16), &[tt(x)]);
        // Reductions accumulate in f32 and round once: 1024 + 0.5 + 0.5 = 1025.
        let s = tensor(rt, F16, &[3], &[1024.0, 0.5, 0.5]);
        let sum = run(rt, red(ReduceOp::Sum, &[], false), &[tt(s)]);
        // An f32 result written into an f16 tensor rounds on store.
        let out = tensor(rt, F16, &[2], &[0.0, 0.0]);
        let f = tensor(rt, F32, &[2], &[1.0, 2048.0]);
        let g = tensor(rt, F32, &[2], &[t11, 1.0]);
        rt.op(0, Op::Binary(Add), &[tt(f), tt(g)], Some(out))
            .unwrap();
        // f16 and bf16 promote to f32 exactly.
        let h3 = tensor(rt, F16, &[3], &[1.5, 2.5, t11]);
        let mix = bin(rt, Mul, tt(h3), tt(bb));
        vec![
            ("f16 c - a".into(), d),
            ("bf16 c - a".into(), bd),
            ("bf16 c".into(), bc),
            ("to f16".into(), h),
            ("to bf16".into(), hb),
            ("f16 sum".into(), sum),
            ("f16 out".into(), out),
            ("f16 * bf16".into(), mix),
        ]
    });
    let vals = |name: &str| outs.iter().find(|(n, _)| n == name).unwrap().1.data.clone();
    assert_eq!(vals("f16 c - a"), [2.0, 2.0, 0.0, t10]);
    assert_eq!(vals("bf16 c"), [258.0, 1.0, 1.0 + 1.0 / 64.0]);
    assert_eq!(vals("bf16 c - a"), [2.0, 0.0, 1.0 / 64.0]);
    let h = vals("to f16");
    assert_eq!(h[..2], [65504.0, f64::INFINITY]);
    assert_eq!(h[2], 0.0);
    assert_eq!(h[3], 2f64.powi(-24));
    assert_eq!(h[4], half::f16::from_f64(0.1).to_f64());
    assert_eq!(h[5], f64::NEG_INFINITY);
    let hb = vals("to bf16");
    assert_eq!(hb[0], 65536.0);
    assert_eq!(hb[4], half::bf16::from_f64(0.1).to_f64());
    assert_eq!(vals("f16 sum"), [1025.0]);
    assert_eq!(vals("f16 out"), [1.0, 2048.0]);
    let out = &outs.iter().find(|(n, _)| n == "f16 * bf16").unwrap().1;
    assert_eq!(out.dtype, F32);
    assert_eq!(out.data, [2.25, 2.5 / 256.0, 3.0 * t11 / 256.0]);
}

#[test]
fn arange_and_full_match_reference() {
    use DType::*;
    let (f, i) = (Scalar::Float, Scalar::Int);
    let ranges = [
        (F32, f(0.0), f(10.0), f(3.0)),
        (F32, f(1.0), f(0.0), f(-0.25)),
        (F64, f(0.0), f(1.0), f(0.1)),
        (I32, i(-5), i(5), i(2)),
        (I32, f(0.0), f(5.0), f(1.5)),
        (I64, i(0), i(1000), i(1)),
        (U8, i(250), i(256), i(1)),
        (F16, f(0.0), f(10.0), f(0.5)),
        (BF16, f(-3.0), f(3.0), f(0.7)),
        // A start that f32 rounds to a bf16 tie (1 + 2^-8): CPU's 1.0, not the f64 value's
        // correct rounding 1.0078125.
        (
            BF16,
            f(1.0 + 2f64.powi(-8) + 2f64.powi(-30)),
            f(4.0),
            f(1.0),
        ),
        (
            F16,
            f(1.0 + 2f64.powi(-11) + 2f64.powi(-30)),
            f(4.0),
            f(1.0),
        ),
        (F32, i(0), i(1003), i(1)),
        // Integer dtypes: start and step truncated to int64, values wrapped into the dtype.
        (I32, i(2147483646), i(2147483650), i(1)),
        (U8, i(-3), i(3), i(1)),
        (I64, f(1.0), f(2.5), f(0.5)),
        (I32, f(1.5), f(4.7), f(1.1)),
        (I64, i(-7), i(8), i(3)),
        (I64, i(5), i(-5), i(-3)),
    ];
    let mut cases = Vec::new();
    for (d, a, b, s) in ranges {
        let name = format!("arange({a:?}, {b:?}, {s:?}, {d})");
        let ins = vec![In::S(a), In::S(b), In::S(s)];
        cases.push(Case::new(name, Op::Arange { dtype: d }, ins, EXACT));
    }
    for d in DType::ALL {
        for v in [
            f(2.5),
            f(-0.0),
            i(-3),
            i(7),
            Scalar::Bool(true),
            Scalar::Bool(false),
        ] {
            // uint8 of -3 is out of range (PyTorch rejects it).
            if d == U8 && v == i(-3) {
                continue;
            }
            for sizes in [vec![], vec![5], vec![3, 33]] {
                let op = Op::Full {
                    sizes: sizes.iter().copied().collect(),
                    dtype: d,
                };
                cases.push(Case::new(
                    format!("full({sizes:?}, {v:?}, {d})"),
                    op,
                    vec![In::S(v)],
                    EXACT,
                ));
            }
        }
    }
    assert!(cases.iter().all(Case::is_valid));
    assert_no_failures(&run_cases(&cases));
}

#[test]
fn full_bool_from_int_or_float_scalar_is_nonzero() {
    // torch.full((n,), 2, dtype=torch.bool) and full(.., 0.5, ..) are True (stored as byte 1).
    let mut cases = Vec::new();
    for v in [
        Scalar::Int(2),
        Scalar::Int(-1),
        Scalar::Float(0.5),
        Scalar::Float(-3.0),
    ] {
        let op = Op::Full {
            sizes: [7].into_iter().collect(),
            dtype: DType::Bool,
        };
        cases.push(Case::new(
            format!("full(bool, {v:?})"),
            op,
            vec![In::S(v)],
            EXACT,
        ));
    }
    assert_no_failures(&run_cases(&cases));
}

#[test]
fn bf16_cast_keeps_nan_with_low_payload() {
    // f32 NaNs whose payload sits only in the low 16 bits must not become bf16 infinities.
    let bits: [u32; 4] = [0x7f80_0001, 0xff80_0001, 0x7fc0_0000, 0x7f80_8000];
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let outs = run_in_every_mode(|rt| {
        let x = rt.from_host(&bytes, DType::F32, &[4]).unwrap();
        vec![("to bf16".into(), run(rt, Op::Cast(DType::BF16), &[tt(x)]))]
    });
    let got = &outs[0].1;
    assert!(got.data.iter().all(|v| v.is_nan()), "{:?}", got.data);
}
