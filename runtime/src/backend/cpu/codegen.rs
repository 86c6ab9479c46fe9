//! Compiles a [`LoopRegion`] into one native function.
//!
//! Kernel ABI (all i64): `(ptrs, strides, scalars, n_outer, n_inner)`, where `ptrs[j]` is operand
//! j's first element, `strides[2j]`/`strides[2j+1]` its outer/inner stride in bytes, and
//! `scalars[p]` the 64 bits of parameter slot p. Operands are inputs then outputs. The kernel
//! walks `n_outer x n_inner` elements; the executor walks any further dims. Because sizes and
//! strides are arguments, one compiled kernel serves every size of its shape class.

use super::lanes::{is_vec, lane_ty, Emitter, V};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, F64, I32, I64};
use cranelift_codegen::ir::{
    AbiParam, Block, BlockArg, InstBuilder, MemFlagsData, Signature, Value,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::JITModule;
use deferfuse_fusion::ir::{DType, ReduceOp};
use deferfuse_fusion::region::{InstrKind, LoopOperand, LoopRegion};
use deferfuse_fusion::StrideKind;
use smallvec::SmallVec;

/// Loads and stores touch user buffers the executor has checked; they never trap.
fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// The kernel's signature.
pub fn signature(module: &JITModule) -> Signature {
    use cranelift_module::Module;
    let mut sig = Signature::new(module.isa().default_call_conv());
    for _ in 0..5 {
        sig.params.push(AbiParam::new(I64));
    }
    sig
}

/// Per-operand row state inside the outer loop.
struct Operand {
    desc: LoopOperand,
    row: Value,
    inner: Value,
}

struct Kernel<'r> {
    region: &'r LoopRegion,
    ops: Vec<Operand>,
    /// Parameter slot values, loaded once in the entry block (as scalars).
    params: Vec<Value>,
}

