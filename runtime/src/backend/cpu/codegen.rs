//! Compiles a [`LoopRegion`] into one native function.
//!
//! Kernel ABI (all i64): `(ptrs, strides, scalars, n_outer, n_inner)`, where `ptrs[j]` is operand
//! j's first element, `strides[2j]`/`strides[2j+1]` its outer/inner stride in bytes, and
//! `scalars[p]` the 64 bits of parameter slot p. Operands are inputs, element outputs, stored
//! reduction results, then one scratch row per stash slot (see `stash`). The kernel walks
//! `n_outer x n_inner` elements; the executor walks any further dims. Because sizes and strides
//! are arguments, one compiled kernel serves every size of its shape class.

use super::lanes::{is_vec, vflags, Emitter, V};
use super::stash::{slot_dtype, RowSchedule};
use cranelift_codegen::ir::condcodes::{CondCode, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, F64, F64X2, I16X8, I32, I32X4, I64, I64X2, I8X16};
use cranelift_codegen::ir::{
    AbiParam, Block, BlockArg, InstBuilder, MemFlagsData, Signature, Value,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::JITModule;
use deferfuse_fusion::ir::DType;
use deferfuse_fusion::region::{InstrKind, LoopOperand, LoopRegion};
use deferfuse_fusion::StrideKind;
use smallvec::{smallvec, SmallVec};

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
#[derive(Clone)]
pub struct Operand {
    pub(super) desc: LoopOperand,
    pub(super) row: Value,
    pub(super) inner: Value,
}

pub struct Kernel<'r> {
    pub region: &'r LoopRegion,
    /// The region's operands, then one scratch row per stash slot (see `stash`).
    pub ops: Vec<Operand>,
    /// The operand index of stash slot 0.
    pub stash_base: usize,
    /// Parameter slot values, loaded once in the entry block (as scalars).
    pub params: Vec<Value>,
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
        if kind == StrideKind::Contig && e.width == 4 && !is_vec(d) {
            let a = self.addr(e, j, i);
            return Self::load_vector(e, d, a);
        }
        if matches!(d, DType::BF16 | DType::F16) && kind == StrideKind::Contig && e.width == 4 {
            // One 8-byte load, each 16-bit element widened into an i32 lane; a bf16 is then
            // an f32's high half (element by element, these loads took ~4x an f32 loop's
            // time, an f16's a call each).
            let a = self.addr(e, j, i);
            let w = e.b.ins().load(I64, mem(), a, 0);
            let v = e.b.ins().scalar_to_vector(I64X2, w);
            let v = e.b.ins().bitcast(I16X8, vflags(), v);
            let v = e.b.ins().uwiden_low(v);
            if d == DType::F16 {
                return V::F(e.vm().f16_to_f32(v));
            }
            let v = e.b.ins().ishl_imm_s(v, 16);
            return V::F(e.b.ins().bitcast(F32X4, vflags(), v));
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
        if n == 1 {
            e.broadcast(lanes[0], d)
        } else {
            e.pack_lanes(&lanes)
        }
    }

    /// 4 contiguous elements at `a` in vector loads (f64/i64: two registers; i32: one;
    /// u8/bool: 4 bytes widened to i32x4); not for the f32-computed dtypes.
    fn load_vector(e: &mut Emitter, d: DType, a: Value) -> V {
        let regs = match d {
            DType::F64 | DType::I64 => {
                let t = if d == DType::F64 { F64X2 } else { I64X2 };
                smallvec![
                    e.b.ins().load(t, mem(), a, 0),
                    e.b.ins().load(t, mem(), a, 16)
                ]
            }
            DType::I32 => smallvec![e.b.ins().load(I32X4, mem(), a, 0)],
            DType::U8 | DType::Bool => {
                let w = e.b.ins().load(I32, mem(), a, 0);
                let v = e.b.ins().scalar_to_vector(I32X4, w);
                let v = e.b.ins().bitcast(I8X16, vflags(), v);
                let v = e.b.ins().uwiden_low(v);
                smallvec![e.b.ins().uwiden_low(v)]
            }
            other => unreachable!("{other:?} loads as f32x4"),
        };
        V::W(regs)
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
    /// `exact`: `v` already holds values of that dtype (a load of it, a cast to it), so a bf16
    /// store skips its rounding (a bf16 copy took ~3x an f32 one's time).
    pub fn store(&self, e: &mut Emitter, j: usize, i: Value, v: &V, vd: DType, exact: bool) {
        let d = self.ops[j].desc.dtype;
        // Values computed as f16 or bf16 are rounded once, here. An f16 store's conversion
        // rounds (so a value is only brought to f32 lanes first); bf16's rounding is a vector
        // op on the f32 value, which a cast to bf16 already did.
        let (mut v, rounded) = match d {
            DType::F16 => (e.cast(v, vd, DType::F32), true),
            _ => (e.cast(v, vd, d), exact || vd != d),
        };
        if let (DType::BF16, V::F(x), false) = (d, &v, rounded) {
            v = V::F(e.vm().round_bf16(*x));
        }
        if let (DType::F32, StrideKind::Contig, 4, V::F(x)) =
            (d, self.ops[j].desc.inner, e.width, &v)
        {
            let a = self.addr(e, j, i);
            e.b.ins().store(mem(), *x, a, 0);
            return;
        }
        if let (DType::BF16 | DType::F16, StrideKind::Contig, 4, V::F(x)) =
            (d, self.ops[j].desc.inner, e.width, &v)
        {
            // The four 16-bit results (a rounded bf16's high halves, an f16's bits in the low
            // halves) gathered into the low 8 bytes: one store.
            let a = self.addr(e, j, i);
            let (bits, halves) = if d == DType::F16 {
                (e.vm().f32_to_f16(*x), [0, 1, 4, 5, 8, 9, 12, 13])
            } else {
                (*x, [2, 3, 6, 7, 10, 11, 14, 15])
            };
            let mut mask = [0u8; 16];
            mask[..8].copy_from_slice(&halves);
            mask[8..].copy_from_slice(&halves);
            let h = e.byte_shuffle(bits, bits, mask, I64X2);
            let w = e.b.ins().extractlane(h, 0);
            e.b.ins().store(mem(), w, a, 0);
            return;
        }
        if let (StrideKind::Contig, 4, V::W(r)) = (self.ops[j].desc.inner, e.width, &v) {
            let a = self.addr(e, j, i);
            Self::store_vector(e, d, r, a);
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

    /// Stores 4 contiguous elements of dtype `d` (registers `r`) at `a`; u8/bool lanes (0..=255)
    /// are packed to bytes first.
    fn store_vector(e: &mut Emitter, d: DType, r: &[Value], a: Value) {
        match d {
            DType::U8 | DType::Bool => {
                let h = e.b.ins().snarrow(r[0], r[0]);
                let by = e.b.ins().unarrow(h, h);
                let w = e.b.ins().bitcast(I32X4, vflags(), by);
                let w = e.b.ins().extractlane(w, 0);
                e.b.ins().store(mem(), w, a, 0);
            }
            _ => {
                for (k, &x) in r.iter().enumerate() {
                    e.b.ins().store(mem(), x, a, (k * 16) as i32);
                }
            }
        }
    }

    /// The address of stash slot `slot`'s scratch row.
    pub fn stash_row(&self, slot: usize) -> Value {
        self.ops[self.stash_base + slot].row
    }

    /// Emits a loop over the row's `n` elements in blocks of `block`: `f` emits one block's
    /// code for a kernel whose operands start at the block (scratch rows do not move) and the
    /// block's length.
    pub fn for_blocks(
        &self,
        e: &mut Emitter,
        n: Value,
        block: i64,
        f: &mut dyn FnMut(&Kernel, &mut Emitter, Value),
    ) {
        let cap = e.b.ins().iconst(I64, block);
        counted_loop(e, n, cap, &mut |e, start| {
            let rest = e.b.ins().isub(n, start);
            let len = e.b.ins().smin(rest, cap);
            let ops = self
                .ops
                .iter()
                .enumerate()
                .map(|(j, op)| {
                    let off = match op.desc.inner {
                        _ if j >= self.stash_base => return op.clone(),
                        StrideKind::Bcast => return op.clone(),
                        StrideKind::Contig => {
                            e.b.ins().imul_imm_s(start, op.desc.dtype.size() as i64)
                        }
                        StrideKind::Strided => e.b.ins().imul(start, op.inner),
                    };
                    Operand {
                        row: e.b.ins().iadd(op.row, off),
                        ..op.clone()
                    }
                })
                .collect();
            let kb = Kernel {
                region: self.region,
                ops,
                stash_base: self.stash_base,
                params: self.params.clone(),
            };
            f(&kb, e, len);
        });
    }

    /// Loads `e.width` stashed values of slot `slot` at element `i`.
    pub fn load_stash(&self, e: &mut Emitter, slot: usize, i: Value) -> V {
        self.load(e, self.stash_base + slot, i)
    }

    /// Stashes `v` (of dtype `vd`) in slot `slot` at element `i`, bits unchanged.
    pub fn store_stash(&self, e: &mut Emitter, slot: usize, i: Value, v: &V, vd: DType) {
        self.store(e, self.stash_base + slot, i, v, slot_dtype(vd), false);
    }

    /// Stores the element outputs `which` (indices into `region.outputs`) at element `i`.
    pub fn store_elements(
        &self,
        e: &mut Emitter,
        i: Value,
        vals: &[Option<(V, DType)>],
        which: &[usize],
    ) {
        let n_in = self.region.inputs.len();
        for &j in which {
            let v = self.region.outputs[j].0;
            let (val, vd) = vals[v as usize]
                .as_ref()
                .expect("stored values are emitted");
            // A loaded value holds its dtype's values, a cast rounds to its own.
            let exact = matches!(
                self.region.body[v as usize].kind,
                InstrKind::Load(_) | InstrKind::Cast(_)
            );
            self.store(e, n_in + j, i, val, *vd, exact);
        }
    }

    /// Emits the instructions `mask` selects at element `i`. `reduced[k]` is the current row's
    /// result of reduction k (a scalar lane value and its dtype), for `InstrKind::Reduced`;
    /// `hoisted` holds values computed once before the loop (see `sweep::hoist`).
    pub fn body(
        &self,
        e: &mut Emitter,
        i: Value,
        mask: &[bool],
        reduced: &[(Value, DType)],
        hoisted: &[Option<(V, DType)>],
    ) -> Vec<Option<(V, DType)>> {
        let mut vals: Vec<Option<(V, DType)>> = Vec::with_capacity(self.region.body.len());
        for (n, ins) in self.region.body.iter().enumerate() {
            if let Some(Some(v)) = hoisted.get(n) {
                vals.push(Some(v.clone()));
                continue;
            }
            if !mask[n] {
                vals.push(None);
                continue;
            }
            let get = |k: u32| {
                vals[k as usize]
                    .clone()
                    .expect("operands precede their users")
            };
            let v = match &ins.kind {
                InstrKind::Load(n) => self.load(e, *n as usize, i),
                InstrKind::Param(p) => {
                    let x = self.params[*p as usize];
                    // u8 scalars wrap, like a store would; bools arrive as 0/1 already.
                    let v = e.broadcast(x, ins.dtype);
                    e.normalize(v, ins.dtype)
                }
                InstrKind::Reduced(k) => {
                    let (x, d) = reduced[*k as usize];
                    let v = e.broadcast(x, d);
                    e.cast(&v, d, ins.dtype)
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
            vals.push(Some((v, ins.dtype)));
        }
        vals
    }
}

pub fn flatten(v: &V) -> Vec<Value> {
    match v {
        V::F(x) => vec![*x],
        V::L(l) => l.to_vec(),
        V::W(r) => r.to_vec(),
    }
}

pub fn block_args(v: &[Value]) -> Vec<BlockArg> {
    v.iter().map(|&x| BlockArg::Value(x)).collect()
}

/// Adds block params shaped like `proto` and returns them as a value.
pub fn params_like(b: &mut FunctionBuilder, blk: Block, proto: &V) -> V {
    match proto {
        V::F(_) => V::F(b.append_block_param(blk, F32X4)),
        V::L(l) => {
            let ty = b.func.dfg.value_type(l[0]);
            V::L(l.iter().map(|_| b.append_block_param(blk, ty)).collect())
        }
        V::W(r) => V::W(
            r.iter()
                .map(|&x| {
                    let ty = b.func.dfg.value_type(x);
                    b.append_block_param(blk, ty)
                })
                .collect(),
        ),
    }
}

/// Builds the kernel for `region` into `b`'s function.
pub fn build(
    region: &LoopRegion,
    schedule: &RowSchedule,
    b: &mut FunctionBuilder,
    module: &mut JITModule,
) {
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
        .chain(region.reduces.iter().filter_map(|r| r.output))
        .chain(schedule.slots.iter().map(|&dtype| LoopOperand {
            dtype,
            inner: StrideKind::Contig,
        }))
        .collect();
    let stash_base = descs.len() - schedule.slots.len();
    let bases: Vec<(Value, Value, Value)> = (0..descs.len())
        .map(|j| {
            let p = e.b.ins().load(I64, mem(), ptrs, (j * 8) as i32);
            let so = e.b.ins().load(I64, mem(), strides, (j * 16) as i32);
            let si = e.b.ins().load(I64, mem(), strides, (j * 16 + 8) as i32);
            (p, so, si)
        })
        .collect();

    if schedule.groups_rows() {
        // Rows shorter than a block run in groups of rows (see `row_groups`); empty rows
        // (a reduction over a 0-length dim) take the per-row loop, as a group of them would
        // divide by their length. Unsigned, `n_inner - 1 < BLOCK - 1` is `0 < n_inner < BLOCK`.
        let grouped = e.b.create_block();
        let per_row = e.b.create_block();
        let below = e.b.ins().iadd_imm_s(n_inner, -1);
        let short = e.b.ins().icmp_imm_u(
            IntCC::UnsignedLessThan,
            below,
            super::sweep::BLOCK as i64 - 1,
        );
        e.b.ins().brif(short, grouped, &[], per_row, &[]);
        e.b.switch_to_block(grouped);
        let rows = super::row_groups::Rows {
            region,
            descs: &descs,
            bases: &bases,
            stash_base,
            params: &params,
            n_inner,
        };
        rows.emit(&mut e, schedule, n_outer);
        e.b.ins().return_(&[]);
        e.b.switch_to_block(per_row);
    }
    let outer_head = e.b.create_block();
    let o = e.b.append_block_param(outer_head, I64);
    let outer_body = e.b.create_block();
    let outer_latch = e.b.create_block();
    let exit = e.b.create_block();
    let zero = e.b.ins().iconst(I64, 0);
    e.b.ins().jump(outer_head, &[BlockArg::Value(zero)]);

    e.b.switch_to_block(outer_head);
    loop_test(
        e.b,
        IntCC::SignedLessThan,
        o,
        n_outer,
        outer_body,
        exit,
        &[],
    );

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
        stash_base,
        params,
    };
    super::sweep::row(&k, &mut e, n_inner, schedule);
    e.b.ins().jump(outer_latch, &[]);

    e.b.switch_to_block(outer_latch);
    let o1 = e.b.ins().iadd_imm_s(o, 1);
    e.b.ins().jump(outer_head, &[BlockArg::Value(o1)]);

    e.b.switch_to_block(exit);
    e.b.ins().return_(&[]);
    e.b.seal_all_blocks();
}

/// A fresh builder context (kept by the backend and reused across compiles).
pub fn new_builder_context() -> FunctionBuilderContext {
    FunctionBuilderContext::new()
}

/// Emits `body(i)` for `i` = 0, `step`, `2 * step`, ... while `i < end`; returns in the block
/// after the loop.
pub fn counted_loop(
    e: &mut Emitter,
    end: Value,
    step: Value,
    body: &mut dyn FnMut(&mut Emitter, Value),
) {
    let head = e.b.create_block();
    let i = e.b.append_block_param(head, I64);
    let inside = e.b.create_block();
    let exit = e.b.create_block();
    let zero = e.b.ins().iconst(I64, 0);
    e.b.ins().jump(head, &[BlockArg::Value(zero)]);
    e.b.switch_to_block(head);
    loop_test(e.b, IntCC::SignedLessThan, i, end, inside, exit, &[]);
    e.b.switch_to_block(inside);
    body(e, i);
    let next = e.b.ins().iadd(i, step);
    e.b.ins().jump(head, &[BlockArg::Value(next)]);
    e.b.switch_to_block(exit);
}

/// Ends a loop header: on to `body` while `x cc y` holds, else to `exit` with `exit_args`.
///
/// The exit is deliberately the branch's *first* target. Cranelift 0.135's egraph elaborator,
/// where loop-invariant code motion happens, walks dominator-tree children in CFG reverse
/// postorder and drops the enclosing loops from its stack when it visits a block outside them,
/// without restoring them for the next sibling. With the body as the first target the exit came
/// first in that order, and every invariant (row addresses, splatted scalars, their f64 -> f32
/// conversions) was recomputed inside the innermost loop: chain10's loop ran ~75 instructions
/// per 8 elements instead of ~45. Exit-first puts the body first.
pub fn loop_test(
    b: &mut FunctionBuilder,
    cc: IntCC,
    x: Value,
    y: Value,
    body: Block,
    exit: Block,
    exit_args: &[BlockArg],
) {
    let done = b.ins().icmp(cc.complement(), x, y);
    b.ins().brif(done, exit, exit_args, body, &[]);
}
