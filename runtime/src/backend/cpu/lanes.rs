//! Values of a loop body and the ops on them.
//!
//! A body is emitted for 4 elements at a time (the main loop) or 1 (the tail). Every dtype
//! computes in 128-bit registers: f32-computed values (f32, f16, bf16) in one f32x4, f64 in
//! two f64x2, i64 in two i64x2, and i32-computed values (i32, u8, bool) in one i32x4. The tail
//! keeps one register with its element in lane 0 and runs the very same instructions as the
//! main loop, so a result never depends on where an element falls.
//!
//! Ops without a (good) x64 lowering for a lane type run per lane: the registers are split into
//! scalars, the scalar op (or helper call) runs on each, and the results are packed again.
//! Those are integer division (remainder, fmod, floor and trunc division) and power, the f64
//! transcendentals, float -> i64 and i64 -> f32 casts.

use super::vmath::VMath;

mod convert;
mod division;
mod float_unary;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, F64, F64X2, I32, I32X4, I64, I64X2, I8X16};
use cranelift_codegen::ir::{
    AbiParam, ConstantData, Endianness, FuncRef, InstBuilder, MemFlagsData, Signature, Type, Value,
};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::JITModule;
use cranelift_module::{Linkage, Module};
use deferfuse_fusion::ir::{BinaryOp, DType, UnaryOp};
use smallvec::SmallVec;
use std::collections::HashMap;

/// One body value.
#[derive(Clone, Debug)]
pub enum V {
    /// An f32x4 register (f32, f16, bf16).
    F(Value),
    /// `width` scalars of the compute type. Accepted everywhere as an input (it is packed into
    /// registers first); the emitter itself only produces it for scalar results such as an
    /// argmax index.
    L(SmallVec<[Value; 4]>),
    /// Registers of the compute type's vector: f64x2 / i64x2 (two at width 4, one at width 1)
    /// or i32x4 (one).
    W(SmallVec<[Value; 2]>),
}

/// Registers of one value.
type Regs = SmallVec<[Value; 2]>;

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

/// The 128-bit vector type holding lanes of scalar type `t`.
fn vec_of(t: Type) -> Type {
    match t {
        F32 => F32X4,
        F64 => F64X2,
        I64 => I64X2,
        I32 => I32X4,
        other => unreachable!("no vector of {other}"),
    }
}