impl Kernel<'_> {
    fn addr(&self, e: &mut Emitter, j: usize, i: Value) -> Value {
        let op = &self.ops[j];
        match op.desc.inner {
            StrideKind::Bcast => op.row,
            StrideKind::Contig => {
                let off = e.b.ins().imul_imm_s(i, op.desc.dtype.size() as i64);
                e.b.ins().iadd(op.row, off)
            }
            StrideKind::Strided => {
                let off = e.b.ins().imul(i, op.inner);
                e.b.ins().iadd(op.row, off)
            }
        }
    }

    fn load_scalar(e: &mut Emitter, d: DType, a: Value) -> Value {
        match d {
            DType::F32 => e.b.ins().load(F32, mem(), a, 0),
            DType::F64 => e.b.ins().load(F64, mem(), a, 0),
            DType::I32 => e.b.ins().load(I32, mem(), a, 0),
            DType::I64 => e.b.ins().load(I64, mem(), a, 0),
            DType::U8 | DType::Bool => e.b.ins().uload8(I32, mem(), a, 0),
            DType::BF16 => {
                let h = e.b.ins().uload16(I32, mem(), a, 0);
                let w = e.b.ins().ishl_imm_s(h, 16);
                e.b.ins().bitcast(F32, MemFlagsData::new(), w)
            }
            DType::F16 => {
                let h = e.b.ins().uload16(I32, mem(), a, 0);
                e.call("df_f16_to_f32", &[h], &[I32], F32)
            }
        }
    }

    /// Loads `e.width` elements of input `j` starting at element `i`.
    fn load(&self, e: &mut Emitter, j: usize, i: Value) -> V {
        let d = self.ops[j].desc.dtype;
        let kind = self.ops[j].desc.inner;
        if d == DType::F32 && kind == StrideKind::Contig && e.width == 4 {
            let a = self.addr(e, j, i);
            return V::F(e.b.ins().load(F32X4, mem(), a, 0));
        }
        let n = if kind == StrideKind::Bcast {
            1
        } else {
            e.width
        };
        let mut lanes: SmallVec<[Value; 4]> = SmallVec::new();
        for k in 0..n {
            let ik = if k == 0 {
                i
            } else {
                e.b.ins().iadd_imm_s(i, k as i64)
            };
            let a = self.addr(e, j, ik);
            lanes.push(Self::load_scalar(e, d, a));
        }
        if is_vec(d) {
            if n == 1 {
                V::F(e.b.ins().splat(F32X4, lanes[0]))
            } else {
                V::F(e.pack(&lanes))
            }
        } else {
            while lanes.len() < e.width {
                lanes.push(lanes[0]);
            }
            V::L(lanes)
        }
    }

    fn store_scalar(e: &mut Emitter, d: DType, x: Value, a: Value) {
        match d {
            DType::F32 | DType::F64 | DType::I32 | DType::I64 => {
                e.b.ins().store(mem(), x, a, 0);
            }
            DType::U8 | DType::Bool => {
                e.b.ins().istore8(mem(), x, a, 0);
            }
            DType::BF16 => {
                let w = e.b.ins().bitcast(I32, MemFlagsData::new(), x);
                let w = e.b.ins().ushr_imm_s(w, 16);
                e.b.ins().istore16(mem(), w, a, 0);
            }
            DType::F16 => {
                let h = e.call("df_f32_to_f16", &[x], &[F32], I32);
                e.b.ins().istore16(mem(), h, a, 0);
            }
        }
    }

    /// Stores `v` (dtype `vd`) to output operand `j` at element `i`, converting to its dtype.
    fn store(&self, e: &mut Emitter, j: usize, i: Value, v: &V, vd: DType) {
        let d = self.ops[j].desc.dtype;
        // bf16 rounding happens here as a vector op; a plain f32 value is rounded first.
        let mut v = e.cast(v, vd, d);
        if let (DType::BF16, V::F(x)) = (d, &v) {
            // Values computed as bf16 are rounded once, on store (a no-op after a cast).
            v = V::F(e.vm().round_bf16(*x));
        }
        if let (DType::F32, StrideKind::Contig, 4, V::F(x)) =
            (d, self.ops[j].desc.inner, e.width, &v)
        {
            let a = self.addr(e, j, i);
            e.b.ins().store(mem(), *x, a, 0);
            return;
        }
        let lanes = e.lanes(&v);
        for (k, &x) in lanes.iter().enumerate().take(e.width) {
            let ik = if k == 0 {
                i
            } else {
                e.b.ins().iadd_imm_s(i, k as i64)
            };
            let a = self.addr(e, j, ik);
            Self::store_scalar(e, d, x, a);
        }
    }

    /// Stores every element output at element `i`.
    fn store_elements(&self, e: &mut Emitter, i: Value, vals: &[(V, DType)]) {
        let n_in = self.region.inputs.len();
        for (j, (v, _)) in self.region.outputs.iter().enumerate() {
            let (val, vd) = &vals[*v as usize];
            self.store(e, n_in + j, i, val, *vd);
        }
    }

    /// Operand index of the reduction's per-row output.
    fn reduce_out(&self) -> usize {
        self.region.inputs.len() + self.region.outputs.len()
    }

    /// Emits the body at element `i`; returns every value with its dtype.
    fn body(&self, e: &mut Emitter, i: Value) -> Vec<(V, DType)> {
        let mut vals: Vec<(V, DType)> = Vec::with_capacity(self.region.body.len());
        for ins in &self.region.body {
            let get = |k: u32| vals[k as usize].clone();
            let v = match &ins.kind {
                InstrKind::Load(n) => self.load(e, *n as usize, i),
                InstrKind::Param(p) => {
                    let x = self.params[*p as usize];
                    // u8 scalars wrap, like a store would; bools arrive as 0/1 already.
                    let v = e.broadcast(x, ins.dtype);
                    e.normalize(v, ins.dtype)
                }
                InstrKind::Unary(u, a) => {
                    let (a, ad) = get(*a);
                    e.unary(*u, &a, ad, ins.dtype)
                }
                InstrKind::Binary(b, x, y) => {
                    let (x, xd) = get(*x);
                    let (y, _) = get(*y);
                    e.binary(*b, &x, &y, xd, ins.dtype)
                }
                InstrKind::Where(c, x, y) => {
                    let (c, _) = get(*c);
                    let (x, _) = get(*x);
                    let (y, _) = get(*y);
                    e.select(&c, &x, &y)
                }
                InstrKind::Cast(a) => {
                    let (a, ad) = get(*a);
                    e.cast(&a, ad, ins.dtype)
                }
            };
            vals.push((v, ins.dtype));
        }
        vals
    }
}

