//! Lowering: turns recorded nodes into regions plus bindings. A single node lowers to one step
//! (addmm to two); the fusing planner builds bigger loop regions with the same [`LoopBuilder`].

use crate::ir::{BinaryOp, DType, Dims, KernelOp, Layout, Op, ReduceOp, Scalar, Strides, UnaryOp};
use crate::iter::IterSpace;
use crate::reduce_geometry::reduce_space;
use crate::region::{
    Binding, Instr, InstrKind, LoopOperand, LoopReduce, LoopRegion, Region, Step, ValueIdx,
};
pub(crate) use crate::scalar_slot::scalar_bits;
pub use crate::scalar_slot::ScalarSlot;
use crate::trace::{Node, Operand, TensorRef};
use std::sync::Arc;

/// Builds a loop body in SSA form, deduplicating loads of the same operand.
#[derive(Default)]
pub(crate) struct LoopBuilder {
    /// The SSA instructions, in order.
    pub body: Vec<Instr>,
    /// Views loaded by the body, in `InstrKind::Load` slot order.
    pub inputs: Vec<TensorRef>,
    /// Compute dtype of each scalar parameter slot.
    pub params: Vec<DType>,
    /// Each parameter slot's value (see [`scalar_bits`]).
    pub scalars: Vec<u64>,
    /// Values this loop has computed for a buffer view: a later read of that exact view uses
    /// the value instead of loading (the fusing planner fills this).
    pub forwards: Vec<(TensorRef, ValueIdx)>,
    /// Where each scalar slot's value came from, so a cached plan can be re-bound to the
    /// scalars of a later, identical trace.
    pub scalar_src: Vec<ScalarSrc>,
}

/// The origin of a scalar parameter slot: input `input` of trace node `node`, converted to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScalarSrc {
    /// Index of the node in the trace.
    pub node: usize,
    /// Index of the scalar among the node's inputs.
    pub input: usize,
    /// The dtype the scalar is converted to in the slot.
    pub to: DType,
}

/// Steps that execute one node, and where each step's scalar slots come from (see
/// [`ScalarSlot`]; one list per step, as long as its binding's scalars).
pub struct Lowered {
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Per step, the source of each of its scalar slots.
    pub slots: Vec<Vec<ScalarSlot>>,
}

/// The scalar values a node's lowering depends on, beyond the scalar kinds its structural key
/// holds: an addmm whose beta is zero drops its bias step (the bias is not read, so a NaN in it
/// does not spread). A cached lowering fits a node only when this word is the same.
pub fn lowering_word(node: &Node) -> u64 {
    match (&node.op, node.inputs.first(), node.inputs.get(3)) {
        (Op::Addmm, Some(Operand::Tensor(_)), Some(Operand::Scalar(beta))) => {
            (beta.as_f64() == 0.0) as u64
        }
        _ => 0,
    }
}

impl LoopBuilder {
    /// Appends an instruction, or returns an identical existing one (instructions are pure).
    pub fn push(&mut self, kind: InstrKind, dtype: DType) -> ValueIdx {
        if let Some(i) = self
            .body
            .iter()
            .position(|x| x.kind == kind && x.dtype == dtype)
        {
            // Pure instructions: identical ones compute identical values.
            return i as ValueIdx;
        }
        self.body.push(Instr { kind, dtype });
        (self.body.len() - 1) as ValueIdx
    }

    /// The dtype of value `v`.
    pub fn dtype(&self, v: ValueIdx) -> DType {
        self.body[v as usize].dtype
    }

    /// Loads a tensor view (already expanded to the iteration shape).
    pub fn load(&mut self, t: &TensorRef) -> ValueIdx {
        let pos = match self.inputs.iter().position(|x| x == t) {
            Some(p) => p,
            None => {
                self.inputs.push(t.clone());
                self.inputs.len() - 1
            }
        };
        self.push(InstrKind::Load(pos as u32), t.dtype)
    }

