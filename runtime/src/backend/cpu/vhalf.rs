//! f16 conversions in f32x4 lanes: a float16 tensor's loads, stores and in-region casts.
//!
//! Each used to call into Rust once per element (`half`'s scalar conversion), ~5 ns an
//! element: an elementwise loop over f16 tensors ran 10-25x slower than the same loop over
//! f32. These are integer and float lane operations with `half`'s exact results (round to
//! nearest even, NaN kept with its high payload bits and made quiet), checked on every f16
//! and on a sweep of f32 bit patterns against `half` in `tests/all/half_casts.rs`.
//! bf16's are in `vmath` (`round_bf16`) and `codegen` (a shift each way).

use super::vmath::VMath;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4};
use cranelift_codegen::ir::{InstBuilder, Value};

impl VMath<'_, '_> {
    /// An i32x4 of `c` in every lane.
    fn lanes_of(&mut self, c: u32) -> Value {
        let x = self.b.ins().iconst(I32, c as i64);
        self.b.ins().splat(I32X4, x)
    }

    /// The f32 values of f16 bit patterns (one per i32 lane, upper halves zero).
    pub fn f16_to_f32(&mut self, h: Value) -> Value {
        let mask = self.lanes_of(0x7fff);
        let em = self.b.ins().band(h, mask);
        let sign_bit = self.lanes_of(0x8000);
        let sign = self.b.ins().band(h, sign_bit);
        let sign = self.b.ins().ishl_imm_s(sign, 16);
        // A normal f16: its exponent and mantissa moved into place, the exponent rebiased.
        let o = self.b.ins().ishl_imm_s(em, 13);
        let rebias = self.lanes_of(112 << 23);
        let normal = self.b.ins().iadd(o, rebias);
        // Infinity and NaN: the exponent rebiased again to all ones; a NaN made quiet.
        let inf_nan = self.b.ins().iadd(normal, rebias);
        let quiet = self.lanes_of(0x0040_0000);
        let max_finite = self.lanes_of(0x7bff);
        let is_inf_nan = self.b.ins().icmp(IntCC::SignedGreaterThan, em, max_finite);
        let inf = self.lanes_of(0x7c00);
        let is_nan = self.b.ins().icmp(IntCC::SignedGreaterThan, em, inf);
        let nan_quiet = self.b.ins().band(is_nan, quiet);
        let inf_nan = self.b.ins().bor(inf_nan, nan_quiet);
        // A subnormal (or zero): the normal encoding of 2^-14 + m 2^-24, less 2^-14, exactly.
        let one_exp = self.lanes_of(1 << 23);
        let sub = self.b.ins().iadd(normal, one_exp);
        let sub = self.as_f(sub);
        let two_m14 = self.splat(f32::from_bits(113 << 23));
        let sub = self.b.ins().fsub(sub, two_m14);
        let sub = self.as_i(sub);
        let min_normal = self.lanes_of(0x0400);
        let is_sub = self.b.ins().icmp(IntCC::SignedLessThan, em, min_normal);
        let r = self.b.ins().bitselect(is_inf_nan, inf_nan, normal);
        let r = self.b.ins().bitselect(is_sub, sub, r);
        let r = self.b.ins().bor(r, sign);
        self.as_f(r)
    }

    /// The f16 bit patterns (one per i32 lane) nearest `x`'s lanes, ties to even.
    pub fn f32_to_f16(&mut self, x: Value) -> Value {
        let b = self.as_i(x);
        let sign_bit = self.lanes_of(0x8000_0000);
        let sign = self.b.ins().band(b, sign_bit);
        let a = self.b.ins().bxor(b, sign);
        // |x| >= 2^16 (past f16's largest finite value after rounding), infinity or NaN.
        let overflow = self.lanes_of(143 << 23);
        let is_big = self
            .b
            .ins()
            .icmp(IntCC::SignedGreaterThanOrEqual, a, overflow);
        let inf32 = self.lanes_of(0x7f80_0000);
        let is_nan = self.b.ins().icmp(IntCC::SignedGreaterThan, a, inf32);
        let man_mask = self.lanes_of(0x007f_ffff);
        let payload = self.b.ins().band(a, man_mask);
        let payload = self.b.ins().ushr_imm_s(payload, 13);
        let quiet_nan = self.lanes_of(0x7e00);
        let nan = self.b.ins().bor(payload, quiet_nan);
        let inf = self.lanes_of(0x7c00);
        let big = self.b.ins().bitselect(is_nan, nan, inf);
        // |x| < 2^-14: adding 0.5 rounds it at 2^-24, f16's subnormal step; the low bits of
        // the sum are the result.
        let half_bits = self.lanes_of(126 << 23);
        let af = self.as_f(a);
        let half = self.as_f(half_bits);
        let s = self.b.ins().fadd(af, half);
        let s = self.as_i(s);
        let sub = self.b.ins().isub(s, half_bits);
        let min_normal = self.lanes_of(113 << 23);
        let is_sub = self.b.ins().icmp(IntCC::SignedLessThan, a, min_normal);
        // A normal f16: rebias, add just under half a step plus the kept bit's parity (ties
        // to even), drop 13 bits; a carry out of the mantissa raises the exponent.
        let one = self.lanes_of(1);
        let odd = self.b.ins().ushr_imm_s(a, 13);
        let odd = self.b.ins().band(odd, one);
        let rebias = self.lanes_of(((-112i32 << 23) + 0xfff) as u32);
        let n = self.b.ins().iadd(a, rebias);
        let n = self.b.ins().iadd(n, odd);
        let normal = self.b.ins().ushr_imm_s(n, 13);
        let r = self.b.ins().bitselect(is_sub, sub, normal);
        let r = self.b.ins().bitselect(is_big, big, r);
        let sign = self.b.ins().ushr_imm_s(sign, 16);
        self.b.ins().bor(r, sign)
    }

    /// `x` rounded to the nearest f16, as f32 (a cast to float16 inside a region).
    pub fn round_f16(&mut self, x: Value) -> Value {
        let h = self.f32_to_f16(x);
        self.f16_to_f32(h)
    }
}
