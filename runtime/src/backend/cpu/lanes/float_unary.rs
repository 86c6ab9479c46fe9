//! Float unary ops of body values: the inline polynomials of `vmath` for f32, helper calls
//! for the rest.

use super::*;

impl Emitter<'_, '_> {
    /// Emits a float unary op; `d` is the (float) dtype computed in.
    pub(super) fn funary(&mut self, op: UnaryOp, a: &V, d: DType) -> V {
        use UnaryOp::*;
        let f64 = d.compute() == DType::F64;
        let lib = |n32: &'static str, n64: &'static str| if f64 { n64 } else { n32 };
        let ty = lane_ty(d);
        match op {
            Neg => self.map(a, |b, x| sign_bit_op(b, x, false)),
            Abs => self.map(a, |b, x| sign_bit_op(b, x, true)),
            Sqrt => self.map(a, |b, x| b.ins().sqrt(x)),
            Floor => self.map(a, |b, x| b.ins().floor(x)),
            Ceil => self.map(a, |b, x| b.ins().ceil(x)),
            Round => self.map(a, |b, x| b.ins().nearest(x)),
            Trunc => self.map(a, |b, x| b.ins().trunc(x)),
            Rsqrt | Reciprocal => {
                let s = if op == Rsqrt {
                    self.map(a, |b, x| b.ins().sqrt(x))
                } else {
                    a.clone()
                };
                let one = self.fconst(1.0, d);
                self.zip(&one, &s, |b, o, x| b.ins().fdiv(o, x))
            }
            Relu => {
                // `x < 0 ? 0 : x` in one maxps/maxpd; a NaN passes through.
                let zero = self.fconst(0.0, d);
                self.else_second(&zero, a, false)
            }
            Sign => {
                let zero = self.fconst(0.0, d);
                let pos = self.fconst(1.0, d);
                let neg = self.fconst(-1.0, d);
                let gt = self.fcmp(FloatCC::GreaterThan, a, &zero);
                let lt = self.fcmp(FloatCC::LessThan, a, &zero);
                let r = self.fsel(&lt, &neg, &zero);
                self.fsel(&gt, &pos, &r)
            }
            Exp if !f64 => self.map(a, |b, x| VMath { b }.exp(x)),
            Log if !f64 => self.map(a, |b, x| VMath { b }.log(x)),
            Tanh if !f64 => self.map(a, |b, x| VMath { b }.tanh(x)),
            Erf if !f64 => self.map(a, |b, x| VMath { b }.erf(x)),
            Sigmoid if !f64 => self.map(a, |b, x| VMath { b }.sigmoid(x)),
            Log1p if !f64 => self.map(a, |b, x| VMath { b }.log1p(x)),
            Expm1 if !f64 => self.map(a, |b, x| VMath { b }.expm1(x)),
            Log2 if !f64 => self.map(a, |b, x| VMath { b }.log2(x)),
            Log10 if !f64 => self.map(a, |b, x| VMath { b }.log10(x)),
            Atanh if !f64 => self.map(a, |b, x| VMath { b }.atanh(x)),
            Exp => self.per_lane(&[a], "df_exp_f64", ty),
            Log => self.per_lane(&[a], "df_log_f64", ty),
            Tanh => self.per_lane(&[a], "df_tanh_f64", ty),
            Erf => self.per_lane(&[a], "df_erf_f64", ty),
            Sigmoid => {
                let n = self.map(a, |b, x| b.ins().fneg(x));
                let e = self.funary(Exp, &n, d);
                let one = self.fconst(1.0, d);
                let den = self.zip(&one, &e, |b, o, e| b.ins().fadd(o, e));
                self.zip(&one, &den, |b, o, x| b.ins().fdiv(o, x))
            }
            Log1p => self.per_lane(&[a], "df_log1p_f64", ty),
            Expm1 => self.per_lane(&[a], "df_expm1_f64", ty),
            Sin => self.per_lane(&[a], lib("df_sin_f32", "df_sin_f64"), ty),
            Log2 => self.per_lane(&[a], "df_log2_f64", ty),
            Log10 => self.per_lane(&[a], "df_log10_f64", ty),
            Cos => self.per_lane(&[a], lib("df_cos_f32", "df_cos_f64"), ty),
            Sinh => self.per_lane(&[a], lib("df_sinh_f32", "df_sinh_f64"), ty),
            Cosh => self.per_lane(&[a], lib("df_cosh_f32", "df_cosh_f64"), ty),
            Tan => self.per_lane(&[a], lib("df_tan_f32", "df_tan_f64"), ty),
            Asin => self.per_lane(&[a], lib("df_asin_f32", "df_asin_f64"), ty),
            Acos => self.per_lane(&[a], lib("df_acos_f32", "df_acos_f64"), ty),
            Atan => self.per_lane(&[a], lib("df_atan_f32", "df_atan_f64"), ty),
            Asinh => self.per_lane(&[a], lib("df_asinh_f32", "df_asinh_f64"), ty),
            Acosh => self.per_lane(&[a], lib("df_acosh_f32", "df_acosh_f64"), ty),
            Atanh => self.per_lane(&[a], "df_atanh_f64", ty),
            Silu => {
                let s = self.funary(Sigmoid, a, d);
                self.zip(a, &s, |b, x, s| b.ins().fmul(x, s))
            }
            GeluErf => {
                let k = self.fconst(std::f64::consts::FRAC_1_SQRT_2, d);
                let t = self.zip(a, &k, |b, x, k| b.ins().fmul(x, k));
                let e = self.funary(Erf, &t, d);
                self.gelu_tail(a, &e, d)
            }
            GeluTanh => {
                let k0 = self.fconst(0.797_884_560_802_865_4, d);
                let k1 = self.fconst(0.044_715, d);
                let x3 = self.zip(a, a, |b, x, y| b.ins().fmul(x, y));
                let x3 = self.zip(&x3, a, |b, x, y| b.ins().fmul(x, y));
                let inner = self.zip(&x3, &k1, |b, x, k| b.ins().fmul(x, k));
                let inner = self.zip(a, &inner, |b, x, y| b.ins().fadd(x, y));
                let inner = self.zip(&inner, &k0, |b, x, k| b.ins().fmul(x, k));
                let t = self.funary(Tanh, &inner, d);
                self.gelu_tail(a, &t, d)
            }
            LogicalNot | IsNan | BitwiseNot => unreachable!("handled by unary()"),
        }
    }

