//! The division family of body values: remainder (divisor-signed), fmod (dividend-signed),
//! floor and trunc division, for floats and integers.
//!
//! x64 has no vector integer division, so the integer forms run per lane; a divisor of 0 gives
//! 0 (the runtime cannot raise from inside a loop, where PyTorch raises), and a divisor of -1
//! is special-cased so that `MIN / -1` wraps instead of faulting.

use super::*;

impl Emitter<'_, '_> {
    /// Emits `op(x, y)` for floats of dtype `src`.
    pub(super) fn float_division(&mut self, op: BinaryOp, x: &V, y: &V, src: DType) -> V {
        use BinaryOp::*;
        let ty = lane_ty(src);
        let f64 = ty == F64;
        match op {
            Fmod => self.per_lane(&[x, y], if f64 { "df_fmod_f64" } else { "df_fmod_f32" }, ty),
            Remainder => {
                let r = self.float_division(Fmod, x, y, src);
                // Python modulo: a non-zero result takes the divisor's sign.
                let zero = self.fconst(0.0, src);
                let nz = self.fcmp(FloatCC::NotEqual, &r, &zero);
                let rneg = self.fcmp(FloatCC::LessThan, &r, &zero);
                let yneg = self.fcmp(FloatCC::LessThan, y, &zero);
                let fix = Fm((0..nz.0.len())
                    .map(|k| {
                        let d = self.b.ins().bxor(rneg.0[k], yneg.0[k]);
                        self.b.ins().band(nz.0[k], d)
                    })
                    .collect());
                let adj = self.zip(&r, y, |b, r, y| b.ins().fadd(r, y));
                self.fsel(&fix, &adj, &r)
            }
            // PyTorch's algorithm, which rounds f16/bf16 tensors' steps to their dtype.
            FloorDivide => {
                let name = match src {
                    DType::F64 => "df_floordiv_f64",
                    DType::F16 => "df_floordiv_f16",
                    DType::BF16 => "df_floordiv_bf16",
                    _ => "df_floordiv_f32",
                };
                self.per_lane(&[x, y], name, ty)
            }
            TruncDivide => {
                let q = self.zip(x, y, |b, x, y| b.ins().fdiv(x, y));
                // PyTorch truncates the quotient of two f16/bf16 tensors after rounding it to
                // their dtype: trunc(2047.7) is 2047, but the f16 quotient is 2048.
                let q = if matches!(src, DType::F16 | DType::BF16) {
                    self.cast(&q, DType::F32, src)
                } else {
                    q
                };
                self.map(&q, |b, x| b.ins().trunc(x))
            }
            other => unreachable!("{} is not a division", other.name()),
        }
    }

    /// Emits `op(x, y)` for integer lanes, per lane.
    pub(super) fn int_division(&mut self, op: BinaryOp, x: &V, y: &V) -> V {
        use BinaryOp::*;
        self.lanewise(&[x, y], |e, a| {
            let b = &mut *e.b;
            let (x, y) = (a[0], a[1]);
            let ty = b.func.dfg.value_type(x);
            let one = b.ins().iconst(ty, 1);
            let zero = b.ins().iconst(ty, 0);
            let by_zero = b.ins().icmp_imm_s(IntCC::Equal, y, 0);
            let by_m1 = b.ins().icmp_imm_s(IntCC::Equal, y, -1);
            let bad = b.ins().bor(by_zero, by_m1);
            // Both divisors give remainder 0; the quotients are fixed up below.
            let d = b.ins().select(bad, one, y);
            // A non-zero remainder whose sign differs from the divisor's: Python's modulo
            // adds the divisor, floor division rounds one further down.
            let off_sign = |b: &mut FunctionBuilder, r: Value| {
                let nz = b.ins().icmp_imm_s(IntCC::NotEqual, r, 0);
                let rn = b.ins().icmp_imm_s(IntCC::SignedLessThan, r, 0);
                let yn = b.ins().icmp_imm_s(IntCC::SignedLessThan, y, 0);
                let diff = b.ins().bxor(rn, yn);
                b.ins().band(nz, diff)
            };
            match op {
                Fmod => b.ins().srem(x, d),
                Remainder => {
                    let r = b.ins().srem(x, d);
                    let fix = off_sign(b, r);
                    let adj = b.ins().iadd(r, y);
                    b.ins().select(fix, adj, r)
                }
                TruncDivide | FloorDivide => {
                    let mut q = b.ins().sdiv(x, d);
                    if op == FloorDivide {
                        let r = b.ins().srem(x, d);
                        let fix = off_sign(b, r);
                        let down = b.ins().isub(q, one);
                        q = b.ins().select(fix, down, q);
                    }
                    // x / -1 wraps (MIN / -1 is MIN); x / 0 gives 0.
                    let neg = b.ins().ineg(x);
                    let q = b.ins().select(by_m1, neg, q);
                    b.ins().select(by_zero, zero, q)
                }
                other => unreachable!("{} is not a division", other.name()),
            }
        })
    }
}
