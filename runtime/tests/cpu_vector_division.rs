//! The division family (fmod, floor and trunc division), atan2, trunc, log2, log10 and the
//! bitwise ops in the CPU backend's loops: each runs per lane or on vector registers, and the
//! main loop and the tail must give the same bits for every element, for every lane type.

mod common;

use common::lanes::*;
use deferfuse_fusion::ir::{BinaryOp, DType, Scalar, UnaryOp};
use deferfuse_runtime::{Handle, Input, Runtime};

/// Dividends with signs, zeros, infinities, NaN and a huge value; the divisors are derived.
const FLOATS: [f64; 17] = [
    7.5,
    -7.5,
    0.0,
    -0.0,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    3.0e10,
    -7.0,
    1.0e-30,
    0.3,
    -123.456,
    42.0,
    -0.5,
    9.75,
    1.0e30,
    -3.0,
];

/// floor_divide, div_trunc, fmod and atan2 of x by a divisor with zeros and signs, plus trunc,
/// log2 and log10, summed so each element depends on all of them.
fn float_division_chain(rt: &Runtime, x: Handle) -> Handle {
    let f = |v: f64| Input::Scalar(Scalar::Float(v));
    // Divisors: x - 7.5 (0 for the first element), and -x.
    let d = bin(rt, BinaryOp::Sub, t(x), f(7.5));
    let nx = un(rt, UnaryOp::Neg, x);
    let fl = bin(rt, BinaryOp::FloorDivide, t(x), t(d));
    let tr = bin(rt, BinaryOp::TruncDivide, t(nx), t(d));
    let fm = bin(rt, BinaryOp::Fmod, t(x), t(d));
    let fs = bin(rt, BinaryOp::FloorDivide, t(x), f(-0.7));
    let at = bin(rt, BinaryOp::Atan2, t(x), t(d));
    let tc = un(rt, UnaryOp::Trunc, x);
    let ax = un(rt, UnaryOp::Abs, x);
    let l2 = un(rt, UnaryOp::Log2, ax);
    let l10 = un(rt, UnaryOp::Log10, ax);
    let s = [tr, fm, fs, at, tc, l2, l10]
        .into_iter()
        .fold(fl, |acc, v| bin(rt, BinaryOp::Add, t(acc), t(v)));
    // The sum hides which term went NaN: keep one term by itself too.
    bin(rt, BinaryOp::Mul, t(s), t(fl))
}

#[test]
fn f64_division_chain_gives_the_same_bits_in_main_loop_and_tail() {
    main_loop_and_tail_agree::<f64, f64>(&FLOATS, float_division_chain);
}

#[test]
fn f32_division_chain_gives_the_same_bits_in_main_loop_and_tail() {
    let xs: Vec<f32> = FLOATS.iter().map(|&x| x as f32).collect();
    main_loop_and_tail_agree::<f32, f32>(&xs, float_division_chain);
}

#[test]
fn f16_and_bf16_division_gives_the_same_bits_in_main_loop_and_tail() {
    let xs: Vec<f32> = FLOATS.iter().map(|&x| x as f32).collect();
    for d in [DType::F16, DType::BF16] {
        main_loop_and_tail_agree::<f32, f32>(&xs, |rt, x| {
            let h = cast(rt, x, d);
            let y = bin(rt, BinaryOp::Sub, t(h), Input::Scalar(Scalar::Float(7.5)));
            let fl = bin(rt, BinaryOp::FloorDivide, t(h), t(y));
            let tr = bin(rt, BinaryOp::TruncDivide, t(y), t(h));
            cast(rt, bin(rt, BinaryOp::Add, t(fl), t(tr)), DType::F32)
        });
    }
}

const INTS: [i64; 17] = [
    0,
    1,
    -1,
    7,
    -8,
    46_341,
    -46_341,
    i32::MAX as i64,
    i32::MIN as i64,
    123_456_789,
    -987_654,
    3,
    -3,
    100,
    i64::MAX,
    i64::MIN,
    (1 << 40) + 5,
];

/// Integer floor and trunc division and fmod by divisors that include 0 and -1, and the
/// bitwise ops, combined with xor so that no result is lost.
fn int_division_chain(rt: &Runtime, x: Handle) -> Handle {
    let i = |v: i64| Input::Scalar(Scalar::Int(v));
    // x + 1: 0 and -1 among the divisors (for x = -1 and x = -2 ... and the wrapped maximum).
    let d = bin(rt, BinaryOp::Add, t(x), i(1));
    let nd = un(rt, UnaryOp::Neg, d);
    let fl = bin(rt, BinaryOp::FloorDivide, t(x), t(d));
    let tr = bin(rt, BinaryOp::TruncDivide, t(x), t(nd));
    let fm = bin(rt, BinaryOp::Fmod, t(x), t(d));
    let m1 = bin(rt, BinaryOp::FloorDivide, t(x), i(-1));
    let by3 = bin(rt, BinaryOp::FloorDivide, t(x), i(-3));
    let nt = un(rt, UnaryOp::BitwiseNot, x);
    let a = bin(rt, BinaryOp::BitwiseAnd, t(fl), t(nt));
    let o = bin(rt, BinaryOp::BitwiseOr, t(tr), t(fm));
    let tc = un(rt, UnaryOp::Trunc, x);
    [o, m1, by3, tc]
        .into_iter()
        .fold(a, |acc, v| bin(rt, BinaryOp::BitwiseXor, t(acc), t(v)))
}

#[test]
fn i64_division_chain_gives_the_same_bits_in_main_loop_and_tail() {
    main_loop_and_tail_agree::<i64, i64>(&INTS, int_division_chain);
}

#[test]
fn i32_division_chain_gives_the_same_bits_in_main_loop_and_tail() {
    let xs: Vec<i32> = INTS.iter().map(|&x| x as i32).collect();
    main_loop_and_tail_agree::<i32, i32>(&xs, int_division_chain);
}

#[test]
fn u8_division_chain_gives_the_same_bits_in_main_loop_and_tail() {
    let xs: Vec<u8> = INTS.iter().map(|&x| x as u8).collect();
    main_loop_and_tail_agree::<u8, u8>(&xs, int_division_chain);
}

#[test]
fn bool_bitwise_ops_give_the_same_bits_in_main_loop_and_tail() {
    let xs: Vec<u8> = INTS.iter().map(|&x| (x & 3) as u8).collect();
    main_loop_and_tail_agree::<u8, u8>(&xs, |rt, x| {
        let odd = bin(
            rt,
            BinaryOp::BitwiseAnd,
            t(x),
            Input::Scalar(Scalar::Int(1)),
        );
        let a = cast(rt, odd, DType::Bool);
        let b = cast(rt, x, DType::Bool);
        let n = un(rt, UnaryOp::BitwiseNot, a);
        let o = bin(rt, BinaryOp::BitwiseOr, t(n), t(b));
        let r = bin(rt, BinaryOp::BitwiseXor, t(o), t(a));
        let r = bin(
            rt,
            BinaryOp::BitwiseAnd,
            t(r),
            Input::Scalar(Scalar::Bool(true)),
        );
        cast(rt, r, DType::U8)
    });
}
