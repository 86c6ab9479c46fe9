//! The loops of a kernel row: sweeps over the `n` elements of one row.
//!
//! An elementwise region is one sweep that stores its outputs. A row kernel (a region with
//! reductions) runs, per row, one sweep per reduction, in order, each folding its value while
//! later sweeps read earlier results as row constants; element outputs that need no reduction
//! are stored during the first sweep, the others in a final sweep. Every sweep is a main loop
//! over chunks of 4 elements and a tail of single elements running the same instructions.

use super::block_math;
use super::codegen::{block_args, flatten, loop_test, params_like, Kernel};
use super::lanes::{lane_ty, Emitter, V};
use super::stash::{BlockPhase, RowSchedule, SweepSchedule};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F64, I64};
use cranelift_codegen::ir::{BlockArg, InstBuilder, Value};
use deferfuse_fusion::ir::{BinaryOp, DType, ReduceOp};
use deferfuse_fusion::region::{InstrKind, LoopRegion, ValueIdx};
use deferfuse_fusion::StrideKind;
use smallvec::SmallVec;

/// For each instruction, the first sweep that can compute it: one past the highest reduction
/// whose result it reads (0 if none).
fn sweep_of(region: &LoopRegion) -> Vec<usize> {
    let mut sw: Vec<usize> = Vec::with_capacity(region.body.len());
    for ins in &region.body {
        let s = match &ins.kind {
            InstrKind::Reduced(k) => *k as usize + 1,
            InstrKind::Unary(_, a) | InstrKind::Cast(a) => sw[*a as usize],
            InstrKind::Binary(_, a, b) => sw[*a as usize].max(sw[*b as usize]),
            InstrKind::Where(c, a, b) => sw[*c as usize].max(sw[*a as usize]).max(sw[*b as usize]),
            InstrKind::Load(_) | InstrKind::Param(_) => 0,
        };
        sw.push(s);
    }
    sw
}

/// Values computed once per row, before a sweep's loop, at widths 4 and 1: the instructions
/// `mask` selects that depend only on scalar parameters, earlier reductions' results
/// (layernorm's `rsqrt(var + eps)`) and inputs with one element per row (a cross-entropy's
/// target and what is derived from it), so the loop does not recompute them per element.
/// The sweep's outputs with one element per row whose values are such row constants are
/// stored once, with them; `stores` are the outputs left for the loop to store.
struct Hoisted {
    wide: Vec<Option<(V, DType)>>,
    narrow: Vec<Option<(V, DType)>>,
    stores: Vec<usize>,
}

impl Hoisted {
    fn for_width(&self, w: usize) -> &[Option<(V, DType)>] {
        if w == 4 {
            &self.wide
        } else {
            &self.narrow
        }
    }
}

/// One sweep over a row: the instructions `mask` selects, with earlier reductions' results
/// `reduced`, storing the element outputs `stores`; `stash` says which values it loads from
/// and stores to scratch rows.
struct Sweep<'a, 'r> {
    k: &'a Kernel<'r>,
    n: Value,
    mask: &'a [bool],
    reduced: &'a [(Value, DType)],
    stores: &'a [usize],
    /// Values loaded from scratch rows instead of computed, and values stored to them.
    loads: &'a [(ValueIdx, usize)],
    stashes: &'a [(ValueIdx, usize)],
}

