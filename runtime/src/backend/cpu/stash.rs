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
/// `input` (the instructions `mask` selects, loading `loads`) and stores it to `slot`; then the
/// routine `op` turns the slot's row into its results, which later passes load.
#[derive(Debug, PartialEq)]
pub struct BlockPhase {
    pub mask: Vec<bool>,
    pub loads: Vec<(ValueIdx, usize)>,
    pub input: ValueIdx,
    pub op: UnaryOp,
    pub slot: usize,
}

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
        let costly = costly_values(region);
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
                made[v] = Some(slots.len() - 1);
                phases.push(BlockPhase {
                    loads: loads_of(&pmask, &stop),
                    mask: pmask,
                    input,
                    op,
                    slot: slots.len() - 1,
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

/// Per instruction: is it worth storing rather than computing again? Costly ops whose value
/// varies along the row (a row-invariant value is hoisted out of the loop anyway).
fn costly_values(region: &LoopRegion) -> Vec<bool> {
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
    costly
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