    /// The value last computed for exactly this view, if any. f16/bf16 values are rounded as a
    /// store and reload would round them, so fused results equal unfused ones bit for bit.
    pub(crate) fn forwarded(&mut self, t: &TensorRef) -> Option<ValueIdx> {
        let v = self
            .forwards
            .iter()
            .rev()
            .find(|(f, _)| f == t)
            .map(|(_, v)| *v)?;
        Some(match t.dtype {
            DType::F16 | DType::BF16 if !self.holds_its_dtype(v) => {
                let wide = self.push(InstrKind::Cast(v), DType::F32);
                self.push(InstrKind::Cast(wide), t.dtype)
            }
            _ => v,
        })
    }

    /// Whether value `v` already holds values of its dtype exactly: loaded, a parameter, or a
    /// cast (which rounds to its dtype). An f16/bf16 op's result is computed in f32 and not yet
    /// rounded; rounding one of these again changes nothing (a GELU's backward in bf16 rounded
    /// some values five times over, ~10 instructions per four elements each).
    fn holds_its_dtype(&self, v: ValueIdx) -> bool {
        matches!(
            self.body[v as usize].kind,
            InstrKind::Load(_) | InstrKind::Param(_) | InstrKind::Cast(_)
        )
    }

    /// A new scalar parameter slot holding `bits`, as a value of `dtype`.
    pub fn param(&mut self, bits: u64, dtype: DType) -> ValueIdx {
        self.params.push(dtype);
        self.scalars.push(bits);
        self.body.push(Instr {
            kind: InstrKind::Param((self.params.len() - 1) as u32),
            dtype,
        });
        (self.body.len() - 1) as ValueIdx
    }

    /// Converts `v` to `to`; rounds computed f16/bf16 values to their dtype first, like PyTorch.
    pub fn cast(&mut self, v: ValueIdx, to: DType) -> ValueIdx {
        let from = self.dtype(v);
        if from == to {
            return v;
        }
        if !self.holds_its_dtype(v) && matches!(from, DType::F16 | DType::BF16) {
            // An f16/bf16 result is computed in f32; PyTorch rounds it to its dtype before any
            // conversion (add(f16, f16, out=f32) is an f16 sum, widened).
            let wide = self.push(InstrKind::Cast(v), DType::F32);
            let rounded = self.push(InstrKind::Cast(wide), from);
            return self.push(InstrKind::Cast(rounded), to);
        }
        self.push(InstrKind::Cast(v), to)
    }

    /// An operand of an elementwise node, expanded to `sizes` and converted to `to`.
    pub fn operand(&mut self, o: &Operand, sizes: &[usize], to: DType) -> ValueIdx {
        match o {
            Operand::Tensor(t) => {
                let t = TensorRef {
                    layout: t.layout.expand(sizes),
                    ..t.clone()
                };
                let v = match self.forwarded(&t) {
                    Some(v) => v,
                    None => self.load(&t),
                };
                self.cast(v, to)
            }
            Operand::Scalar(s) => self.param(scalar_bits(*s, to), to),
            Operand::Absent => unreachable!("absent operands are filtered by the caller"),
        }
    }

    /// Input `k` of trace node `idx`, expanded to `sizes` and converted to `to`.
    pub fn input(
        &mut self,
        idx: usize,
        node: &Node,
        k: usize,
        sizes: &[usize],
        to: DType,
    ) -> ValueIdx {
        if let Operand::Scalar(_) = node.inputs[k] {
            self.scalar_src.push(ScalarSrc {
                node: idx,
                input: k,
                to,
            });
        }
        self.operand(&node.inputs[k], sizes, to)
    }

    /// `u(a)`, yielding `dtype`.
    pub fn unary(&mut self, u: UnaryOp, a: ValueIdx, dtype: DType) -> ValueIdx {
        self.push(InstrKind::Unary(u, a), dtype)
    }

    /// `b(x, y)`, yielding `dtype`.
    pub fn binary(&mut self, b: BinaryOp, x: ValueIdx, y: ValueIdx, dtype: DType) -> ValueIdx {
        self.push(InstrKind::Binary(b, x, y), dtype)
    }
}

/// Emits the body of one elementwise node and returns the value it produces (in the node's
/// output dtype).
pub(crate) fn emit_elementwise(b: &mut LoopBuilder, idx: usize, node: &Node) -> ValueIdx {
    emit_elementwise_over(b, idx, node, &node.output.layout.sizes.clone())
}