/// Flags for lane-reinterpreting bitcasts.
pub fn vflags() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
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

    /// Calls a function from `jit_calls.rs` (declared on first use).
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

    /// `x` reinterpreted as vector type `vt` (no instruction if it has that type).
    fn retype(&mut self, vt: Type, x: Value) -> Value {
        if self.b.func.dfg.value_type(x) == vt {
            x
        } else {
            self.b.ins().bitcast(vt, vflags(), x)
        }
    }

    /// Registers a value of vector type `vt` takes at the current width.
    pub fn regs(&self, vt: Type) -> usize {
        (self.width * vt.lane_bits() as usize).div_ceil(128)
    }

    /// The lanes of `v` as `width` scalars (registers are split).
    pub fn lanes(&mut self, v: &V) -> SmallVec<[Value; 4]> {
        match v {
            V::L(l) => l.clone(),
            V::F(x) => (0..self.width)
                .map(|k| self.b.ins().extractlane(*x, k as u8))
                .collect(),
            V::W(r) => {
                let per = self.b.func.dfg.value_type(r[0]).lane_count() as usize;
                (0..self.width)
                    .map(|k| self.b.ins().extractlane(r[k / per], (k % per) as u8))
                    .collect()
            }
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

    /// Packs `width` scalars of one type into that type's registers.
    pub fn pack_lanes(&mut self, lanes: &[Value]) -> V {
        let t = self.b.func.dfg.value_type(lanes[0]);
        if t == F32 {
            return V::F(self.pack(lanes));
        }
        let vt = vec_of(t);
        let per = vt.lane_count() as usize;
        V::W(
            lanes
                .chunks(per)
                .map(|c| {
                    let mut v = self.b.ins().splat(vt, c[0]);
                    for (k, &l) in c.iter().enumerate().skip(1) {
                        v = self.b.ins().insertlane(v, l, k as u8);
                    }
                    v
                })
                .collect(),
        )
    }

    /// `v` in register form (scalar lanes are packed).
    pub fn vector(&mut self, v: &V) -> V {
        match v {
            V::L(l) => self.pack_lanes(l),
            _ => v.clone(),
        }
    }

    /// The registers of `v` (an f32x4 is one).
    fn regs_of(&mut self, v: &V) -> Regs {
        match self.vector(v) {
            V::F(x) => SmallVec::from_elem(x, 1),
            V::W(r) => r,
            V::L(_) => unreachable!("packed above"),
        }
    }

    /// A value of registers `r` (f32x4 registers make a `V::F`).
    fn of_regs(&mut self, r: Regs) -> V {
        if self.b.func.dfg.value_type(r[0]) == F32X4 {
            V::F(r[0])
        } else {
            V::W(r)
        }
    }

    /// A value holding `x` in every lane, in `d`'s representation.
    pub fn broadcast(&mut self, x: Value, d: DType) -> V {
        if is_vec(d) {
            V::F(self.b.ins().splat(F32X4, x))
        } else {
            let vt = vec_of(lane_ty(d));
            let s = self.b.ins().splat(vt, x);
            V::W(SmallVec::from_elem(s, self.regs(vt)))
        }
    }

    /// A register of vector type `vt` holding integer `c` in every lane.
    fn isplat(&mut self, vt: Type, c: i64) -> Value {
        let x = self.b.ins().iconst(vt.lane_type(), c);
        self.b.ins().splat(vt, x)
    }

    fn map(&mut self, v: &V, mut f: impl FnMut(&mut FunctionBuilder<'b>, Value) -> Value) -> V {
        let r: Regs = self.regs_of(v).iter().map(|&x| f(self.b, x)).collect();
        self.of_regs(r)
    }

    fn zip(
        &mut self,
        x: &V,
        y: &V,
        mut f: impl FnMut(&mut FunctionBuilder<'b>, Value, Value) -> Value,
    ) -> V {
        let (a, b) = (self.regs_of(x), self.regs_of(y));
        assert_eq!(a.len(), b.len(), "operands share a representation");
        let r: Regs = a.iter().zip(&b).map(|(&a, &b)| f(self.b, a, b)).collect();
        self.of_regs(r)
    }

    /// Runs `f` on each lane's scalars (the operands split into lanes) and packs the results:
    /// the fallback for ops without a vector lowering.
    fn lanewise(&mut self, v: &[&V], mut f: impl FnMut(&mut Self, &[Value]) -> Value) -> V {
        let lanes: Vec<SmallVec<[Value; 4]>> = v.iter().map(|x| self.lanes(x)).collect();
        let out: SmallVec<[Value; 4]> = (0..self.width)
            .map(|k| {
                let args: SmallVec<[Value; 2]> = lanes.iter().map(|l| l[k]).collect();
                f(self, &args)
            })
            .collect();
        self.pack_lanes(&out)
    }

    /// Applies a scalar helper lane by lane.
    fn per_lane(&mut self, v: &[&V], name: &'static str, ty: Type) -> V {
        let params: SmallVec<[Type; 2]> = SmallVec::from_elem(ty, v.len());
        self.lanewise(v, |e, args| e.call(name, args, &params, ty))
    }

    /// Brings an integer-computed value back into its dtype's range (u8 wraps, bool is 0/1).
    pub fn normalize(&mut self, v: V, d: DType) -> V {
        match d {
            DType::U8 => {
                let k = self.isplat(I32X4, 0xff);
                self.map(&v, |b, x| b.ins().band(x, k))
            }
            DType::Bool => {
                let zero = self.isplat(I32X4, 0);
                let m = self.map(&v, |b, x| b.ins().icmp(IntCC::NotEqual, x, zero));
                let r = self.regs_of(&m);
                self.mask_to_bool(&r)
            }
            _ => v,
        }
    }

    /// The low 32 bits of each 64-bit lane of `r` (one or two registers) as one i32x4:
    /// lanes 0 and 2 of each register's i32 view, in one shufps.
    pub(super) fn low_words(&mut self, r: &[Value]) -> Value {
        let b = *r.get(1).unwrap_or(&r[0]);
        let mask = [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27];
        self.byte_shuffle(r[0], b, mask, I32X4)
    }

    /// Bytes of `a` (indices 0-15) and `b` (16-31) picked by `mask`, as a register of type
    /// `vt`: one shuffle instruction whatever the lane types.
    pub(super) fn byte_shuffle(&mut self, a: Value, b: Value, mask: [u8; 16], vt: Type) -> Value {
        let a8 = self.b.ins().bitcast(I8X16, vflags(), a);
        let b8 = self.b.ins().bitcast(I8X16, vflags(), b);
        let imm = self
            .b
            .func
            .dfg
            .immediates
            .push(ConstantData::from(&mask[..]));
        let s = self.b.ins().shuffle(a8, b8, imm);
        self.b.ins().bitcast(vt, vflags(), s)
    }

    /// Lane masks (all ones or zeros: i32x4 or i64x2 registers) as bool lanes (an i32x4 of 0/1).
    fn mask_to_bool(&mut self, m: &[Value]) -> V {
        let t = self.b.func.dfg.value_type(m[0]);
        let m32 = if t == I32X4 {
            m[0]
        } else if t.lane_bits() == 64 {
            self.low_words(m)
        } else {
            self.b.ins().bitcast(I32X4, vflags(), m[0])
        };
        let one = self.isplat(I32X4, 1);
        V::W(SmallVec::from_elem(self.b.ins().band(m32, one), 1))
    }

    /// Bool lanes as lane masks for data registers of vector type `vt` (one mask per register).
    fn bool_to_mask(&mut self, c: &V, vt: Type) -> Regs {
        let c = self.regs_of(c)[0];
        if vt.lane_bits() == 32 {
            let zero = self.isplat(I32X4, 0);
            return SmallVec::from_elem(self.b.ins().icmp(IntCC::SignedGreaterThan, c, zero), 1);
        }
        let zero = self.isplat(I64X2, 0);
        let mut wide: Regs = SmallVec::new();
        wide.push(self.b.ins().swiden_low(c));
        if self.regs(vt) == 2 {
            wide.push(self.b.ins().swiden_high(c));
        }
        wide.iter()
            .map(|&w| self.b.ins().icmp(IntCC::SignedGreaterThan, w, zero))
            .collect()
    }

    /// `m ? a : b` per register, with masks `m` matching the registers of `a` and `b`.
    fn bitsel(&mut self, m: &[Value], a: &V, b: &V) -> V {
        let (ar, br) = (self.regs_of(a), self.regs_of(b));
        let r: Regs = (0..ar.len())
            .map(|k| {
                let t = self.b.func.dfg.value_type(ar[k]);
                if t.is_float() {
                    // On the integer view, so that the compare is the mask: one blend.
                    let it = t.as_int();
                    let ai = self.b.ins().bitcast(it, vflags(), ar[k]);
                    let bi = self.b.ins().bitcast(it, vflags(), br[k]);
                    let mi = self.retype(it, m[k]);
                    let r = self.b.ins().bitselect(mi, ai, bi);
                    self.b.ins().bitcast(t, vflags(), r)
                } else {
                    let mi = self.retype(t, m[k]);
                    self.b.ins().bitselect(mi, ar[k], br[k])
                }
            })
            .collect();
        self.of_regs(r)
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
        match (a, b) {
            (V::F(a), V::F(b)) => V::F(self.vm().select(m.0[0], *a, *b)),
            _ => self.bitsel(&m.0, a, b),
        }
    }

    fn fcmp(&mut self, cc: FloatCC, x: &V, y: &V) -> Fm {
        let (a, b) = (self.regs_of(x), self.regs_of(y));
        Fm(a.iter()
            .zip(&b)
            .map(|(&a, &b)| self.b.ins().fcmp(cc, a, b))
            .collect())
    }

    fn fm_to_bool(&mut self, m: Fm) -> V {
        self.mask_to_bool(&m.0)
    }

    /// `a < b ? a : b` (`min`) or `b < a ? a : b`, per register: one minps/minpd (maxps/maxpd),
    /// which returns `b` when either is NaN.
    fn else_second(&mut self, x: &V, y: &V, min: bool) -> V {
        self.zip(x, y, |b, x, y| {
            let t = b.func.dfg.value_type(x);
            let m = if min {
                b.ins().fcmp(FloatCC::LessThan, x, y)
            } else {
                b.ins().fcmp(FloatCC::LessThan, y, x)
            };
            let m = b.ins().bitcast(t, vflags(), m);
            b.ins().bitselect(m, x, y)
        })
    }

    /// NaN-propagating maximum (`min == false`) or minimum.
    fn fminmax(&mut self, x: &V, y: &V, min: bool) -> V {
        let r = self.else_second(x, y, min);
        let nan = self.fcmp(FloatCC::Unordered, x, x);
        self.fsel(&nan, x, &r)
    }

    /// An integer register of `x`'s type holding `c` in every lane.
    fn ilike(b: &mut FunctionBuilder<'_>, x: Value, c: i64) -> Value {
        let t = b.func.dfg.value_type(x);
        let s = b.ins().iconst(t.lane_type(), c);
        b.ins().splat(t, s)
    }

    /// Emits `op(a)`; `src` is the dtype `a` has, `dst` the result's.
    pub fn unary(&mut self, op: UnaryOp, a: &V, src: DType, dst: DType) -> V {
        use UnaryOp::*;
        let a = &self.vector(a);
        match op {
            LogicalNot => self.truthy(a, src, true),
            // Inference rejects floats; on bool, ~x is logical not.
            BitwiseNot if src == DType::Bool => self.truthy(a, src, true),
            IsNan if src.is_float() => {
                let m = self.fcmp(FloatCC::Unordered, a, a);
                self.fm_to_bool(m)
            }
            IsNan => {
                let zero = self.b.ins().iconst(I32, 0);
                self.broadcast(zero, DType::Bool)
            }
            _ if src.is_float() => self.funary(op, a, src),
            // Integer (and bool) inputs of the remaining ops.
            Neg => {
                let v = self.map(a, |b, x| b.ins().ineg(x));
                self.normalize(v, dst)
            }
            Abs => self.map(a, |b, x| b.ins().iabs(x)),
            BitwiseNot => {
                let v = self.map(a, |b, x| b.ins().bnot(x));
                self.normalize(v, dst)
            }
            Relu => self.map(a, |b, x| {
                let z = Self::ilike(b, x, 0);
                b.ins().smax(x, z)
            }),
            // gt - lt with all-ones masks: lt_mask - gt_mask.
            Sign => self.map(a, |b, x| {
                let z = Self::ilike(b, x, 0);
                let gt = b.ins().icmp(IntCC::SignedGreaterThan, x, z);
                let lt = b.ins().icmp(IntCC::SignedLessThan, x, z);
                b.ins().isub(lt, gt)
            }),
            Floor | Ceil | Round | Trunc => a.clone(),
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
            let m = self.map(a, |b, x| {
                let z = Self::ilike(b, x, 0);
                b.ins().icmp(cc, x, z)
            });
            let r = self.regs_of(&m);
            self.mask_to_bool(&r)
        }
    }

    /// Emits `op(x, y)`; both are in dtype `src`; the result has dtype `dst`.
    pub fn binary(&mut self, op: BinaryOp, x: &V, y: &V, src: DType, dst: DType) -> V {
        use BinaryOp::*;
        let (x, y) = (&self.vector(x), &self.vector(y));
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
                Remainder | Fmod | FloorDivide | TruncDivide => self.float_division(op, x, y, src),
                Atan2 if ty == F64 => self.per_lane(&[x, y], "df_atan2_f64", ty),
                // atan2(first operand, second), inline at both widths (no row routine).
                Atan2 => self.zip(x, y, |b, first, second| VMath { b }.atan2(first, second)),
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
                BitwiseAnd | BitwiseOr | BitwiseXor => {
                    unreachable!("inference rejects float operands of {}", op.name())
                }
            };
        }
        let r = match op {
            Add => self.zip(x, y, |b, x, y| b.ins().iadd(x, y)),
            Sub => self.zip(x, y, |b, x, y| b.ins().isub(x, y)),
            Mul => self.zip(x, y, |b, x, y| b.ins().imul(x, y)),
            Maximum => self.zip(x, y, |b, x, y| b.ins().smax(x, y)),
            Minimum => self.zip(x, y, |b, x, y| b.ins().smin(x, y)),
            BitwiseAnd => self.zip(x, y, |b, x, y| b.ins().band(x, y)),
            BitwiseOr => self.zip(x, y, |b, x, y| b.ins().bor(x, y)),
            BitwiseXor => self.zip(x, y, |b, x, y| b.ins().bxor(x, y)),
            Remainder | Fmod | FloorDivide | TruncDivide => self.int_division(op, x, y),
            Pow => {
                let ty = lane_ty(src);
                self.lanewise(&[x, y], |e, l| {
                    let (a, p) = if ty == I64 {
                        (l[0], l[1])
                    } else {
                        (e.b.ins().sextend(I64, l[0]), e.b.ins().sextend(I64, l[1]))
                    };
                    let r = e.call("df_pow_i64", &[a, p], &[I64, I64], I64);
                    if ty == I64 {
                        r
                    } else {
                        e.b.ins().ireduce(ty, r)
                    }
                })
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
                let m = self.zip(x, y, |b, x, y| b.ins().icmp(cc, x, y));
                let r = self.regs_of(&m);
                return self.mask_to_bool(&r);
            }
            Div | Atan2 => unreachable!(
                "{} of integers is promoted to float by inference",
                op.name()
            ),
            LogicalAnd | LogicalOr => unreachable!(),
        };
        self.normalize(r, dst)
    }

    /// `cond ? x : y` with bool lanes `cond` and `x`, `y` of dtype `d`.
    pub fn select(&mut self, cond: &V, x: &V, y: &V) -> V {
        let (x, y) = (self.vector(x), self.vector(y));
        match (&x, &y) {
            (V::F(a), V::F(b)) => {
                let m = self.bool_to_mask(cond, F32X4)[0];
                V::F(self.vm().select(m, *a, *b))
            }
            (V::W(a), _) => {
                let vt = self.b.func.dfg.value_type(a[0]);
                let m = self.bool_to_mask(cond, vt);
                self.bitsel(&m, &x, &y)
            }
            _ => unreachable!("operands share a representation"),
        }
    }
}

/// A float comparison result: one lane mask per register (i32x4 for f32x4, i64x2 for f64x2).
struct Fm(Regs);
