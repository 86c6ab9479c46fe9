//! Which values of a loop each sweep computes, and which it keeps in scratch rows.
//!
//! A row kernel sweeps each row once per reduction, then once more for the element outputs
//! that need the last result (see `sweep`). A cheap value a later sweep needs again is
//! recomputed from the row, which is still in cache. A costly one (a transcendental, a
//! division, a power) is instead *stashed*: the first sweep that computes it stores it to a
//! scratch row, and later sweeps load it back. Softmax computes `exp(x - max)` once, while
//! summing it, and the final sweep divides the stashed values: one exp per element and one
//! pass over memory, where a recompute costs a second exp and a cut costs a round trip of the
//! values through memory.
//!
//! A value one of `block_math`'s row routines can make (an f32 exp, tanh, ...) is made by one,
//! in a *block phase* before the sweep that first needs it: a pass stores the routine's operand
//! to the value's scratch row, the routine overwrites the row with its results, and every later
//! pass loads them. An elementwise loop with such a value runs its phases and its pass block by
//! block, so its scratch rows stay in L1; rows shorter than a block in groups of rows that fill
//! one (`row_groups`).
//!
//! A block phase's operand may hang off a long chain of cheap values that later phases need
//! too: a softmax over a middle dim's slices takes the maximum of C slices, then makes
//! `exp(x_c - max)` for each, one phase per class. Recomputed in every phase, that chain cost
//! C^2 maximums per element (21 classes: 9 ms where 21 exps took 1); so a phase also stores
//! each value of at least [`KEEP_CHAIN`] cheap instructions that a later pass of its sweep
//! needs, and later passes load it.
//!
//! The scratch rows are operands after the region's own (inputs, element outputs, reduction
//! outputs): the executor passes one row per slot (`n_inner` elements of the slot's dtype, or
//! one block's worth), with an outer stride of 0, so every row of a call reuses the same scratch.

use super::block_math;
use super::lanes::is_vec;
use deferfuse_fusion::ir::{BinaryOp, DType, UnaryOp};
use deferfuse_fusion::region::{InstrKind, LoopRegion, ValueIdx};

/// What one sweep emits: first its block phases, in order, then one pass computing the
/// instructions `mask` selects, loading the stashed values `loads` instead of computing them and
/// storing the values `stores` for later sweeps, each as (instruction, slot).
#[derive(Debug, Default, PartialEq)]
pub struct SweepSchedule {
    pub phases: Vec<BlockPhase>,
    pub mask: Vec<bool>,
    pub loads: Vec<(ValueIdx, usize)>,
    pub stores: Vec<(ValueIdx, usize)>,
}

/// A value made by a row routine (`block_math`): one pass computes the routine's operand
/// `input` (the instructions `mask` selects, loading `loads`) and stores it to `slot`, and the
/// long chains later passes need again to `keeps`' slots; then the routine `op` turns the
/// slot's row into its results, which later passes load.
#[derive(Debug, PartialEq)]
pub struct BlockPhase {
    pub mask: Vec<bool>,
    pub loads: Vec<(ValueIdx, usize)>,
    pub input: ValueIdx,
    pub op: UnaryOp,
    pub slot: usize,
    pub keeps: Vec<(ValueIdx, usize)>,
}

/// Fewest instructions (loads, parameters and earlier results not counted) a value computed in
/// a block phase must take to be stored for later passes rather than computed again: a store
/// and a load cost about two cheap instructions.
const KEEP_CHAIN: usize = 4;

/// The sweeps of a loop (one per reduction, then the late sweep if it has element outputs;
/// one sweep for an elementwise loop) and the dtype of each scratch slot.
#[derive(Debug, Default, PartialEq)]
pub struct RowSchedule {
    pub sweeps: Vec<SweepSchedule>,
    pub slots: Vec<DType>,
}

