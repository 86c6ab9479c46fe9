//! Dtype conversions of body values, with PyTorch's rules.

use super::*;

impl Emitter<'_, '_> {
    /// The low 64 bits of `a` and of `b` in one register of type `vt` (one punpcklqdq).
    fn low_halves(&mut self, a: Value, b: Value, vt: Type) -> Value {
        let mask = [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23];
        self.byte_shuffle(a, b, mask, vt)
    }

    /// The high 64 bits of `a` moved to the low half (one pshufd).
    fn high_half(&mut self, a: Value) -> Value {
        let vt = self.b.func.dfg.value_type(a);
        let mask = [8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15];
        self.byte_shuffle(a, a, mask, vt)
    }

    /// Registers of 2-lane results `f(r)` of each 32-bit-lane register `r`: the low half, then
    /// (at width 4) the high half.
    fn widen(&mut self, x: Value, mut f: impl FnMut(&mut Self, Value) -> Value) -> Regs {
        let mut out: Regs = SmallVec::new();
        out.push(f(self, x));
        if self.width > 2 {
            let h = self.high_half(x);
            out.push(f(self, h));
        }
        out
    }

    /// 2-lane registers `r` (each reduced by `f` to a register with its two lanes low) as one
    /// 4-lane register.
    fn narrow(
        &mut self,
        r: &[Value],
        vt: Type,
        mut f: impl FnMut(&mut Self, Value) -> Value,
    ) -> Value {
        let lo = f(self, r[0]);
        match r.get(1) {
            Some(&h) => {
                let hi = f(self, h);
                self.low_halves(lo, hi, vt)
            }
            None => lo,
        }
    }

    /// Converts `v` from dtype `from` to dtype `to` with PyTorch's rules (float to int
    /// truncates toward zero and saturates, NaN gives 0; to bool is `!= 0`; to f16/bf16 rounds).
    pub fn cast(&mut self, v: &V, from: DType, to: DType) -> V {
        if from == to {
            return v.clone();
        }
        let v = &self.vector(v);
        if to == DType::Bool {
            return self.truthy(v, from, false);
        }
        let (ft, tt) = (lane_ty(from), lane_ty(to));
        let r = self.regs_of(v);
        let out = match (ft, tt) {
            _ if ft == tt => v.clone(),
            (F64, F32) => V::F(self.narrow(&r, F32X4, |e, x| e.b.ins().fvdemote(x))),
            (I32, F32) => V::F(self.b.ins().fcvt_from_sint(F32X4, r[0])),
            (F32, F64) => V::W(self.widen(r[0], |e, x| e.b.ins().fvpromote_low(x))),
            (I32, F64) => V::W(self.widen(r[0], |e, x| {
                let w = e.b.ins().swiden_low(x);
                e.b.ins().fcvt_from_sint(F64X2, w)
            })),
            (I64, F64) => self.map(v, |b, x| b.ins().fcvt_from_sint(F64X2, x)),
            (I32, I64) => V::W(self.widen(r[0], |e, x| e.b.ins().swiden_low(x))),
            (F32, I32) => self.map(v, |b, x| b.ins().fcvt_to_sint_sat(I32X4, x)),
            // cvttpd2dq with NaN and saturation fixed up (Cranelift's lowering of exactly this
            // shape); the two lanes land low, the high lanes are 0.
            (F64, I32) => V::W(SmallVec::from_elem(
                self.narrow(&r, I32X4, |e, x| {
                    let c = e.b.ins().fcvt_to_sint_sat(I64X2, x);
                    let z =
                        e.b.func
                            .dfg
                            .constants
                            .insert(ConstantData::from(&[0u8; 16][..]));
                    let z = e.b.ins().vconst(I64X2, z);
                    e.b.ins().snarrow(c, z)
                }),
                1,
            )),
            (I64, I32) => {
                // The low halves, which wrap like a truncating cast.
                V::W(SmallVec::from_elem(self.low_words(&r), 1))
            }
            // No x64 lowering of f32x4/f64x2 -> i64x2 or i64x2 -> f32x4: per lane.
            (F32 | F64, I64) => self.lanewise(&[v], |e, l| e.b.ins().fcvt_to_sint_sat(I64, l[0])),
            (I64, F32) => self.lanewise(&[v], |e, l| e.b.ins().fcvt_from_sint(F32, l[0])),
            (a, b) => unreachable!("cast {a} -> {b}"),
        };
        match (to, out) {
            (DType::BF16, V::F(f)) => V::F(self.vm().round_bf16(f)),
            (DType::F16, V::F(f)) => V::F(self.vm().round_f16(f)),
            (_, out) => self.normalize(out, to),
        }
    }
}