impl Sweep<'_, '_> {
    /// Computes the row-invariant instructions once, before the sweep's loop.
    fn hoist(&self, e: &mut Emitter) -> Hoisted {
        let mut inv: Vec<bool> = Vec::with_capacity(self.mask.len());
        for (n, ins) in self.k.region.body.iter().enumerate() {
            let i = |v: &u32| inv[*v as usize];
            let stashed = self.loads.iter().any(|&(v, _)| v as usize == n);
            let ok = self.mask[n]
                && !stashed
                && match &ins.kind {
                    InstrKind::Param(_) | InstrKind::Reduced(_) => true,
                    InstrKind::Load(j) => self.k.ops[*j as usize].desc.inner == StrideKind::Bcast,
                    InstrKind::Unary(_, a) | InstrKind::Cast(a) => i(a),
                    InstrKind::Binary(_, a, b) => i(a) && i(b),
                    InstrKind::Where(c, a, b) => i(c) && i(a) && i(b),
                };
            inv.push(ok);
        }
        let zero = e.b.ins().iconst(I64, 0);
        e.width = 4;
        let wide = self.k.body(e, zero, &inv, self.reduced, &[]);
        e.width = 1;
        let narrow = self.k.body(e, zero, &inv, self.reduced, &[]);
        let n_in = self.k.region.inputs.len();
        let (once, stores): (Vec<usize>, Vec<usize>) = self.stores.iter().partition(|&&j| {
            self.k.ops[n_in + j].desc.inner == StrideKind::Bcast
                && inv[self.k.region.outputs[j].0 as usize]
        });
        if !once.is_empty() {
            // Stored before the loop, and only for a row with elements, as the loop would.
            let (store, after) = (e.b.create_block(), e.b.create_block());
            let c = e.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, self.n, 0);
            e.b.ins().brif(c, store, &[], after, &[]);
            e.b.switch_to_block(store);
            self.k.store_elements(e, zero, &narrow, &once);
            e.b.ins().jump(after, &[]);
            e.b.switch_to_block(after);
        }
        Hoisted {
            wide,
            narrow,
            stores,
        }
    }

    /// Emits the body at element `i` (at the emitter's width), stores the sweep's outputs, and
    /// returns body value `value`.
    fn step(&self, e: &mut Emitter, i: Value, pre: &Hoisted, value: Option<u32>) -> Option<V> {
        let vals = match self.loads {
            [] => self
                .k
                .body(e, i, self.mask, self.reduced, pre.for_width(e.width)),
            loads => {
                let mut given = pre.for_width(e.width).to_vec();
                for &(v, slot) in loads {
                    let d = self.k.region.body[v as usize].dtype;
                    given[v as usize] = Some((self.k.load_stash(e, slot, i), d));
                }
                self.k.body(e, i, self.mask, self.reduced, &given)
            }
        };
        self.k.store_elements(e, i, &vals, &pre.stores);
        for &(v, slot) in self.stashes {
            let (x, d) = vals[v as usize]
                .as_ref()
                .expect("stashed values are emitted");
            self.k.store_stash(e, slot, i, x, *d);
        }
        value.map(|v| {
            vals[v as usize]
                .as_ref()
                .expect("folded value is emitted")
                .0
                .clone()
        })
    }
}

/// The sweeps `row` will emit for `region` and the values they stash (see `stash`); with
/// `block_ops`, values a row routine can make are made by one (see `block_math`).
pub fn schedule(region: &LoopRegion, block_ops: bool) -> RowSchedule {
    let roots: Vec<Vec<u32>> = if region.reduces.is_empty() {
        vec![region.outputs.iter().map(|(v, _)| *v).collect()]
    } else {
        let sw = sweep_of(region);
        let mut roots: Vec<Vec<u32>> = region.reduces.iter().map(|r| vec![r.value]).collect();
        roots.push(Vec::new());
        for (v, _) in &region.outputs {
            roots[sw[*v as usize]].push(*v);
        }
        if roots.last().is_some_and(Vec::is_empty) {
            roots.pop();
        }
        roots
    };
    RowSchedule::new(region, &roots, block_ops)
}

/// Elements an elementwise loop with block phases handles per block: its scratch rows
/// (4 KB each in f32) stay in the L1 cache between the passes.
pub const BLOCK: usize = 1024;

/// Emits the code for one row; returns in the block where the row is done. Each element output
/// is stored in the first sweep that can compute it; `schedule` comes from [`schedule`].
pub fn row(k: &Kernel, e: &mut Emitter, n: Value, schedule: &RowSchedule) {
    let region = k.region;
    let all: Vec<usize> = (0..region.outputs.len()).collect();
    if region.reduces.is_empty() {
        if !schedule.blocked() {
            let mask = vec![true; region.body.len()];
            let sweep = Sweep {
                k,
                n,
                mask: &mask,
                reduced: &[],
                stores: &all,
                loads: &[],
                stashes: &[],
            };
            elementwise_sweep(&sweep, e);
            return;
        }
        // Block by block: the phases and the pass of each block run over its scratch rows.
        k.for_blocks(e, n, BLOCK as i64, &mut |kb, e, len| {
            run_phases(kb, e, len, &schedule.sweeps[0], &[]);
            elementwise_pass(kb, e, len, schedule);
        });
        return;
    }
    reduce_sweeps(k, e, n, schedule, false);
}

/// A row whose first sweep's block phases already ran for its group of rows (`row_groups`):
/// what [`row`] emits after them.
pub fn row_after_group_phases(k: &Kernel, e: &mut Emitter, n: Value, schedule: &RowSchedule) {
    if k.region.reduces.is_empty() {
        elementwise_pass(k, e, n, schedule);
    } else {
        reduce_sweeps(k, e, n, schedule, true);
    }
}