impl RowSchedule {
    /// Plans the sweeps of `region`. `roots[p]` are the instructions sweep `p` must produce
    /// (its folded value and the element outputs it stores). With `block_ops`, values that a
    /// row routine can make (`block_math::symbol`) are made by one.
    pub fn new(region: &LoopRegion, roots: &[Vec<ValueIdx>], block_ops: bool) -> RowSchedule {
        let n = region.body.len();
        let (varies, costly) = costly_values(region);
        let users = users_of(region);
        let blockable: Vec<bool> = (0..n)
            .map(|v| block_ops && costly[v] && block_op(region, v).is_some())
            .collect();
        // The sweep whose main pass first computed each costly value, if any did.
        let mut computed_in: Vec<Option<usize>> = vec![None; n];
        // The slot of each value a block phase made.
        let mut made: Vec<Option<usize>> = vec![None; n];
        let mut slots = Vec::new();
        let mut sweeps: Vec<SweepSchedule> = Vec::with_capacity(roots.len());
        for (p, r) in roots.iter().enumerate() {
            let mut phases = Vec::new();
            let (mask, stop) = loop {
                let stop: Vec<bool> = (0..n)
                    .map(|v| computed_in[v].is_some() || made[v].is_some())
                    .collect();
                let mask = closure(region, r.iter().copied(), &stop);
                // Operands precede their users: the first one needs no other block value.
                let Some(v) = (0..n).find(|&v| mask[v] && !stop[v] && blockable[v]) else {
                    break (mask, stop);
                };
                let (op, input) = block_op(region, v).expect("blockable");
                let pmask = closure(region, [input], &stop);
                slots.push(DType::F32);
                let slot = slots.len() - 1;
                // Long chains this pass computes that a later pass of the sweep needs (a user
                // outside this pass, inside the sweep's mask) are stored for it.
                let mut keeps = Vec::new();
                for u in 0..n {
                    let later = |w: &usize| mask[*w] && !pmask[*w];
                    if pmask[u]
                        && !stop[u]
                        && varies[u]
                        && u != input as usize
                        && users[u].iter().any(later)
                        && chain_len(region, u as ValueIdx, &stop) >= KEEP_CHAIN
                    {
                        slots.push(slot_dtype(region.body[u].dtype));
                        made[u] = Some(slots.len() - 1);
                        keeps.push((u as ValueIdx, slots.len() - 1));
                    }
                }
                made[v] = Some(slot);
                phases.push(BlockPhase {
                    loads: loads_of(&pmask, &stop),
                    mask: pmask,
                    input,
                    op,
                    slot,
                    keeps,
                });
            };
            for v in 0..n {
                if mask[v] && !stop[v] && costly[v] {
                    computed_in[v] = Some(p);
                }
            }
            sweeps.push(SweepSchedule {
                phases,
                loads: loads_of(&mask, &stop),
                mask,
                stores: Vec::new(),
            });
        }
        // One slot per stashed value some pass loads; the sweep that computed it stores it.
        let mut slot_of = made;
        for p in 0..sweeps.len() {
            let mut assign = |v: ValueIdx, sweeps: &mut Vec<SweepSchedule>| {
                *slot_of[v as usize].get_or_insert_with(|| {
                    slots.push(slot_dtype(region.body[v as usize].dtype));
                    let first = computed_in[v as usize].expect("a loaded value was made earlier");
                    sweeps[first].stores.push((v, slots.len() - 1));
                    slots.len() - 1
                })
            };
            for k in 0..sweeps[p].loads.len() {
                let v = sweeps[p].loads[k].0;
                sweeps[p].loads[k].1 = assign(v, &mut sweeps);
            }
            for f in 0..sweeps[p].phases.len() {
                for k in 0..sweeps[p].phases[f].loads.len() {
                    let v = sweeps[p].phases[f].loads[k].0;
                    sweeps[p].phases[f].loads[k].1 = assign(v, &mut sweeps);
                }
            }
        }
        RowSchedule { sweeps, slots }
    }

    /// True when an elementwise loop runs block by block (it has block phases).
    pub fn blocked(&self) -> bool {
        self.sweeps.iter().any(|s| !s.phases.is_empty())
    }

    /// True when short rows can run in groups (`row_groups`): there are block phases, and all
    /// of them are the first sweep's, so none needs a row's reduction results.
    pub fn groups_rows(&self) -> bool {
        self.blocked() && self.sweeps.iter().skip(1).all(|s| s.phases.is_empty())
    }
}

/// The values of `mask` that are loaded rather than computed (slots assigned later).
fn loads_of(mask: &[bool], stop: &[bool]) -> Vec<(ValueIdx, usize)> {
    (0..mask.len())
        .filter(|&v| mask[v] && stop[v])
        .map(|v| (v as ValueIdx, usize::MAX))
        .collect()
}

/// The row routine and operand of instruction `v`, if a routine can make it: an op of
/// `block_math` on f32-computed values.
fn block_op(region: &LoopRegion, v: usize) -> Option<(UnaryOp, ValueIdx)> {
    match region.body[v].kind {
        InstrKind::Unary(op, a)
            if is_vec(region.body[v].dtype)
                && is_vec(region.body[a as usize].dtype)
                && block_math::symbol(op).is_some() =>
        {
            Some((op, a))
        }
        _ => None,
    }
}