/// Like [`emit_elementwise`], iterating over `sizes` (the node's shape or a shape it broadcasts
/// to, e.g. a per-row op inside a row kernel).
pub(crate) fn emit_elementwise_over(
    b: &mut LoopBuilder,
    idx: usize,
    node: &Node,
    sizes: &[usize],
) -> ValueIdx {
    let sizes: Dims = sizes.into();
    let c = node.compute;
    let v = match &node.op {
        Op::Unary(u) => {
            let a = b.input(idx, node, 0, &sizes, c);
            let dt = if matches!(u, UnaryOp::LogicalNot | UnaryOp::IsNan) {
                DType::Bool
            } else {
                c
            };
            b.unary(*u, a, dt)
        }
        Op::Binary(op) => {
            let x = b.input(idx, node, 0, &sizes, c);
            let y = b.input(idx, node, 1, &sizes, c);
            let dt = if op.gives_bool() { DType::Bool } else { c };
            b.binary(*op, x, y, dt)
        }
        Op::Where => {
            let cond = b.input(idx, node, 0, &sizes, DType::Bool);
            let x = b.input(idx, node, 1, &sizes, c);
            let y = b.input(idx, node, 2, &sizes, c);
            b.push(InstrKind::Where(cond, x, y), c)
        }
        Op::Clamp => {
            let mut x = b.input(idx, node, 0, &sizes, c);
            if !matches!(node.inputs[1], Operand::Absent) {
                let lo = b.input(idx, node, 1, &sizes, c);
                x = b.binary(BinaryOp::Maximum, x, lo, c);
            }
            if !matches!(node.inputs[2], Operand::Absent) {
                let hi = b.input(idx, node, 2, &sizes, c);
                x = b.binary(BinaryOp::Minimum, x, hi, c);
            }
            x
        }
        Op::Cast(_) | Op::Copy => {
            b.input(idx, node, 0, &sizes, node.inputs[0].tensor().unwrap().dtype)
        }
        Op::Full { dtype, .. } => b.input(idx, node, 0, &sizes, *dtype),
        other => unreachable!("{other} is not elementwise"),
    };
    b.cast(v, node.output.dtype)
}

/// A reduction of a loop step: its op, the folded value, and where its per-row result goes
/// (`None` when nothing needs it in memory).
pub(crate) type StepReduce = (ReduceOp, ValueIdx, Option<TensorRef>);

/// Builds a loop step: `outputs` are element outputs; `reduces` are the row kernel's phases.
pub(crate) fn loop_step(
    b: LoopBuilder,
    outputs: Vec<(ValueIdx, TensorRef)>,
    reduces: Vec<StepReduce>,
    iter: IterSpace,
    nodes: Vec<usize>,
) -> Step {
    let n_in = b.inputs.len();
    let operand = |i: usize, t: &TensorRef| LoopOperand {
        dtype: t.dtype,
        inner: iter.inner_kind(i),
    };
    let mut next = n_in + outputs.len();
    let region = LoopRegion {
        inputs: b
            .inputs
            .iter()
            .enumerate()
            .map(|(i, t)| operand(i, t))
            .collect(),
        params: b.params.clone(),
        body: b.body,
        outputs: outputs
            .iter()
            .enumerate()
            .map(|(i, (v, t))| (*v, operand(n_in + i, t)))
            .collect(),
        reduces: reduces
            .iter()
            .map(|(op, v, t)| LoopReduce {
                op: *op,
                value: *v,
                output: t.as_ref().map(|t| {
                    next += 1;
                    operand(next - 1, t)
                }),
            })
            .collect(),
    };
    let mut operands = b.inputs;
    operands.extend(outputs.into_iter().map(|(_, t)| t));
    operands.extend(reduces.into_iter().filter_map(|(_, _, t)| t));
    Step {
        region: Arc::new(Region::Loop(region)),
        binding: Binding {
            operands,
            iter: Some(iter),
            scalars: b.scalars,
            n_inputs: n_in,
            parts: Vec::new(),
        },
        nodes,
        key: Default::default(),
    }
}