    /// 0.5 * x * (1 + t).
    fn gelu_tail(&mut self, x: &V, t: &V, d: DType) -> V {
        let one = self.fconst(1.0, d);
        let half = self.fconst(0.5, d);
        let s = self.zip(&one, t, |b, o, t| b.ins().fadd(o, t));
        let hx = self.zip(&half, x, |b, h, x| b.ins().fmul(h, x));
        self.zip(&hx, &s, |b, h, s| b.ins().fmul(h, s))
    }
}

/// `fabs` (`abs`) or `fneg` of `x` as one bitwise op with the sign mask. On vectors Cranelift
/// lowers `fabs`/`fneg` to three instructions, building the mask in the loop each time
/// (pcmpeqd, psrld, andps); an `and`/`xor` with a constant reads the mask from the constant
/// pool instead. The same bits either way.
fn sign_bit_op(b: &mut FunctionBuilder, x: Value, abs: bool) -> Value {
    let ty = b.func.dfg.value_type(x);
    if !ty.is_vector() {
        return if abs {
            b.ins().fabs(x)
        } else {
            b.ins().fneg(x)
        };
    }
    let lane_bytes = ty.lane_bits() as usize / 8;
    let sign: u64 = 1 << (ty.lane_bits() - 1);
    let lane = if abs { !sign } else { sign };
    let bytes: Vec<u8> = (0..ty.lane_count())
        .flat_map(|_| lane.to_le_bytes()[..lane_bytes].to_vec())
        .collect();
    let c = b.func.dfg.constants.insert(ConstantData::from(&bytes[..]));
    let mask = b.ins().vconst(ty, c);
    if abs {
        b.ins().band(x, mask)
    } else {
        b.ins().bxor(x, mask)
    }
}