/// The dtype a stashed value is kept in: its compute representation, so that loading it back
/// gives the very bits the first sweep computed (an f16 value is computed in f32).
pub fn slot_dtype(d: DType) -> DType {
    if is_vec(d) {
        DType::F32
    } else {
        d.compute()
    }
}

/// Instructions `roots` depend on (themselves included), not looking past `stop`.
pub fn closure(
    region: &LoopRegion,
    roots: impl IntoIterator<Item = ValueIdx>,
    stop: &[bool],
) -> Vec<bool> {
    let mut mask = vec![false; region.body.len()];
    let mut stack: Vec<ValueIdx> = roots.into_iter().collect();
    while let Some(v) = stack.pop() {
        if std::mem::replace(&mut mask[v as usize], true) || stop[v as usize] {
            continue;
        }
        match &region.body[v as usize].kind {
            InstrKind::Unary(_, a) | InstrKind::Cast(a) => stack.push(*a),
            InstrKind::Binary(_, a, b) => stack.extend([*a, *b]),
            InstrKind::Where(c, a, b) => stack.extend([*c, *a, *b]),
            InstrKind::Load(_) | InstrKind::Param(_) | InstrKind::Reduced(_) => {}
        }
    }
    mask
}

/// Per instruction, the instructions that use its value.
fn users_of(region: &LoopRegion) -> Vec<Vec<usize>> {
    let mut users = vec![Vec::new(); region.body.len()];
    for (u, ins) in region.body.iter().enumerate() {
        match &ins.kind {
            InstrKind::Unary(_, a) | InstrKind::Cast(a) => users[*a as usize].push(u),
            InstrKind::Binary(_, a, b) => [a, b].iter().for_each(|x| users[**x as usize].push(u)),
            InstrKind::Where(c, a, b) => [c, a, b].iter().for_each(|x| users[**x as usize].push(u)),
            InstrKind::Load(_) | InstrKind::Param(_) | InstrKind::Reduced(_) => {}
        }
    }
    users
}

/// The instructions computing `v` takes, not looking past `stop`, loads, parameters and
/// earlier results not counted.
fn chain_len(region: &LoopRegion, v: ValueIdx, stop: &[bool]) -> usize {
    let mask = closure(region, [v], stop);
    (0..mask.len())
        .filter(|&u| {
            mask[u]
                && !stop[u]
                && !matches!(
                    region.body[u].kind,
                    InstrKind::Load(_) | InstrKind::Param(_) | InstrKind::Reduced(_)
                )
        })
        .count()
}

/// Per instruction: does its value vary along the row (a row-invariant value is hoisted out
/// of the loop anyway), and is it worth storing rather than computing again (a costly op whose
/// value varies)?
fn costly_values(region: &LoopRegion) -> (Vec<bool>, Vec<bool>) {
    let mut varies: Vec<bool> = Vec::with_capacity(region.body.len());
    let mut costly = Vec::with_capacity(region.body.len());
    for ins in &region.body {
        let v = |x: &ValueIdx| varies[*x as usize];
        let (vary, expensive) = match &ins.kind {
            InstrKind::Load(_) => (true, false),
            InstrKind::Param(_) | InstrKind::Reduced(_) => (false, false),
            InstrKind::Unary(u, a) => (v(a), !cheap_unary(*u)),
            InstrKind::Cast(a) => (v(a), false),
            InstrKind::Binary(b, x, y) => (
                v(x) || v(y),
                matches!(
                    b,
                    BinaryOp::Pow
                        | BinaryOp::Remainder
                        | BinaryOp::Div
                        | BinaryOp::Atan2
                        | BinaryOp::Fmod
                        | BinaryOp::FloorDivide
                        | BinaryOp::TruncDivide
                ),
            ),
            InstrKind::Where(c, x, y) => (v(c) || v(x) || v(y), false),
        };
        varies.push(vary);
        costly.push(vary && expensive);
    }
    (varies, costly)
}

/// Unary ops that cost about as much as the load that a stash would add.
fn cheap_unary(u: UnaryOp) -> bool {
    matches!(
        u,
        UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Relu
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Trunc
            | UnaryOp::BitwiseNot
            | UnaryOp::Sign
            | UnaryOp::LogicalNot
            | UnaryOp::IsNan
    )
}

/// Scratch rows a thread keeps between calls; a call that needs more gets a larger buffer
/// and gives it back afterwards, so one huge row does not pin its memory for good.
const KEEP_BYTES: usize = 1 << 20;