/// Builds the loop step of an elementwise body writing `outputs` (all of the same shape).
pub(crate) fn elementwise_step(
    b: LoopBuilder,
    outputs: Vec<(ValueIdx, TensorRef)>,
    nodes: Vec<usize>,
) -> Step {
    let sizes = outputs[0].1.layout.sizes.clone();
    let strides: Vec<Strides> = b
        .inputs
        .iter()
        .chain(outputs.iter().map(|(_, t)| t))
        .map(|t| t.layout.strides.clone())
        .collect();
    let iter = IterSpace::coalesce(&sizes, &strides, 0);
    loop_step(b, outputs, vec![], iter, nodes)
}

/// The dtype a reduction folds in: integer sums and products accumulate in int64.
pub(crate) fn reduce_acc_dtype(op: ReduceOp, input: DType) -> DType {
    match op {
        ReduceOp::Sum | ReduceOp::Prod if !input.is_float() => DType::I64,
        _ => input,
    }
}

/// Lowers one recorded node to the steps that execute it.
pub fn lower_node(node: &Node, index: usize) -> Vec<Step> {
    lower_node_rebindable(node, index).steps
}

/// [`lower_node`], saying where each step's scalars come from.
pub fn lower_node_rebindable(node: &Node, index: usize) -> Lowered {
    let out = &node.output;
    let one = |step: Step, slots: Vec<ScalarSlot>| Lowered {
        steps: vec![step],
        slots: vec![slots],
    };
    match &node.op {
        op if op.is_elementwise() => {
            let mut b = LoopBuilder::default();
            let v = emit_elementwise(&mut b, index, node);
            let slots = b
                .scalar_src
                .iter()
                .map(|s| ScalarSlot::Bits {
                    input: s.input,
                    to: s.to,
                })
                .collect();
            one(
                elementwise_step(b, vec![(v, out.clone())], vec![index]),
                slots,
            )
        }
        Op::Reduce { op, dims, keepdim } => {
            let t = node.inputs[0].tensor().expect("reduce input is a tensor");
            let mut b = LoopBuilder::default();
            let v = b.load(t);
            let v = b.cast(v, reduce_acc_dtype(*op, t.dtype));
            let iter = reduce_space(&t.layout, &out.layout, dims, *keepdim);
            assert!(
                iter.reduced <= 1,
                "runtime must copy before a non-coalescing reduce"
            );
            // The store converts the folded value to the output dtype.
            let step = loop_step(
                b,
                vec![],
                vec![(*op, v, Some(out.clone()))],
                iter,
                vec![index],
            );
            one(step, Vec::new())
        }
        Op::Matmul | Op::Addmm => lower_matmul(node, index),
        Op::Arange { dtype } => {
            let slots = if Region::arange_in_integers(*dtype) {
                vec![ScalarSlot::I64 { input: 0 }, ScalarSlot::I64 { input: 2 }]
            } else {
                vec![
                    ScalarSlot::F64 {
                        input: 0,
                        absent: 0.0,
                    },
                    ScalarSlot::F64 {
                        input: 2,
                        absent: 0.0,
                    },
                ]
            };
            let step = Step {
                region: Arc::new(Region::Arange { dtype: *dtype }),
                binding: Binding {
                    operands: vec![out.clone()],
                    iter: None,
                    scalars: slots.iter().map(|s| s.bits(node)).collect(),
                    n_inputs: 0,
                    parts: Vec::new(),
                },
                nodes: vec![index],
                key: Default::default(),
            };
            one(step, slots)
        }
        Op::Kernel(k) => {
            let (step, slots) = lower_kernel(node, k, index);
            one(step, slots)
        }
        Op::Cat { .. } => unreachable!("the runtime records cat as copies into slices"),
        other => unreachable!("no lowering for {other}"),
    }
}