/// A row kernel's sweeps over one row: one per reduction, then the late sweep; the first
/// sweep's block phases are left out when `first_phases_done`.
fn reduce_sweeps(
    k: &Kernel,
    e: &mut Emitter,
    n: Value,
    schedule: &RowSchedule,
    first_phases_done: bool,
) {
    let region = k.region;
    let all: Vec<usize> = (0..region.outputs.len()).collect();
    let sw = sweep_of(region);
    let stores_in = |p: usize| -> Vec<usize> {
        all.iter()
            .copied()
            .filter(|&j| sw[region.outputs[j].0 as usize] == p)
            .collect()
    };
    let mut reduced: Vec<(Value, DType)> = Vec::new();
    let mut out_j = region.inputs.len() + region.outputs.len();
    for (p, r) in region.reduces.iter().enumerate() {
        let stores = stores_in(p);
        let sp = &schedule.sweeps[p];
        if !(first_phases_done && p == 0) {
            run_phases(k, e, n, sp, &reduced);
        }
        let d = region.body[r.value as usize].dtype;
        let sweep = Sweep {
            k,
            n,
            mask: &sp.mask,
            reduced: &reduced,
            stores: &stores,
            loads: &sp.loads,
            stashes: &sp.stores,
        };
        let (result, rd) = if r.op.is_arg() {
            (arg_sweep(&sweep, e, r.op, r.value), DType::I64)
        } else {
            (reduce_sweep(&sweep, e, r.op, r.value), d)
        };
        if r.output.is_some() {
            let z = e.b.ins().iconst(I64, 0);
            k.store(e, out_j, z, &result, rd, false);
            out_j += 1;
        }
        e.width = 1;
        reduced.push((e.lanes(&result)[0], rd));
    }
    let late = stores_in(region.reduces.len());
    if let Some(sp) = schedule.sweeps.get(region.reduces.len()) {
        run_phases(k, e, n, sp, &reduced);
        let sweep = Sweep {
            k,
            n,
            mask: &sp.mask,
            reduced: &reduced,
            stores: &late,
            loads: &sp.loads,
            stashes: &sp.stores,
        };
        elementwise_sweep(&sweep, e);
    }
}

/// Emits a sweep's block phases over its `n` elements: each computes a row routine's operand
/// into the routine's slot, then calls the routine on the slot's row.
fn run_phases(
    k: &Kernel,
    e: &mut Emitter,
    n: Value,
    sp: &SweepSchedule,
    reduced: &[(Value, DType)],
) {
    for ph in &sp.phases {
        phase_pass(k, e, n, ph, reduced);
        phase_call(k, e, n, ph);
    }
}

/// The pass of block phase `ph` over a row of `n` elements: the routine's operand, stored to
/// the phase's slot (its routine not yet called).
pub fn phase_pass(
    k: &Kernel,
    e: &mut Emitter,
    n: Value,
    ph: &BlockPhase,
    reduced: &[(Value, DType)],
) {
    let stashes: Vec<_> = std::iter::once((ph.input, ph.slot))
        .chain(ph.keeps.iter().copied())
        .collect();
    let sweep = Sweep {
        k,
        n,
        mask: &ph.mask,
        reduced,
        stores: &[],
        loads: &ph.loads,
        stashes: &stashes,
    };
    elementwise_sweep(&sweep, e);
}

/// Calls block phase `ph`'s routine on the first `len` elements of its slot's scratch row.
pub fn phase_call(k: &Kernel, e: &mut Emitter, len: Value, ph: &BlockPhase) {
    let symbol = block_math::symbol(ph.op).expect("scheduled ops have a routine");
    let row = k.stash_row(ph.slot);
    e.call(symbol, &[row, len], &[I64, I64], I64);
}

/// An elementwise loop's pass over a row of `n` elements after its block phases: every
/// output, the phases' values loaded from their slots.
pub fn elementwise_pass(k: &Kernel, e: &mut Emitter, n: Value, schedule: &RowSchedule) {
    let all: Vec<usize> = (0..k.region.outputs.len()).collect();
    let sp = &schedule.sweeps[0];
    let sweep = Sweep {
        k,
        n,
        mask: &sp.mask,
        reduced: &[],
        stores: &all,
        loads: &sp.loads,
        stashes: &sp.stores,
    };
    elementwise_sweep(&sweep, e);
}