thread_local! {
    /// This thread's scratch rows (u128 elements: 16-byte aligned for vector loads).
    static ROWS: std::cell::RefCell<Vec<u128>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with one scratch row of `len` elements per slot of `slots` (addresses of their
/// first elements), from this thread's scratch. Each row starts on a 64-byte boundary.
pub fn with_rows<R>(slots: &[DType], len: usize, f: impl FnOnce(&[*mut u8]) -> R) -> R {
    let row_bytes = |d: &DType| (d.size() * len).next_multiple_of(64);
    let total: usize = slots.iter().map(row_bytes).sum::<usize>() + 64;
    ROWS.with(|cell| {
        let mut rows = cell.borrow_mut();
        let units = total.div_ceil(16);
        if rows.len() < units {
            rows.resize(units, 0);
        }
        let base = rows.as_mut_ptr() as *mut u8;
        let mut at = base.align_offset(64);
        let ptrs: smallvec::SmallVec<[*mut u8; 4]> = slots
            .iter()
            .map(|d| {
                // SAFETY: `at` stays within the `total` bytes just reserved.
                let p = unsafe { base.add(at) };
                at += row_bytes(d);
                p
            })
            .collect();
        let r = f(&ptrs);
        if rows.len() * 16 > KEEP_BYTES {
            *rows = Vec::new();
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use deferfuse_fusion::region::{Instr, LoopOperand};
    use deferfuse_fusion::StrideKind;

    fn instr(kind: InstrKind) -> Instr {
        Instr {
            kind,
            dtype: DType::F32,
        }
    }

    /// `sum_c exp(x_c - max_c x_c)` over `c` loaded slices: a softmax's denominator over a
    /// middle dim, as softmax_norm.cpp records it.
    fn sliced_softmax_sum(c: u32) -> LoopRegion {
        let f32_contig = LoopOperand {
            dtype: DType::F32,
            inner: StrideKind::Contig,
        };
        let mut body: Vec<Instr> = (0..c).map(|j| instr(InstrKind::Load(j))).collect();
        let mut max = 0;
        for j in 1..c {
            body.push(instr(InstrKind::Binary(BinaryOp::Maximum, max, j)));
            max = body.len() as ValueIdx - 1;
        }
        let mut sum = None;
        for j in 0..c {
            body.push(instr(InstrKind::Binary(BinaryOp::Sub, j, max)));
            let d = body.len() as ValueIdx - 1;
            body.push(instr(InstrKind::Unary(UnaryOp::Exp, d)));
            let e = body.len() as ValueIdx - 1;
            if let Some(s) = sum {
                body.push(instr(InstrKind::Binary(BinaryOp::Add, s, e)));
                sum = Some(body.len() as ValueIdx - 1);
            } else {
                sum = Some(e);
            }
        }
        LoopRegion {
            inputs: vec![f32_contig; c as usize],
            params: Vec::new(),
            outputs: vec![(sum.unwrap(), f32_contig)],
            body,
            reduces: Vec::new(),
        }
    }

    fn is_max(region: &LoopRegion, v: usize) -> bool {
        matches!(
            region.body[v].kind,
            InstrKind::Binary(BinaryOp::Maximum, _, _)
        )
    }

    #[test]
    fn a_long_chain_several_block_phases_need_is_computed_once_and_kept() {
        let region = sliced_softmax_sum(6);
        let schedule = sweep_schedule(&region);
        let phases = &schedule.sweeps[0].phases;
        assert_eq!(phases.len(), 6, "one phase per exp");
        let max = (0..region.body.len())
            .rfind(|&v| is_max(&region, v))
            .unwrap();
        // The first phase computes the maxima and keeps the last; the others load it.
        assert!(phases[0].keeps.iter().any(|&(v, _)| v as usize == max));
        for ph in &phases[1..] {
            assert!(!(0..region.body.len()).any(|v| ph.mask[v] && is_max(&region, v) && v != max));
            assert!(ph.loads.iter().any(|&(v, _)| v as usize == max));
        }
    }

    #[test]
    fn a_short_chain_is_computed_again_rather_than_kept() {
        // Three slices: two maxima, below KEEP_CHAIN; a store and a load would cost more.
        let region = sliced_softmax_sum(3);
        let schedule = sweep_schedule(&region);
        assert!(schedule.sweeps[0]
            .phases
            .iter()
            .all(|ph| ph.keeps.is_empty()));
    }

    fn sweep_schedule(region: &LoopRegion) -> RowSchedule {
        let roots = vec![region.outputs.iter().map(|(v, _)| *v).collect()];
        RowSchedule::new(region, &roots, true)
    }
}
