//! Values of a loop body and the ops on them.
//!
//! A body is emitted for 4 elements at a time (the main loop) or 1 (the tail). f32-computed
//! values (f32, f16, bf16) live in one f32x4 register in both cases, so the tail runs the very
//! same instructions as the main loop and a result never depends on where an element falls.
//! Other dtypes (f64, integers, bool) are kept as one scalar SSA value per lane.

use super::vmath::VMath;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, F64, I32, I32X4, I64};
use cranelift_codegen::ir::{AbiParam, FuncRef, InstBuilder, Signature, Type, Value};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::JITModule;
use cranelift_module::{Linkage, Module};
use deferfuse_fusion::ir::{BinaryOp, DType, UnaryOp};
use smallvec::SmallVec;
use std::collections::HashMap;

/// One body value: an f32x4 register, or `width` scalars of the compute type.
#[derive(Clone, Debug)]
pub enum V {
    F(Value),
    L(SmallVec<[Value; 4]>),
}

/// True for dtypes computed in f32x4 registers.
pub fn is_vec(d: DType) -> bool {
    d.compute() == DType::F32
}

/// The scalar Cranelift type a dtype computes in.
pub fn lane_ty(d: DType) -> Type {
    match d.compute() {
        DType::F32 => F32,
        DType::F64 => F64,
        DType::I64 => I64,
        _ => I32,
    }
}

/// Emits body ops into one function; `width` is 4 in the main loop and 1 in the tail.
pub struct Emitter<'a, 'b> {
    pub b: &'a mut FunctionBuilder<'b>,
    pub module: &'a mut JITModule,
    pub width: usize,
    funcs: HashMap<&'static str, FuncRef>,
}

impl<'a, 'b> Emitter<'a, 'b> {
    pub fn new(b: &'a mut FunctionBuilder<'b>, module: &'a mut JITModule) -> Self {
        Emitter {
            b,
            module,
            width: 4,
            funcs: HashMap::new(),
        }
    }

    pub fn vm(&mut self) -> VMath<'_, 'b> {
        VMath { b: self.b }
    }

    /// Calls a helper from `helpers.rs` (declared on first use).
    pub fn call(
        &mut self,
        name: &'static str,
        args: &[Value],
        params: &[Type],
        ret: Type,
    ) -> Value {
        let f = match self.funcs.get(name) {
            Some(f) => *f,
            None => {
                let mut sig = Signature::new(self.module.isa().default_call_conv());
                sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
                sig.returns.push(AbiParam::new(ret));
                let id = self
                    .module
                    .declare_function(name, Linkage::Import, &sig)
                    .expect("helper signature is consistent");
                let f = self.module.declare_func_in_func(id, self.b.func);
                self.funcs.insert(name, f);
                f
            }
        };
        let call = self.b.ins().call(f, args);
        self.b.inst_results(call)[0]
    }

    /// The lanes of `v` as scalars (f32 registers are split).
    pub fn lanes(&mut self, v: &V) -> SmallVec<[Value; 4]> {
        match v {
            V::L(l) => l.clone(),
            V::F(x) => (0..self.width)
                .map(|k| self.b.ins().extractlane(*x, k as u8))
                .collect(),
        }
    }

    /// Packs f32 scalars into a register (the tail splats its one lane).
    pub fn pack(&mut self, lanes: &[Value]) -> Value {
        let mut v = self.b.ins().splat(F32X4, lanes[0]);
        for (k, &l) in lanes.iter().enumerate().skip(1) {
            v = self.b.ins().insertlane(v, l, k as u8);
        }
        v
    }

    /// A value holding `x` in every lane, in `d`'s representation.
    pub fn broadcast(&mut self, x: Value, d: DType) -> V {
        if is_vec(d) {
            V::F(self.b.ins().splat(F32X4, x))
        } else {
            V::L(SmallVec::from_elem(x, self.width))
        }
    }