/// Main loop of 4 elements, then a tail of 1, storing the outputs `stores`.
fn elementwise_sweep(s: &Sweep, e: &mut Emitter) {
    // Stages: 8 elements as two independent chunks of 4 (instruction-level parallelism for
    // long dependent chains), then one chunk of 4, then single elements.
    let stages: [(i64, usize, usize); 3] = [(8, 4, 2), (4, 4, 1), (1, 1, 1)];
    let heads: Vec<_> = stages
        .iter()
        .map(|_| {
            let h = e.b.create_block();
            let i = e.b.append_block_param(h, I64);
            (h, i, e.b.create_block())
        })
        .collect();
    let after = e.b.create_block();
    let pre = s.hoist(e);
    let zero = e.b.ins().iconst(I64, 0);
    e.b.ins().jump(heads[0].0, &[BlockArg::Value(zero)]);
    for (k, &(step, width, copies)) in stages.iter().enumerate() {
        let (head, idx, body) = heads[k];
        e.b.switch_to_block(head);
        let end = e.b.ins().iadd_imm_s(idx, step);
        let next_args = if k + 1 < stages.len() {
            vec![BlockArg::Value(idx)]
        } else {
            vec![]
        };
        let next = heads.get(k + 1).map_or(after, |h| h.0);
        loop_test(
            e.b,
            IntCC::SignedLessThanOrEqual,
            end,
            s.n,
            body,
            next,
            &next_args,
        );
        e.b.switch_to_block(body);
        e.width = width;
        for c in 0..copies {
            let at = if c == 0 {
                idx
            } else {
                e.b.ins().iadd_imm_s(idx, (c * width) as i64)
            };
            s.step(e, at, &pre, None);
        }
        e.b.ins().jump(head, &[BlockArg::Value(end)]);
    }
    e.b.switch_to_block(after);
}