fn flatten(v: &V) -> Vec<Value> {
    match v {
        V::F(x) => vec![*x],
        V::L(l) => l.to_vec(),
    }
}

fn block_args(v: &[Value]) -> Vec<BlockArg> {
    v.iter().map(|&x| BlockArg::Value(x)).collect()
}

/// Adds block params shaped like `proto` and returns them as a value.
fn params_like(b: &mut FunctionBuilder, blk: Block, proto: &V) -> V {
    match proto {
        V::F(_) => V::F(b.append_block_param(blk, F32X4)),
        V::L(l) => {
            let ty = b.func.dfg.value_type(l[0]);
            V::L(l.iter().map(|_| b.append_block_param(blk, ty)).collect())
        }
    }
}

/// Builds the kernel for `region` into `b`'s function.
pub fn build(region: &LoopRegion, b: &mut FunctionBuilder, module: &mut JITModule) {
    let mut e = Emitter::new(b, module);
    let entry = e.b.create_block();
    e.b.append_block_params_for_function_params(entry);
    e.b.switch_to_block(entry);
    let args = e.b.block_params(entry).to_vec();
    let (ptrs, strides, scalars, n_outer, n_inner) = (args[0], args[1], args[2], args[3], args[4]);

    let params: Vec<Value> = region
        .params
        .iter()
        .enumerate()
        .map(|(p, &d)| {
            let bits = e.b.ins().load(I64, mem(), scalars, (p * 8) as i32);
            match d.compute() {
                DType::F32 => {
                    let f = e.b.ins().bitcast(F64, MemFlagsData::new(), bits);
                    e.b.ins().fdemote(F32, f)
                }
                DType::F64 => e.b.ins().bitcast(F64, MemFlagsData::new(), bits),
                DType::I64 => bits,
                _ => e.b.ins().ireduce(I32, bits),
            }
        })
        .collect();
    let descs: Vec<LoopOperand> = region
        .inputs
        .iter()
        .copied()
        .chain(region.outputs.iter().map(|(_, o)| *o))
        .chain(region.reduce.iter().map(|r| r.output))
        .collect();
    let bases: Vec<(Value, Value, Value)> = (0..descs.len())
        .map(|j| {
            let p = e.b.ins().load(I64, mem(), ptrs, (j * 8) as i32);
            let so = e.b.ins().load(I64, mem(), strides, (j * 16) as i32);
            let si = e.b.ins().load(I64, mem(), strides, (j * 16 + 8) as i32);
            (p, so, si)
        })
        .collect();

    let outer_head = e.b.create_block();
    let o = e.b.append_block_param(outer_head, I64);
    let outer_body = e.b.create_block();
    let outer_latch = e.b.create_block();
    let exit = e.b.create_block();
    let zero = e.b.ins().iconst(I64, 0);
    e.b.ins().jump(outer_head, &[BlockArg::Value(zero)]);

    e.b.switch_to_block(outer_head);
    let more = e.b.ins().icmp(IntCC::SignedLessThan, o, n_outer);
    e.b.ins().brif(more, outer_body, &[], exit, &[]);

    e.b.switch_to_block(outer_body);
    let ops: Vec<Operand> = descs
        .iter()
        .zip(&bases)
        .map(|(d, &(p, so, si))| {
            let off = e.b.ins().imul(o, so);
            Operand {
                desc: *d,
                row: e.b.ins().iadd(p, off),
                inner: si,
            }
        })
        .collect();
    let k = Kernel {
        region,
        ops,
        params,
    };
    match &region.reduce {
        None => elementwise_rows(&k, &mut e, n_inner, outer_latch),
        Some(r) if r.op.is_arg() => {
            arg_reduce_rows(&k, &mut e, n_inner, outer_latch, r.op, r.value)
        }
        Some(r) => reduce_rows(&k, &mut e, n_inner, outer_latch, r.op, r.value),
    }

    e.b.switch_to_block(outer_latch);
    let o1 = e.b.ins().iadd_imm_s(o, 1);
    e.b.ins().jump(outer_head, &[BlockArg::Value(o1)]);

    e.b.switch_to_block(exit);
    e.b.ins().return_(&[]);
    e.b.seal_all_blocks();
}

