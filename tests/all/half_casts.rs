//! float16 and bfloat16 through the CPU backend's loops: every 16-bit pattern widened, a sweep
//! of f32 patterns rounded, and arithmetic on half tensors, bit for bit against `half` (whose
//! values are PyTorch's; a bf16 NaN widens as PyTorch's does, below), in every mode. Lengths are not multiples of four, so both
//! a loop's 4-lane body and its element-by-element tail run. CPU backend only (not in `.ci/run`'s
//! PJRT list): XLA's CPU runtime flushes subnormals and makes NaNs quiet and canonical.

use crate::harness::*;
use deferfuse::{BinaryOp, DType, Handle, Input, Op, Runtime, Scalar};
use half::{bf16, f16};

/// A 1-D tensor holding `bits` as `dtype`'s raw little-endian elements.
fn from_bits<T: Copy>(rt: &Runtime, dtype: DType, bits: &[T]) -> Handle {
    let size = std::mem::size_of::<T>();
    let bytes: Vec<u8> = bits
        .iter()
        .flat_map(|b| {
            // SAFETY: `T` is a plain integer of `size` bytes.
            let p = b as *const T as *const u8;
            unsafe { std::slice::from_raw_parts(p, size) }.to_vec()
        })
        .collect();
    rt.from_host(&bytes, dtype, &[bits.len()])
        .expect("from_host")
}

/// `bits` (a tensor of `from`) cast to `to`, run in every mode; the result's raw bytes.
fn cast_in_every_mode<T: Copy>(bits: &[T], from: DType, to: DType) -> Vec<u8> {
    let outs = run_in_every_mode_raw(|rt| {
        let x = from_bits(rt, from, bits);
        vec![("r".into(), run(rt, Op::Cast(to), &[tt(x)]))]
    });
    outs[0].1 .2.clone()
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every 16-bit pattern, and one more so the length is not a multiple of four.
fn every_u16() -> Vec<u16> {
    (0..=u16::MAX).chain([0x3c00]).collect()
}

/// f32 patterns around every rounding boundary a 16-bit float has: a stride through all
/// patterns, each with its neighbours, plus zeros, infinities, NaNs with payloads, f16's
/// overflow threshold and subnormal range.
fn f32_sweep() -> Vec<u32> {
    let mut v: Vec<u32> = (0..u32::MAX / 4099)
        .flat_map(|i| {
            let b = i * 4099;
            [b, b ^ 0x1000, b | 0xfff, b & !0x1fff | 0x1000]
        })
        .collect();
    let specials = [
        0,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffa0_1234,
        0x477f_efff,
        0x477f_f000,
        0x477f_f001,
        0x4780_0000,
        0x3380_0000,
        0x3380_0001,
        0x3300_0000,
        0x3300_0001,
        0x387f_c000,
        0x387f_e000,
        0x0000_0001,
    ];
    v.extend(specials);
    v.push(0x3f80_0000);
    v
}

#[test]
fn every_f16_widens_to_the_f32_half_gives() {
    let bits = every_u16();
    let got = u32s(&cast_in_every_mode(&bits, DType::F16, DType::F32));
    for (&h, &g) in bits.iter().zip(&got) {
        assert_eq!(g, f16::from_bits(h).to_f32().to_bits(), "f16 {h:#06x}");
    }
}

/// A bf16 is an f32's high half: widened by a shift, a NaN's payload untouched (PyTorch's
/// `c10::BFloat16` does the same; `half` would make a signaling NaN quiet).
#[test]
fn every_bf16_widens_to_its_f32_high_half() {
    let bits = every_u16();
    let got = u32s(&cast_in_every_mode(&bits, DType::BF16, DType::F32));
    for (&h, &g) in bits.iter().zip(&got) {
        assert_eq!(g, (h as u32) << 16, "bf16 {h:#06x}");
    }
}

#[test]
fn f32_rounds_to_the_f16_half_gives_ties_to_even() {
    let bits = f32_sweep();
    let got = u16s(&cast_in_every_mode(&bits, DType::F32, DType::F16));
    for (&b, &g) in bits.iter().zip(&got) {
        let want = f16::from_f32(f32::from_bits(b)).to_bits();
        assert_eq!(g, want, "f32 {b:#010x}");
    }
}

#[test]
fn f32_rounds_to_the_bf16_half_gives_ties_to_even() {
    let bits = f32_sweep();
    let got = u16s(&cast_in_every_mode(&bits, DType::F32, DType::BF16));
    for (&b, &g) in bits.iter().zip(&got) {
        let want = bf16::from_f32(f32::from_bits(b)).to_bits();
        assert_eq!(g, want, "f32 {b:#010x}");
    }
}

/// `x * y + 1` on half tensors: each op rounds its result to the half type, as PyTorch's do.
fn mul_add_one(dtype: DType, x: &[u16], y: &[u16]) -> Vec<u16> {
    let outs = run_in_every_mode_raw(|rt| {
        let (a, b) = (from_bits(rt, dtype, x), from_bits(rt, dtype, y));
        let p = bin(rt, BinaryOp::Mul, tt(a), tt(b));
        let one = Input::Scalar(Scalar::Float(1.0));
        vec![(
            "r".into(),
            run(rt, Op::Binary(BinaryOp::Add), &[tt(p), one]),
        )]
    });
    u16s(&outs[0].1 .2)
}

/// Operands spread over each type's range (every 7th and 13th pattern, from the start and the
/// end): normals, subnormals, infinities and NaNs meet each other.
fn operands() -> (Vec<u16>, Vec<u16>) {
    let x: Vec<u16> = (0..9001u32).map(|i| (i * 7) as u16).collect();
    let y: Vec<u16> = (0..9001u32).map(|i| u16::MAX - (i * 13) as u16).collect();
    (x, y)
}

/// `x * y + 1` on the device against `half`'s: `widen` and `round` are the type's conversions
/// (bits to f32, f32 to bits), each op rounded; NaN wherever the reference gives one.
fn assert_mul_add_one_rounds_each_op(dtype: DType, widen: fn(u16) -> f32, round: fn(f32) -> u16) {
    let (x, y) = operands();
    let got = mul_add_one(dtype, &x, &y);
    for i in 0..x.len() {
        let p = round(widen(x[i]) * widen(y[i]));
        let want = round(widen(p) + 1.0);
        let same = got[i] == want || (widen(want).is_nan() && widen(got[i]).is_nan());
        assert!(
            same,
            "{:#06x} * {:#06x} + 1: got {:#06x}",
            x[i], y[i], got[i]
        );
    }
}

#[test]
fn f16_arithmetic_rounds_each_op_as_half_does() {
    assert_mul_add_one_rounds_each_op(
        DType::F16,
        |h| f16::from_bits(h).to_f32(),
        |v| f16::from_f32(v).to_bits(),
    );
}

#[test]
fn bf16_arithmetic_rounds_each_op_as_half_does() {
    assert_mul_add_one_rounds_each_op(
        DType::BF16,
        |h| bf16::from_bits(h).to_f32(),
        |v| bf16::from_f32(v).to_bits(),
    );
}