fn fold(e: &mut Emitter, op: ReduceOp, acc: &V, v: &V, d: DType) -> V {
    let b = match op {
        ReduceOp::Sum | ReduceOp::Mean => BinaryOp::Add,
        ReduceOp::Prod => BinaryOp::Mul,
        ReduceOp::Amax => BinaryOp::Maximum,
        ReduceOp::Amin => BinaryOp::Minimum,
        _ => unreachable!("arg reductions fold in arg_sweep"),
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

/// Elements a float sum folds into its accumulators before adding them to its running totals
/// and starting them again: summed into the same accumulators all along, a long row's rounding
/// error grew with its length (1M uniform values: 1.8e-6 relative to float64, CPU's cascade sum
/// 3e-8). A power of two; a row of at most this many elements takes no total, and its bits are
/// those of the plain fold.
pub(super) const SUM_BLOCK: i64 = 1024;

/// Folds `value` over the row: 8 elements a step into two 4-lane accumulators (hiding the
/// fold's latency), one more chunk of 4, the lanes combined as (l0 + l1) + (l2 + l3), then the
/// tail element by element. Returns the (width-1) result, divided by `n` for a mean. A float
/// sum adds its accumulators into running totals every [`SUM_BLOCK`] elements while more
/// follow; the totals start at -0.0, so a row without a block adds nothing to its bits.
fn reduce_sweep(s: &Sweep, e: &mut Emitter, op: ReduceOp, value: u32) -> V {
    let (k, n) = (s.k, s.n);
    let d = k.region.body[value as usize].dtype;
    let pre = s.hoist(e);
    e.width = 4;
    let acc0 = init(e, op, d);
    let blocked = matches!(op, ReduceOp::Sum | ReduceOp::Mean) && d.is_float();
    let total0 = if blocked {
        let z = if lane_ty(d) == F64 {
            e.b.ins().f64const(-0.0)
        } else {
            e.b.ins().f32const(-0.0)
        };
        e.broadcast(z, d)
    } else {
        acc0.clone()
    };
    // Each loop block takes the index, the two accumulators and the two running totals.
    let head = |e: &mut Emitter| {
        let blk = e.b.create_block();
        let i = e.b.append_block_param(blk, I64);
        let vals: Vec<V> = (0..4).map(|_| params_like(e.b, blk, &acc0)).collect();
        (blk, i, vals)
    };
    let (v8head, i, h8) = head(e);
    let v8body = e.b.create_block();
    let flush = e.b.create_block();
    let (v4check, i4, h4) = head(e);
    let v4body = e.b.create_block();
    let (hsum, hi, hh) = head(e);
    let args = |i: Value, vals: [&V; 4]| {
        let mut a = vec![BlockArg::Value(i)];
        for v in vals {
            a.extend(block_args(&flatten(v)));
        }
        a
    };
    let zero = e.b.ins().iconst(I64, 0);
    e.b.ins()
        .jump(v8head, &args(zero, [&acc0, &acc0, &total0, &total0]));

    e.b.switch_to_block(v8head);
    let end8 = e.b.ins().iadd_imm_s(i, 8);
    let rest = args(i, [&h8[0], &h8[1], &h8[2], &h8[3]]);
    loop_test(
        e.b,
        IntCC::SignedLessThanOrEqual,
        end8,
        n,
        v8body,
        v4check,
        &rest,
    );

    e.b.switch_to_block(v8body);
    let v = s.step(e, i, &pre, Some(value)).expect("folded value");
    let na = fold(e, op, &h8[0], &v, d);
    let j = e.b.ins().iadd_imm_s(i, 4);
    let v = s.step(e, j, &pre, Some(value)).expect("folded value");
    let nb = fold(e, op, &h8[1], &v, d);
    let on = args(end8, [&na, &nb, &h8[2], &h8[3]]);
    if blocked {
        // A whole block folded and more elements follow: into the totals.
        let at_block = e.b.ins().band_imm_s(end8, SUM_BLOCK - 1);
        let at_block = e.b.ins().icmp_imm_s(IntCC::Equal, at_block, 0);
        let more = e.b.ins().icmp(IntCC::SignedLessThan, end8, n);
        let due = e.b.ins().band(at_block, more);
        e.b.ins().brif(due, flush, &[], v8head, &on);
        e.b.switch_to_block(flush);
        let ta = fold(e, op, &h8[2], &na, d);
        let tb = fold(e, op, &h8[3], &nb, d);
        e.b.ins()
            .jump(v8head, &args(end8, [&acc0, &acc0, &ta, &tb]));
    } else {
        e.b.ins().jump(v8head, &on);
    }

    e.b.switch_to_block(v4check);
    let end4 = e.b.ins().iadd_imm_s(i4, 4);
    let rest = args(i4, [&h4[0], &h4[1], &h4[2], &h4[3]]);
    loop_test(
        e.b,
        IntCC::SignedLessThanOrEqual,
        end4,
        n,
        v4body,
        hsum,
        &rest,
    );

    e.b.switch_to_block(v4body);
    let v = s.step(e, i4, &pre, Some(value)).expect("folded value");
    let na = fold(e, op, &h4[0], &v, d);
    e.b.ins()
        .jump(hsum, &args(end4, [&na, &h4[1], &h4[2], &h4[3]]));

    e.b.switch_to_block(hsum);
    let (ha, hb) = if blocked {
        // -0.0 + x is x, so a row that never flushed keeps its bits.
        (
            fold(e, op, &hh[2], &hh[0], d),
            fold(e, op, &hh[3], &hh[1], d),
        )
    } else {
        (hh[0].clone(), hh[1].clone())
    };
    let acc = fold(e, op, &ha, &hb, d);
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
    let mut a = vec![BlockArg::Value(hi)];
    a.extend(block_args(&flatten(&total)));
    e.b.ins().jump(thead, &a);

    e.b.switch_to_block(thead);
    loop_test(e.b, IntCC::SignedLessThan, ti, n, tbody, finish, &[]);

    e.b.switch_to_block(tbody);
    let v = s.step(e, ti, &pre, Some(value)).expect("folded value");
    let next = fold(e, op, &tacc, &v, d);
    let ti1 = e.b.ins().iadd_imm_s(ti, 1);
    let mut a = vec![BlockArg::Value(ti1)];
    a.extend(block_args(&flatten(&next)));
    e.b.ins().jump(thead, &a);

    e.b.switch_to_block(finish);
    if op == ReduceOp::Mean {
        let nf = e.b.ins().fcvt_from_sint(lane_ty(d), n);
        let nv = e.broadcast(nf, d);
        return e.binary(BinaryOp::Div, &tacc, &nv, d, d);
    }
    tacc
}

/// argmax/argmin of the row, element by element: the first extreme wins and NaN counts as the
/// extreme (PyTorch's rule). Returns the index as a width-1 int64 value.
fn arg_sweep(s: &Sweep, e: &mut Emitter, op: ReduceOp, value: u32) -> V {
    let (k, n) = (s.k, s.n);
    let d = k.region.body[value as usize].dtype;
    let pre = s.hoist(e);
    e.width = 1;
    let zero = e.b.ins().iconst(I64, 0);
    let first = s.step(e, zero, &pre, Some(value)).expect("folded value");
    let best0 = e.lanes(&first)[0];
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
    loop_test(e.b, IntCC::SignedLessThan, i, n, body, finish, &[]);

    e.b.switch_to_block(body);
    let v = s.step(e, i, &pre, Some(value)).expect("folded value");
    let v = e.lanes(&v)[0];
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
    V::L(SmallVec::from_elem(idx, 1))
}