/// Main loop of 4 elements, then a tail of 1, storing every output.
fn elementwise_rows(k: &Kernel, e: &mut Emitter, n: Value, done: Block) {
    let vhead = e.b.create_block();
    let i = e.b.append_block_param(vhead, I64);
    let vbody = e.b.create_block();
    let thead = e.b.create_block();
    let ti = e.b.append_block_param(thead, I64);
    let tbody = e.b.create_block();
    let zero = e.b.ins().iconst(I64, 0);
    e.b.ins().jump(vhead, &[BlockArg::Value(zero)]);

    for (head, idx, body, step, width) in
        [(vhead, i, vbody, 4i64, 4usize), (thead, ti, tbody, 1, 1)]
    {
        e.b.switch_to_block(head);
        let end = e.b.ins().iadd_imm_s(idx, step);
        let fits = e.b.ins().icmp(IntCC::SignedLessThanOrEqual, end, n);
        let next = if width == 4 { thead } else { done };
        let next_args = if width == 4 {
            vec![BlockArg::Value(idx)]
        } else {
            vec![]
        };
        e.b.ins().brif(fits, body, &[], next, &next_args);
        e.b.switch_to_block(body);
        e.width = width;
        let vals = k.body(e, idx);
        k.store_elements(e, idx, &vals);
        e.b.ins().jump(head, &[BlockArg::Value(end)]);
    }
}

fn fold(e: &mut Emitter, op: ReduceOp, acc: &V, v: &V, d: DType) -> V {
    use deferfuse_fusion::ir::BinaryOp::*;
    let b = match op {
        ReduceOp::Sum | ReduceOp::Mean => Add,
        ReduceOp::Prod => Mul,
        ReduceOp::Amax => Maximum,
        ReduceOp::Amin => Minimum,
        _ => unreachable!(),
    };
    e.binary(b, acc, v, d, d)
}

fn init(e: &mut Emitter, op: ReduceOp, d: DType) -> V {
    let ty = lane_ty(d);
    let x = if ty == F32 || ty == F64 {
        let c = match op {
            ReduceOp::Sum | ReduceOp::Mean => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Amax => f64::NEG_INFINITY,
            _ => f64::INFINITY,
        };
        if ty == F32 {
            e.b.ins().f32const(c as f32)
        } else {
            e.b.ins().f64const(c)
        }
    } else {
        let (min, max) = if ty == I64 {
            (i64::MIN, i64::MAX)
        } else {
            (i32::MIN as i64, i32::MAX as i64)
        };
        let c = match op {
            ReduceOp::Sum | ReduceOp::Mean => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Amax => min,
            _ => max,
        };
        e.b.ins().iconst(ty, c)
    };
    e.broadcast(x, d)
}