/// A kernel op's one step: its tensor operands then the output; its scalars (scatter's value,
/// random's seed and offset) in the result's dtype (ints stay ints: `Scalar::bits_for`).
fn lower_kernel(node: &Node, k: &KernelOp, index: usize) -> (Step, Vec<ScalarSlot>) {
    let first = node.inputs.iter().find_map(|o| o.tensor()).map(|t| t.dtype);
    let result = k.result_dtype(first);
    let mut operands: Vec<TensorRef> = node
        .inputs
        .iter()
        .filter_map(|o| o.tensor().cloned())
        .collect();
    let n_inputs = operands.len();
    operands.push(node.output.clone());
    let slots: Vec<ScalarSlot> = node
        .inputs
        .iter()
        .enumerate()
        .filter_map(|(input, o)| match o {
            Operand::Scalar(s) => Some(match s {
                Scalar::Int(_) if matches!(k, KernelOp::Random { .. }) => ScalarSlot::I64 { input },
                _ => ScalarSlot::Bits { input, to: result },
            }),
            _ => None,
        })
        .collect();
    let step = Step {
        region: Arc::new(Region::Kernel(k.canonical())),
        binding: Binding {
            operands,
            iter: None,
            scalars: slots.iter().map(|s| s.bits(node)).collect(),
            n_inputs,
            parts: Vec::new(),
        },
        nodes: vec![index],
        key: Default::default(),
    };
    (step, slots)
}

/// A matmul's GEMM step, after a copy of the bias into the output for an addmm whose beta is not
/// zero (the GEMM then accumulates onto it, scaled by beta).
fn lower_matmul(node: &Node, index: usize) -> Lowered {
    let out = &node.output;
    let one = |v: f64| ScalarSlot::Const(v.to_bits());
    let (a, bm, bias, alpha, beta) = match node.op {
        Op::Matmul => (&node.inputs[0], &node.inputs[1], None, one(1.0), one(0.0)),
        _ => {
            let s = |input: usize| ScalarSlot::F64 { input, absent: 1.0 };
            (
                &node.inputs[1],
                &node.inputs[2],
                Some(&node.inputs[0]),
                s(4),
                s(3),
            )
        }
    };
    let a = a.tensor().unwrap();
    let bm = bm.tensor().unwrap();
    let mut al = a.layout.clone();
    let mut bl = bm.layout.clone();
    let mut ol = out.layout.clone();
    if al.rank() == 1 {
        al = al.unsqueeze(0);
        ol = ol.unsqueeze(ol.rank().saturating_sub(if bl.rank() == 1 { 0 } else { 1 }));
    }
    if bl.rank() == 1 {
        bl = bl.unsqueeze(1);
        ol = ol.unsqueeze(ol.rank());
    }
    let batch: Dims = ol.sizes[..ol.rank() - 2].into();
    let with_batch = |l: &Layout| {
        let mut s = batch.clone();
        s.extend_from_slice(&l.sizes[l.rank() - 2..]);
        l.expand(&s)
    };
    let al = with_batch(&al);
    let bl = with_batch(&bl);
    let mut lowered = Lowered {
        steps: Vec::new(),
        slots: Vec::new(),
    };
    let mut beta = beta;
    if let Some(Operand::Tensor(c)) = bias {
        // `lowering_word` tells this case apart for a cached lowering.
        if f64::from_bits(beta.bits(node)) != 0.0 {
            let mut b = LoopBuilder::default();
            let v = b.operand(&Operand::Tensor(c.clone()), &out.layout.sizes, out.dtype);
            let copy = elementwise_step(b, vec![(v, out.clone())], vec![index]);
            lowered.steps.push(copy);
            lowered.slots.push(Vec::new());
        } else {
            beta = one(0.0);
        }
    }
    let t = |t: &TensorRef, l: Layout| TensorRef {
        layout: l,
        ..t.clone()
    };
    lowered.steps.push(Step {
        region: Arc::new(Region::Matmul {
            dtype: out.dtype,
            epilogue: None,
        }),
        binding: Binding {
            operands: vec![t(a, al), t(bm, bl), t(out, ol)],
            iter: None,
            scalars: vec![alpha.bits(node), beta.bits(node)],
            n_inputs: 2,
            parts: Vec::new(),
        },
        nodes: vec![index],
        key: Default::default(),
    });
    lowered.slots.push(vec![alpha, beta]);
    lowered
}