    fn map(&mut self, v: &V, mut f: impl FnMut(&mut FunctionBuilder<'b>, Value) -> Value) -> V {
        match v {
            V::F(x) => V::F(f(self.b, *x)),
            V::L(l) => V::L(l.iter().map(|&x| f(self.b, x)).collect()),
        }
    }

    fn zip(
        &mut self,
        x: &V,
        y: &V,
        mut f: impl FnMut(&mut FunctionBuilder<'b>, Value, Value) -> Value,
    ) -> V {
        match (x, y) {
            (V::F(a), V::F(b)) => V::F(f(self.b, *a, *b)),
            (V::L(a), V::L(b)) => V::L(a.iter().zip(b).map(|(&a, &b)| f(self.b, a, b)).collect()),
            _ => unreachable!("operands share a representation"),
        }
    }

    /// Applies a scalar helper lane by lane (f32 registers are split and repacked).
    fn per_lane(&mut self, v: &[&V], name: &'static str, ty: Type) -> V {
        let lanes: Vec<SmallVec<[Value; 4]>> = v.iter().map(|x| self.lanes(x)).collect();
        let params: SmallVec<[Type; 2]> = SmallVec::from_elem(ty, v.len());
        let out: SmallVec<[Value; 4]> = (0..lanes[0].len())
            .map(|k| {
                let args: SmallVec<[Value; 2]> = lanes.iter().map(|l| l[k]).collect();
                self.call(name, &args, &params, ty)
            })
            .collect();
        if matches!(v[0], V::F(_)) {
            V::F(self.pack(&out))
        } else {
            V::L(out)
        }
    }

    /// Brings an integer-computed value back into its dtype's range (u8 wraps, bool is 0/1).
    pub fn normalize(&mut self, v: V, d: DType) -> V {
        match d {
            DType::U8 => self.map(&v, |b, x| b.ins().band_imm_s(x, 0xff)),
            DType::Bool => self.map(&v, |b, x| {
                let c = b.ins().icmp_imm_s(IntCC::NotEqual, x, 0);
                b.ins().uextend(I32, c)
            }),
            _ => v,
        }
    }

    /// Turns an i8 comparison result into a bool lane (i32 0/1).
    fn flag(b: &mut FunctionBuilder<'_>, c: Value) -> Value {
        b.ins().uextend(I32, c)
    }

    /// An f32x4 lane mask (from fcmp) as bool lanes.
    fn mask_to_bool(&mut self, m: Value) -> V {
        let lanes: SmallVec<[Value; 4]> = (0..self.width)
            .map(|k| {
                let x = self.b.ins().extractlane(m, k as u8);
                self.b.ins().band_imm_s(x, 1)
            })
            .collect();
        V::L(lanes)
    }

    /// Bool lanes as an f32x4 lane mask.
    fn bool_to_mask(&mut self, c: &V) -> Value {
        let V::L(l) = c else {
            unreachable!("bools are lanes")
        };
        let mut v = self.b.ins().splat(I32X4, l[0]);
        for (k, &x) in l.iter().enumerate().skip(1) {
            v = self.b.ins().insertlane(v, x, k as u8);
        }
        let zero = self.b.ins().iconst(I32, 0);
        let zero = self.b.ins().splat(I32X4, zero);
        self.b.ins().isub(zero, v)
    }

    fn fconst(&mut self, c: f64, d: DType) -> V {
        let x = if d.compute() == DType::F64 {
            self.b.ins().f64const(c)
        } else {
            self.b.ins().f32const(c as f32)
        };
        self.broadcast(x, d)
    }

    /// Float select `m ? a : b` where `m` comes from [`Self::fcmp`].
    fn fsel(&mut self, m: &Fm, a: &V, b: &V) -> V {
        match (m, a, b) {
            (Fm::Vec(m), V::F(a), V::F(b)) => V::F(self.vm().select(*m, *a, *b)),
            (Fm::Lanes(m), V::L(a), V::L(b)) => V::L(
                (0..a.len())
                    .map(|k| self.b.ins().select(m[k], a[k], b[k]))
                    .collect(),
            ),
            _ => unreachable!(),
        }
    }

    fn fcmp(&mut self, cc: FloatCC, x: &V, y: &V) -> Fm {
        match (x, y) {
            (V::F(a), V::F(b)) => Fm::Vec(self.b.ins().fcmp(cc, *a, *b)),
            (V::L(a), V::L(b)) => Fm::Lanes(
                a.iter()
                    .zip(b)
                    .map(|(&a, &b)| self.b.ins().fcmp(cc, a, b))
                    .collect(),
            ),
            _ => unreachable!(),
        }
    }

    fn fm_to_bool(&mut self, m: Fm) -> V {
        match m {
            Fm::Vec(m) => self.mask_to_bool(m),
            Fm::Lanes(l) => V::L(l.iter().map(|&c| Self::flag(self.b, c)).collect()),
        }
    }

    /// NaN-propagating maximum (`lt == false`) or minimum (`lt == true`).
    fn fminmax(&mut self, x: &V, y: &V, min: bool) -> V {
        let r = match (x, y) {
            // One minps/maxps: `x < y ? x : y` (or `y < x`), which already returns a NaN `y`.
            (V::F(a), V::F(b)) => V::F(if min {
                self.vm().min_else_second(*a, *b)
            } else {
                self.vm().max_else_second(*a, *b)
            }),
            _ => {
                let cc = if min {
                    FloatCC::LessThan
                } else {
                    FloatCC::GreaterThan
                };
                let m = self.fcmp(cc, x, y);
                self.fsel(&m, x, y)
            }
        };
        let nan = self.fcmp(FloatCC::Unordered, x, x);
        self.fsel(&nan, x, &r)
    }

    /// Emits a float unary op; `d` is the (float) dtype computed in.
    fn funary(&mut self, op: UnaryOp, a: &V, d: DType) -> V {
        use UnaryOp::*;
        let f64 = d.compute() == DType::F64;
        let lib = |n32: &'static str, n64: &'static str| if f64 { n64 } else { n32 };
        let ty = lane_ty(d);
        match op {
            Neg => self.map(a, |b, x| b.ins().fneg(x)),
            Abs => self.map(a, |b, x| b.ins().fabs(x)),
            Sqrt => self.map(a, |b, x| b.ins().sqrt(x)),
            Floor => self.map(a, |b, x| b.ins().floor(x)),
            Ceil => self.map(a, |b, x| b.ins().ceil(x)),
            Round => self.map(a, |b, x| b.ins().nearest(x)),
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
                let zero = self.fconst(0.0, d);
                match (&zero, a) {
                    // `x < 0 ? 0 : x` in one maxps; a NaN passes through.
                    (V::F(z), V::F(x)) => V::F(self.vm().max_else_second(*z, *x)),
                    _ => {
                        let m = self.fcmp(FloatCC::LessThan, a, &zero);
                        self.fsel(&m, &zero, a)
                    }
                }
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
            Log1p => self.per_lane(&[a], lib("df_log1p_f32", "df_log1p_f64"), ty),
            Expm1 => self.per_lane(&[a], lib("df_expm1_f32", "df_expm1_f64"), ty),
            Sin => self.per_lane(&[a], lib("df_sin_f32", "df_sin_f64"), ty),
            Cos => self.per_lane(&[a], lib("df_cos_f32", "df_cos_f64"), ty),
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
            LogicalNot | IsNan => unreachable!("handled by unary()"),
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

    /// Emits `op(a)`; `src` is the dtype `a` has, `dst` the result's.
    pub fn unary(&mut self, op: UnaryOp, a: &V, src: DType, dst: DType) -> V {
        use UnaryOp::*;
        match op {
            LogicalNot => self.truthy(a, src, true),
            IsNan if src.is_float() => {
                let m = self.fcmp(FloatCC::Unordered, a, a);
                self.fm_to_bool(m)
            }
            IsNan => {
                let zero = self.b.ins().iconst(I32, 0);
                V::L(SmallVec::from_elem(zero, self.width))
            }
            _ if src.is_float() => self.funary(op, a, src),
            // Integer (and bool) inputs of the remaining ops.
            Neg => {
                let v = self.map(a, |b, x| b.ins().ineg(x));
                self.normalize(v, dst)
            }
            Abs => self.map(a, |b, x| b.ins().iabs(x)),
            Relu => self.map(a, |b, x| {
                let ty = b.func.dfg.value_type(x);
                let z = b.ins().iconst(ty, 0);
                b.ins().smax(x, z)
            }),
            Sign => self.map(a, |b, x| {
                let ty = b.func.dfg.value_type(x);
                let z = b.ins().iconst(ty, 0);
                let gt = b.ins().icmp(IntCC::SignedGreaterThan, x, z);
                let lt = b.ins().icmp(IntCC::SignedLessThan, x, z);
                let gt = b.ins().uextend(ty, gt);
                let lt = b.ins().uextend(ty, lt);
                b.ins().isub(gt, lt)
            }),
            Floor | Ceil | Round => a.clone(),
            other => unreachable!(
                "{} on integers is promoted to float by inference",
                other.name()
            ),
        }
    }

    /// Bool lanes: `x != 0` (or `x == 0` when `invert`).
    fn truthy(&mut self, a: &V, src: DType, invert: bool) -> V {
        if src.is_float() {
            let zero = self.fconst(0.0, src);
            let cc = if invert {
                FloatCC::Equal
            } else {
                FloatCC::NotEqual
            };
            let m = self.fcmp(cc, a, &zero);
            self.fm_to_bool(m)
        } else {
            let cc = if invert {
                IntCC::Equal
            } else {
                IntCC::NotEqual
            };
            self.map(a, |b, x| {
                let c = b.ins().icmp_imm_s(cc, x, 0);
                b.ins().uextend(I32, c)
            })
        }
    }

    /// Emits `op(x, y)`; both are in dtype `src`; the result has dtype `dst`.
    pub fn binary(&mut self, op: BinaryOp, x: &V, y: &V, src: DType, dst: DType) -> V {
        use BinaryOp::*;
        if matches!(op, LogicalAnd | LogicalOr) {
            let a = self.truthy(x, src, false);
            let b = self.truthy(y, src, false);
            return if op == LogicalAnd {
                self.zip(&a, &b, |b, x, y| b.ins().band(x, y))
            } else {
                self.zip(&a, &b, |b, x, y| b.ins().bor(x, y))
            };
        }
        if src.is_float() {
            let ty = lane_ty(src);
            return match op {
                Add => self.zip(x, y, |b, x, y| b.ins().fadd(x, y)),
                Sub => self.zip(x, y, |b, x, y| b.ins().fsub(x, y)),
                Mul => self.zip(x, y, |b, x, y| b.ins().fmul(x, y)),
                Div => self.zip(x, y, |b, x, y| b.ins().fdiv(x, y)),
                Maximum => self.fminmax(x, y, false),
                Minimum => self.fminmax(x, y, true),
                Pow => {
                    let n = if ty == F64 {
                        "df_pow_f64"
                    } else {
                        "df_pow_f32"
                    };
                    self.per_lane(&[x, y], n, ty)
                }
                Remainder => {
                    let n = if ty == F64 {
                        "df_fmod_f64"
                    } else {
                        "df_fmod_f32"
                    };
                    let r = self.per_lane(&[x, y], n, ty);
                    // Python modulo: a non-zero result takes the divisor's sign.
                    let zero = self.fconst(0.0, src);
                    let nz = self.fcmp(FloatCC::NotEqual, &r, &zero);
                    let rneg = self.fcmp(FloatCC::LessThan, &r, &zero);
                    let yneg = self.fcmp(FloatCC::LessThan, y, &zero);
                    let fix = match (nz, rneg, yneg) {
                        (Fm::Vec(a), Fm::Vec(b), Fm::Vec(c)) => {
                            let d = self.b.ins().bxor(b, c);
                            Fm::Vec(self.b.ins().band(a, d))
                        }
                        (Fm::Lanes(a), Fm::Lanes(b), Fm::Lanes(c)) => Fm::Lanes(
                            (0..a.len())
                                .map(|k| {
                                    let d = self.b.ins().bxor(b[k], c[k]);
                                    self.b.ins().band(a[k], d)
                                })
                                .collect(),
                        ),
                        _ => unreachable!(),
                    };
                    let adj = self.zip(&r, y, |b, r, y| b.ins().fadd(r, y));
                    self.fsel(&fix, &adj, &r)
                }
                Eq | Ne | Lt | Le | Gt | Ge => {
                    let cc = match op {
                        Eq => FloatCC::Equal,
                        Ne => FloatCC::NotEqual,
                        Lt => FloatCC::LessThan,
                        Le => FloatCC::LessThanOrEqual,
                        Gt => FloatCC::GreaterThan,
                        _ => FloatCC::GreaterThanOrEqual,
                    };
                    let m = self.fcmp(cc, x, y);
                    self.fm_to_bool(m)
                }
                LogicalAnd | LogicalOr => unreachable!(),
            };
        }
        let r = match op {
            Add => self.zip(x, y, |b, x, y| b.ins().iadd(x, y)),
            Sub => self.zip(x, y, |b, x, y| b.ins().isub(x, y)),
            Mul => self.zip(x, y, |b, x, y| b.ins().imul(x, y)),
            Maximum => self.zip(x, y, |b, x, y| b.ins().smax(x, y)),
            Minimum => self.zip(x, y, |b, x, y| b.ins().smin(x, y)),
            Remainder => self.zip(x, y, |b, x, y| {
                // Division by zero gives 0 instead of trapping; -1 is replaced by 1 (same
                // remainder, 0) so MIN % -1 cannot fault.
                let ty = b.func.dfg.value_type(x);
                let one = b.ins().iconst(ty, 1);
                let bad = b.ins().icmp_imm_s(IntCC::Equal, y, 0);
                let m1 = b.ins().icmp_imm_s(IntCC::Equal, y, -1);
                let bad = b.ins().bor(bad, m1);
                let d = b.ins().select(bad, one, y);
                let r = b.ins().srem(x, d);
                let nz = b.ins().icmp_imm_s(IntCC::NotEqual, r, 0);
                let rn = b.ins().icmp_imm_s(IntCC::SignedLessThan, r, 0);
                let yn = b.ins().icmp_imm_s(IntCC::SignedLessThan, y, 0);
                let diff = b.ins().bxor(rn, yn);
                let fix = b.ins().band(nz, diff);
                let adj = b.ins().iadd(r, y);
                b.ins().select(fix, adj, r)
            }),
            Pow => {
                let xl = self.lanes(x);
                let yl = self.lanes(y);
                let ty = lane_ty(src);
                V::L(
                    (0..xl.len())
                        .map(|k| {
                            let (a, e) = if ty == I64 {
                                (xl[k], yl[k])
                            } else {
                                (
                                    self.b.ins().sextend(I64, xl[k]),
                                    self.b.ins().sextend(I64, yl[k]),
                                )
                            };
                            let r = self.call("df_pow_i64", &[a, e], &[I64, I64], I64);
                            if ty == I64 {
                                r
                            } else {
                                self.b.ins().ireduce(ty, r)
                            }
                        })
                        .collect(),
                )
            }
            Eq | Ne | Lt | Le | Gt | Ge => {
                let cc = match op {
                    Eq => IntCC::Equal,
                    Ne => IntCC::NotEqual,
                    Lt => IntCC::SignedLessThan,
                    Le => IntCC::SignedLessThanOrEqual,
                    Gt => IntCC::SignedGreaterThan,
                    _ => IntCC::SignedGreaterThanOrEqual,
                };
                return self.zip(x, y, |b, x, y| {
                    let c = b.ins().icmp(cc, x, y);
                    b.ins().uextend(I32, c)
                });
            }
            Div => unreachable!("integer division is promoted to float by inference"),
            LogicalAnd | LogicalOr => unreachable!(),
        };
        self.normalize(r, dst)
    }

    /// `cond ? x : y` with bool lanes `cond` and `x`, `y` of dtype `d`.
    pub fn select(&mut self, cond: &V, x: &V, y: &V) -> V {
        match (x, y) {
            (V::F(a), V::F(b)) => {
                let m = self.bool_to_mask(cond);
                V::F(self.vm().select(m, *a, *b))
            }
            (V::L(a), V::L(b)) => {
                let V::L(c) = cond else { unreachable!() };
                V::L(
                    (0..a.len())
                        .map(|k| {
                            let t = self.b.ins().icmp_imm_s(IntCC::NotEqual, c[k], 0);
                            self.b.ins().select(t, a[k], b[k])
                        })
                        .collect(),
                )
            }
            _ => unreachable!(),
        }
    }

    /// Converts `v` from dtype `from` to dtype `to` with PyTorch's rules (float to int
    /// truncates toward zero and saturates, NaN gives 0; to bool is `!= 0`; to f16/bf16 rounds).
    pub fn cast(&mut self, v: &V, from: DType, to: DType) -> V {
        if from == to {
            return v.clone();
        }
        if to == DType::Bool {
            return self.truthy(v, from, false);
        }
        if is_vec(to) {
            let f = if is_vec(from) {
                let V::F(x) = v else { unreachable!() };
                *x
            } else {
                let lanes = self.lanes(v);
                let conv: SmallVec<[Value; 4]> = lanes
                    .iter()
                    .map(|&x| {
                        if from.compute() == DType::F64 {
                            self.b.ins().fdemote(F32, x)
                        } else {
                            self.b.ins().fcvt_from_sint(F32, x)
                        }
                    })
                    .collect();
                self.pack(&conv)
            };
            return match to {
                DType::BF16 => V::F(self.vm().round_bf16(f)),
                DType::F16 => self.per_lane(&[&V::F(f)], "df_round_f16", F32),
                _ => V::F(f),
            };
        }
        let lanes = self.lanes(v);
        let ty = lane_ty(to);
        let out: SmallVec<[Value; 4]> = lanes
            .iter()
            .map(|&x| {
                let xt = self.b.func.dfg.value_type(x);
                match (xt, ty) {
                    (a, b) if a == b => x,
                    (F32, F64) => self.b.ins().fpromote(F64, x),
                    (F32 | F64, I64) => self.b.ins().fcvt_to_sint_sat(I64, x),
                    (F32 | F64, I32) => self.b.ins().fcvt_to_sint_sat(I32, x),
                    (I32 | I64, F64) => self.b.ins().fcvt_from_sint(F64, x),
                    (I32, I64) => self.b.ins().sextend(I64, x),
                    (I64, I32) => self.b.ins().ireduce(I32, x),
                    (a, b) => unreachable!("cast {a} -> {b}"),
                }
            })
            .collect();
        self.normalize(V::L(out), to)
    }
}

/// A float comparison result: an i32x4 mask or one i8 flag per lane.
enum Fm {
    Vec(Value),
    Lanes(SmallVec<[Value; 4]>),
}