/// Sum/mean/prod/amax/amin of each row: four lanes fold in the main loop, then the lanes are
/// combined pairwise and the tail folds into the result.
fn reduce_rows(k: &Kernel, e: &mut Emitter, n: Value, done: Block, op: ReduceOp, value: u32) {
    let d = k.region.body[value as usize].dtype;
    let out_j = k.reduce_out();
    e.width = 4;
    let acc0 = init(e, op, d);
    // Main loop: 8 elements, two independent 4-lane accumulators (hides the fold's latency).
    let v8head = e.b.create_block();
    let i = e.b.append_block_param(v8head, I64);
    let acc_a = params_like(e.b, v8head, &acc0);
    let acc_b = params_like(e.b, v8head, &acc0);
    let v8body = e.b.create_block();
    let v4check = e.b.create_block();
    let i4 = e.b.append_block_param(v4check, I64);
    let a4 = params_like(e.b, v4check, &acc0);
    let b4 = params_like(e.b, v4check, &acc0);
    let v4body = e.b.create_block();
    let hsum = e.b.create_block();
    let hi = e.b.append_block_param(hsum, I64);
    let ha = params_like(e.b, hsum, &acc0);
    let hb = params_like(e.b, hsum, &acc0);
    let args = |i: Value, x: &V, y: &V| {
        let mut a = vec![BlockArg::Value(i)];
        a.extend(block_args(&flatten(x)));
        a.extend(block_args(&flatten(y)));
        a
    };
    let zero = e.b.ins().iconst(I64, 0);
    e.b.ins().jump(v8head, &args(zero, &acc0, &acc0));

    e.b.switch_to_block(v8head);
    let end8 = e.b.ins().iadd_imm_s(i, 8);
    let fits = e.b.ins().icmp(IntCC::SignedLessThanOrEqual, end8, n);
    e.b.ins()
        .brif(fits, v8body, &[], v4check, &args(i, &acc_a, &acc_b));

    e.b.switch_to_block(v8body);
    let vals = k.body(e, i);
    k.store_elements(e, i, &vals);
    let na = fold(e, op, &acc_a, &vals[value as usize].0, d);
    let j = e.b.ins().iadd_imm_s(i, 4);
    let vals = k.body(e, j);
    k.store_elements(e, j, &vals);
    let nb = fold(e, op, &acc_b, &vals[value as usize].0, d);
    e.b.ins().jump(v8head, &args(end8, &na, &nb));

    // At most one more chunk of 4.
    e.b.switch_to_block(v4check);
    let end4 = e.b.ins().iadd_imm_s(i4, 4);
    let fits = e.b.ins().icmp(IntCC::SignedLessThanOrEqual, end4, n);
    e.b.ins().brif(fits, v4body, &[], hsum, &args(i4, &a4, &b4));

    e.b.switch_to_block(v4body);
    let vals = k.body(e, i4);
    k.store_elements(e, i4, &vals);
    let na = fold(e, op, &a4, &vals[value as usize].0, d);
    e.b.ins().jump(hsum, &args(end4, &na, &b4));

    // Combine the accumulators, then the 4 lanes: (l0 + l1) + (l2 + l3), as width-1 values.
    e.b.switch_to_block(hsum);
    let acc = fold(e, op, &ha, &hb, d);
    let i = hi;
    let lanes = e.lanes(&acc);
    e.width = 1;
    let l: Vec<V> = lanes.iter().map(|&x| e.broadcast(x, d)).collect();
    let p01 = fold(e, op, &l[0], &l[1], d);
    let p23 = fold(e, op, &l[2], &l[3], d);
    let total = fold(e, op, &p01, &p23, d);
    let thead = e.b.create_block();
    let ti = e.b.append_block_param(thead, I64);
    let tacc = params_like(e.b, thead, &total);
    let tbody = e.b.create_block();
    let finish = e.b.create_block();
    let mut a = vec![BlockArg::Value(i)];
    a.extend(block_args(&flatten(&total)));
    e.b.ins().jump(thead, &a);

    e.b.switch_to_block(thead);
    let more = e.b.ins().icmp(IntCC::SignedLessThan, ti, n);
    e.b.ins().brif(more, tbody, &[], finish, &[]);

    e.b.switch_to_block(tbody);
    let vals = k.body(e, ti);
    k.store_elements(e, ti, &vals);
    let next = fold(e, op, &tacc, &vals[value as usize].0, d);
    let ti1 = e.b.ins().iadd_imm_s(ti, 1);
    let mut a = vec![BlockArg::Value(ti1)];
    a.extend(block_args(&flatten(&next)));
    e.b.ins().jump(thead, &a);

    e.b.switch_to_block(finish);
    let mut result = tacc;
    if op == ReduceOp::Mean {
        let ty = lane_ty(d);
        let nf = e.b.ins().fcvt_from_sint(ty, n);
        let nv = e.broadcast(nf, d);
        result = e.binary(deferfuse_fusion::ir::BinaryOp::Div, &result, &nv, d, d);
    }
    let z = e.b.ins().iconst(I64, 0);
    k.store(e, out_j, z, &result, d);
    e.b.ins().jump(done, &[]);
}

/// argmax/argmin of each row, element by element: the first extreme wins and NaN counts as the
/// extreme (PyTorch's rule).
fn arg_reduce_rows(k: &Kernel, e: &mut Emitter, n: Value, done: Block, op: ReduceOp, value: u32) {
    let d = k.region.body[value as usize].dtype;
    let out_j = k.reduce_out();
    e.width = 1;
    let zero = e.b.ins().iconst(I64, 0);
    let first = k.body(e, zero);
    k.store_elements(e, zero, &first);
    let best0 = e.lanes(&first[value as usize].0)[0];
    let ty = lane_ty(d);
    let head = e.b.create_block();
    let i = e.b.append_block_param(head, I64);
    let best = e.b.append_block_param(head, ty);
    let idx = e.b.append_block_param(head, I64);
    let body = e.b.create_block();
    let finish = e.b.create_block();
    let one = e.b.ins().iconst(I64, 1);
    e.b.ins().jump(head, &block_args(&[one, best0, zero]));

    e.b.switch_to_block(head);
    let more = e.b.ins().icmp(IntCC::SignedLessThan, i, n);
    e.b.ins().brif(more, body, &[], finish, &[]);

    e.b.switch_to_block(body);
    let vals = k.body(e, i);
    k.store_elements(e, i, &vals);
    let v = e.lanes(&vals[value as usize].0)[0];
    let take = if d.is_float() {
        let cc = if op == ReduceOp::Argmax {
            FloatCC::GreaterThan
        } else {
            FloatCC::LessThan
        };
        let better = e.b.ins().fcmp(cc, v, best);
        let v_nan = e.b.ins().fcmp(FloatCC::Unordered, v, v);
        let b_num = e.b.ins().fcmp(FloatCC::Ordered, best, best);
        let nan_wins = e.b.ins().band(v_nan, b_num);
        e.b.ins().bor(better, nan_wins)
    } else {
        let cc = if op == ReduceOp::Argmax {
            IntCC::SignedGreaterThan
        } else {
            IntCC::SignedLessThan
        };
        e.b.ins().icmp(cc, v, best)
    };
    let nb = e.b.ins().select(take, v, best);
    let ni = e.b.ins().select(take, i, idx);
    let i1 = e.b.ins().iadd_imm_s(i, 1);
    e.b.ins().jump(head, &block_args(&[i1, nb, ni]));

    e.b.switch_to_block(finish);
    let z = e.b.ins().iconst(I64, 0);
    let r = V::L(SmallVec::from_elem(idx, 1));
    k.store(e, out_j, z, &r, DType::I64);
    e.b.ins().jump(done, &[]);
}

/// A fresh builder context (kept by the backend and reused across compiles).
pub fn new_builder_context() -> FunctionBuilderContext {
    FunctionBuilderContext::new()
}
