//! The planner: cuts a stream's pending nodes into ordered steps.
//!
//! Greedy and linear in the trace: nodes nobody can observe are dropped; consecutive elementwise
//! nodes over one iteration shape become one loop region, reading each other's values from
//! registers. A reduction turns its loop into a row kernel: later reductions over the same dims
//! and elementwise consumers of the results (over the rows, or per row) join it as further
//! sweeps over each row, so softmax and layernorm read their input from memory once. A value is
//! written to memory only if a live handle, a later step or an in-place write needs it. Every cut
//! has a reason, counted in [`Plan::cuts`].

use crate::epilogue::{combine, PendingMatmul};
use crate::ir::{BinaryOp, Dims, Layout, Op, ReduceOp, Strides, UnaryOp};
use crate::lower::{
    elementwise_step, emit_elementwise_over, loop_step, lower_node, reduce_acc_dtype,
    reduce_out_strides, reduce_space_for, reduced_dims, LoopBuilder, ScalarSrc, StepReduce,
};
use crate::region::{InstrKind, Step, ValueIdx};
use crate::trace::{BufferId, Node, TensorRef};
use std::collections::{HashMap, HashSet};

/// Why a loop region ended where it did.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutReason {
    /// The next op is not a loop op (matmul, arange): it runs as its own step.
    Unfusable = 0,
    /// The next op iterates over another shape (or reduces over other dims).
    Shape = 1,
    /// The next op reads or writes a buffer of this loop through another view.
    Layout = 2,
    /// A reduction could not join the loop before it.
    Reduction = 3,
    /// The loop reached the configured maximum of ops per region.
    MaxOps = 4,
    /// Joining would recompute a transcendental in a later sweep of a row kernel; the value
    /// is stored once instead (softmax's exp).
    Recompute = 5,
}

impl CutReason {
    pub const COUNT: usize = 6;

    pub fn name(self) -> &'static str {
        match self {
            CutReason::Unfusable => "unfusable",
            CutReason::Shape => "shape",
            CutReason::Layout => "layout",
            CutReason::Reduction => "reduction",
            CutReason::MaxOps => "max_ops",
            CutReason::Recompute => "recompute",
        }
    }
}

/// Planner settings.
#[derive(Clone, Copy, Debug)]
pub struct PlanOptions {
    /// Fuse at all (off: one step per node, like strict mode).
    pub fuse: bool,
    /// Most ops one loop region may hold (bounds compile time and register pressure).
    pub max_ops_per_region: usize,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            fuse: true,
            max_ops_per_region: 64,
        }
    }
}

/// The planner's output.
#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Cuts by `CutReason as usize`.
    pub cuts: [u64; CutReason::COUNT],
    /// Nodes dropped because nothing can observe their result.
    pub dead_nodes: usize,
    /// Values computed in registers and never written to memory.
    pub unmaterialized: usize,
    /// For each cut, the node that triggered it and why (for logs).
    pub cut_log: Vec<(usize, CutReason)>,
    /// Where `steps` came from, in order (what a cached plan needs to re-bind them).
    pub origins: Vec<StepOrigin>,
}

/// How a run of steps was made.
#[derive(Clone, Debug, PartialEq)]
pub enum StepOrigin {
    /// One fused loop step; its scalar slots come from these node inputs.
    Fused(Vec<ScalarSrc>),
    /// `steps` steps lowered from trace node `node` alone (matmul, arange).
    Lowered { node: usize, steps: usize },
    /// Matmul node `node`'s `prefix` lowered steps (a bias copy), then its GEMM combined with
    /// a fused epilogue whose scalar slots (after alpha and beta) come from `src`.
    MatmulEpilogue {
        node: usize,
        prefix: usize,
        src: Vec<ScalarSrc>,
    },
}

impl Plan {
    fn push_lowered(&mut self, node: &Node, i: usize) {
        let steps = lower_node(node, i);
        self.origins.push(StepOrigin::Lowered {
            node: i,
            steps: steps.len(),
        });
        self.steps.extend(steps);
    }

    /// Emits a matmul nobody fused an epilogue into.
    fn push_matmul(&mut self, mm: PendingMatmul) {
        self.origins.push(StepOrigin::Lowered {
            node: mm.node,
            steps: mm.steps.len(),
        });
        self.steps.extend(mm.steps);
    }

    fn push_fused(&mut self, step: Step, src: Vec<ScalarSrc>) {
        self.origins.push(StepOrigin::Fused(src));
        self.steps.push(step);
    }
}

/// A reduction inside a row kernel.
struct GroupReduce {
    op: ReduceOp,
    value: ValueIdx,
    output: TensorRef,
    node: usize,
    /// The output's strides over the loop's dims (0 along reduced dims).
    strides: Strides,
}

/// A loop region being built.
struct Group {
    b: LoopBuilder,
    /// The iteration shape: the elementwise shape, or the reduced input's shape.
    sizes: Dims,
    /// Values written to buffer views (as seen over `sizes`), in order: (view, value, node).
    written: Vec<(TensorRef, ValueIdx, usize)>,
    /// Views (over `sizes`) of buffers this loop loads.
    reads: HashMap<BufferId, Vec<Layout>>,
    nodes: Vec<usize>,
    ops: usize,
    /// Once a reduction joined: the reduced dims, shared by every reduction of the loop.
    red_dims: Option<Dims>,
    reduces: Vec<GroupReduce>,
    /// Body length when the last reduction joined: values before it are recomputed by later
    /// sweeps.
    phase_start: usize,
    /// The matmul this loop is the epilogue of.
    mm: Option<PendingMatmul>,
}

/// `sizes` with the reduced dims set to 1: the shape of a keepdim reduction's result.
fn row_shape(sizes: &[usize], red: &[usize]) -> Dims {
    sizes
        .iter()
        .enumerate()
        .map(|(d, &s)| if red.contains(&d) { 1 } else { s })
        .collect()
}

impl Group {
    fn new(sizes: Dims) -> Group {
        Group {
            b: LoopBuilder::default(),
            sizes,
            written: Vec::new(),
            reads: HashMap::new(),
            nodes: Vec::new(),
            ops: 0,
            red_dims: None,
            reduces: Vec::new(),
            phase_start: 0,
            mm: None,
        }
    }

    /// True when reading `v` in the current sweep would recompute a transcendental (or another
    /// costly op) that an earlier sweep already computed.
    fn costly_to_recompute(&self, v: ValueIdx) -> bool {
        if self.reduces.is_empty() || v as usize >= self.phase_start {
            return false;
        }
        let mut stack = vec![v];
        let mut seen = HashSet::new();
        while let Some(x) = stack.pop() {
            if !seen.insert(x) {
                continue;
            }
            match &self.b.body[x as usize].kind {
                InstrKind::Unary(u, a) => {
                    if !matches!(
                        u,
                        UnaryOp::Neg
                            | UnaryOp::Abs
                            | UnaryOp::Relu
                            | UnaryOp::Floor
                            | UnaryOp::Ceil
                            | UnaryOp::Round
                            | UnaryOp::Sign
                            | UnaryOp::LogicalNot
                            | UnaryOp::IsNan
                    ) {
                        return true;
                    }
                    stack.push(*a);
                }
                InstrKind::Binary(b, a, c) => {
                    if matches!(b, BinaryOp::Pow | BinaryOp::Remainder | BinaryOp::Div) {
                        return true;
                    }
                    stack.extend([*a, *c]);
                }
                InstrKind::Where(c, a, b) => stack.extend([*c, *a, *b]),
                InstrKind::Cast(a) => stack.push(*a),
                InstrKind::Load(_) | InstrKind::Param(_) | InstrKind::Reduced(_) => {}
            }
        }
        false
    }

    /// Would `node` recompute a costly value of an earlier sweep?
    fn recomputes(&self, node: &Node) -> bool {
        node.inputs.iter().filter_map(|o| o.tensor()).any(|t| {
            let view = t.layout.expand(&self.sizes);
            self.b
                .forwards
                .iter()
                .rev()
                .find(|(f, _)| f.buffer == t.buffer && f.layout == view)
                .is_some_and(|&(_, v)| self.costly_to_recompute(v))
        })
    }

    /// How an elementwise node of shape `out` iterates in this loop, if it can.
    fn fits_shape(&self, out: &[usize]) -> bool {
        out == self.sizes.as_slice()
            || self
                .red_dims
                .as_ref()
                .is_some_and(|r| out == row_shape(&self.sizes, r).as_slice())
    }

    /// Why `node` (iterating over this loop's shape) cannot join, if it cannot.
    fn conflict(&self, node: &Node, max_ops: usize) -> Option<CutReason> {
        if self.ops >= max_ops {
            return Some(CutReason::MaxOps);
        }
        if let Some(mm) = &self.mm {
            let reads: Vec<&TensorRef> = node.inputs.iter().filter_map(|o| o.tensor()).collect();
            if mm.conflicts(&reads, &node.output) {
                return Some(CutReason::Layout);
            }
        }
        if self.recomputes(node) {
            return Some(CutReason::Recompute);
        }
        let b = node.output.buffer;
        let self_load = node.inputs.iter().filter_map(|o| o.tensor()).any(|t| {
            let view = t.layout.expand(&self.sizes);
            t.buffer == b
                && !self
                    .b
                    .forwards
                    .iter()
                    .any(|(f, _)| f.buffer == b && f.layout == view)
        });
        if !self.reduces.is_empty() && (self.loads_buffer(b) || self_load) {
            // A row kernel sweeps each row several times: a buffer it loads must not change
            // under it (an in-place update would be seen by later sweeps).
            return Some(CutReason::Layout);
        }
        for t in node.inputs.iter().filter_map(|o| o.tensor()) {
            let view = t.layout.expand(&self.sizes);
            let written = self
                .written
                .iter()
                .map(|(w, _, _)| w)
                .filter(|w| w.buffer == t.buffer);
            let reduced = self
                .reduces
                .iter()
                .map(|r| &r.output)
                .filter(|o| o.buffer == t.buffer);
            let mut writes = written.chain(reduced).peekable();
            if writes.peek().is_some()
                && !self
                    .b
                    .forwards
                    .iter()
                    .any(|(f, _)| f.buffer == t.buffer && f.layout == view && f.dtype == t.dtype)
            {
                return Some(CutReason::Layout);
            }
        }
        let out = node.output.layout.expand(&self.sizes);
        let b = node.output.buffer;
        if self
            .reads
            .get(&b)
            .is_some_and(|ls| ls.iter().any(|l| *l != out))
        {
            return Some(CutReason::Layout);
        }
        if self
            .written
            .iter()
            .any(|(w, _, _)| w.buffer == b && w.layout != out)
            || self.reduces.iter().any(|r| r.output.buffer == b)
        {
            return Some(CutReason::Layout);
        }
        None
    }

    /// True when the loop loads `buffer` from memory (rather than forwarding a value).
    fn loads_buffer(&self, buffer: BufferId) -> bool {
        self.b.inputs.iter().any(|t| t.buffer == buffer)
    }

    /// True when the loop writes a buffer it also loads: it cannot become a row kernel.
    fn updates_in_place(&self) -> bool {
        self.written
            .iter()
            .any(|(w, _, _)| self.loads_buffer(w.buffer))
    }

    fn note_reads(&mut self, node: &Node) {
        for t in node.inputs.iter().filter_map(|o| o.tensor()) {
            self.reads
                .entry(t.buffer)
                .or_default()
                .push(t.layout.expand(&self.sizes));
        }
    }

    fn add_elementwise(&mut self, i: usize, node: &Node) {
        self.note_reads(node);
        let sizes = self.sizes.clone();
        let v = emit_elementwise_over(&mut self.b, i, node, &sizes);
        let view = TensorRef {
            layout: node.output.layout.expand(&sizes),
            ..node.output.clone()
        };
        self.b.forwards.push((view.clone(), v));
        self.written.push((view, v, i));
        self.nodes.push(i);
        self.ops += 1;
    }

    /// Strides (over `sizes`) of every operand the loop may end up with.
    fn operand_strides(&self, extra: &[&TensorRef]) -> Vec<Strides> {
        let mut s: Vec<Strides> = self
            .b
            .inputs
            .iter()
            .map(|t| t.layout.strides.clone())
            .collect();
        s.extend(extra.iter().map(|t| t.layout.expand(&self.sizes).strides));
        s.extend(
            self.written
                .iter()
                .map(|(t, _, _)| t.layout.strides.clone()),
        );
        s.extend(self.reduces.iter().map(|r| r.strides.clone()));
        s
    }

    /// True when a row kernel over these operands still walks each row as one strided dim.
    fn rows_coalesce(&self, strides: &[Strides]) -> bool {
        match &self.red_dims {
            Some(r) => reduce_space_for(&self.sizes, r, strides).reduced <= 1,
            None => true,
        }
    }
}

/// What the planner knows of the trace as a whole.
struct Facts<'a> {
    nodes: &'a [Node],
    live: &'a dyn Fn(BufferId) -> bool,
    /// For each buffer, the indices of the nodes that read it.
    readers: HashMap<BufferId, Vec<usize>>,
    /// (buffer, node) pairs where the node's output is a fresh, full, contiguous tensor.
    fresh: HashSet<(BufferId, usize)>,
}

impl Facts<'_> {
    /// Must the value `node` wrote to `t` reach memory, given that nodes up to `end` ran?
    fn must_store(&self, t: &TensorRef, node: usize, end: usize) -> bool {
        (self.live)(t.buffer)
            || !self.fresh.contains(&(t.buffer, node))
            || self
                .readers
                .get(&t.buffer)
                .is_some_and(|r| r.iter().any(|&j| j > end))
    }
}

fn close(g: Group, facts: &Facts, plan: &mut Plan) {
    let end = *g.nodes.last().expect("groups are never empty");
    let mut outputs: Vec<(ValueIdx, TensorRef)> = Vec::new();
    for (k, (t, v, node)) in g.written.iter().enumerate() {
        // Only the last write to a view reaches memory.
        let overwritten = g.written[k + 1..].iter().any(|(w, _, _)| w == t);
        if !overwritten && facts.must_store(t, *node, end) {
            outputs.push((*v, t.clone()));
        } else {
            plan.unmaterialized += 1;
        }
    }
    let src = g.b.scalar_src.clone();
    if let Some(mut mm) = g.mm {
        if outputs.is_empty() {
            plan.push_matmul(mm);
            return;
        }
        let gemm = mm.steps.pop().expect("a matmul lowers to its GEMM");
        plan.origins.push(StepOrigin::MatmulEpilogue {
            node: mm.node,
            prefix: mm.steps.len(),
            src,
        });
        plan.steps.extend(mm.steps);
        plan.steps
            .push(combine(gemm, elementwise_step(g.b, outputs, g.nodes)));
        return;
    }
    let Some(red) = g.red_dims.clone() else {
        if !outputs.is_empty() {
            plan.push_fused(elementwise_step(g.b, outputs, g.nodes), src);
        }
        return;
    };
    let mut strides: Vec<Strides> =
        g.b.inputs
            .iter()
            .map(|t| t.layout.strides.clone())
            .collect();
    strides.extend(outputs.iter().map(|(_, t)| t.layout.strides.clone()));
    let mut reduces: Vec<StepReduce> = Vec::new();
    for r in &g.reduces {
        let store = facts.must_store(&r.output, r.node, end);
        if store {
            strides.push(r.strides.clone());
        } else {
            plan.unmaterialized += 1;
        }
        reduces.push((r.op, r.value, store.then(|| r.output.clone())));
    }
    let iter = reduce_space_for(&g.sizes, &red, &strides);
    debug_assert!(iter.reduced <= 1, "checked when each node joined");
    plan.push_fused(loop_step(g.b, outputs, reduces, iter, g.nodes), src);
}

/// Adds reduction node `i` to `g` as its next row sweep; false (and `g` unchanged) if it cannot.
fn join_reduce(g: &mut Group, i: usize, facts: &Facts) -> bool {
    let node = &facts.nodes[i];
    let Op::Reduce { op, dims, keepdim } = &node.op else {
        unreachable!()
    };
    let t = node.inputs[0].tensor().expect("reduce input is a tensor");
    let rank = t.layout.rank();
    let red = reduced_dims(dims, rank);
    if g.sizes.as_slice() != t.layout.sizes.as_slice()
        || g.red_dims.as_ref().is_some_and(|r| *r != red)
        || g.conflict(node, usize::MAX).is_some()
        || g.updates_in_place()
        || g.mm.is_some()
    {
        return false;
    }
    let out_strides = reduce_out_strides(&node.output.layout, rank, dims, *keepdim);
    let mut strides = g.operand_strides(&[t]);
    strides.push(out_strides.clone());
    if reduce_space_for(&t.layout.sizes, dims, &strides).reduced > 1 {
        return false;
    }
    g.red_dims = Some(red.clone());
    g.note_reads(node);
    let v = match g.b.forwarded(t) {
        Some(v) => v,
        None => g.b.load(t),
    };
    let v = g.b.cast(v, reduce_acc_dtype(*op, t.dtype));
    let k = g.reduces.len() as u32;
    let r = g.b.push(InstrKind::Reduced(k), node.output.dtype);
    g.phase_start = g.b.body.len() - 1;
    if *keepdim {
        // Later ops read the [.., 1, ..] result broadcast along the row: forward the value.
        let view = TensorRef {
            layout: node.output.layout.expand(&g.sizes),
            ..node.output.clone()
        };
        g.b.forwards.push((view, r));
    }
    g.reduces.push(GroupReduce {
        op: *op,
        value: v,
        output: node.output.clone(),
        node: i,
        strides: out_strides,
    });
    g.nodes.push(i);
    g.ops += 1;
    true
}

/// Plans `nodes` (in program order) into steps that run in order. `live(b)` says whether
/// something outside the trace (a tensor handle) can still read buffer `b`.
pub fn plan(nodes: &[Node], live: &dyn Fn(BufferId) -> bool, opts: &PlanOptions) -> Plan {
    let mut plan = Plan::default();
    if !opts.fuse {
        for (i, n) in nodes.iter().enumerate() {
            plan.push_lowered(n, i);
        }
        return plan;
    }
    // Backward pass: a node is needed if its output is live or read by a needed later node.
    let mut needed = vec![false; nodes.len()];
    let mut wanted: HashSet<BufferId> = HashSet::new();
    for (i, n) in nodes.iter().enumerate().rev() {
        if live(n.output.buffer) || wanted.contains(&n.output.buffer) {
            needed[i] = true;
            wanted.extend(n.reads());
        } else {
            plan.dead_nodes += 1;
        }
    }
    let mut readers: HashMap<BufferId, Vec<usize>> = HashMap::new();
    let mut seen: HashSet<BufferId> = HashSet::new();
    let mut fresh = HashSet::new();
    for (i, n) in nodes.iter().enumerate().filter(|(i, _)| needed[*i]) {
        for b in n.reads() {
            readers.entry(b).or_default().push(i);
            seen.insert(b);
        }
        let o = &n.output;
        if seen.insert(o.buffer) && o.layout.is_contiguous() && o.layout.offset == 0 {
            fresh.insert((o.buffer, i));
        }
    }
    let facts = Facts {
        nodes,
        live,
        readers,
        fresh,
    };
    let mut group: Option<Group> = None;
    let mut pending_mm: Option<PendingMatmul> = None;
    let cut = |g: Group, i: usize, why: CutReason, plan: &mut Plan| {
        plan.cuts[why as usize] += 1;
        plan.cut_log.push((i, why));
        close(g, &facts, plan);
    };
    for (i, node) in nodes.iter().enumerate().filter(|(i, _)| needed[*i]) {
        match &node.op {
            op if op.is_elementwise() => {
                let sizes = node.output.layout.sizes.clone();
                if let Some(mm) = pending_mm.take() {
                    if mm.accepts(&nodes[mm.node], node) {
                        let mut g = Group::new(sizes);
                        g.mm = Some(mm);
                        g.add_elementwise(i, node);
                        group = Some(g);
                        continue;
                    }
                    plan.push_matmul(mm);
                }
                let mut g = match group.take() {
                    Some(g) => {
                        let why = if !g.fits_shape(&sizes) {
                            Some(CutReason::Shape)
                        } else {
                            g.conflict(node, opts.max_ops_per_region).or_else(|| {
                                let extra: Vec<&TensorRef> = node
                                    .inputs
                                    .iter()
                                    .filter_map(|o| o.tensor())
                                    .chain([&node.output])
                                    .collect();
                                (g.red_dims.is_some()
                                    && !g.rows_coalesce(&g.operand_strides(&extra)))
                                .then_some(CutReason::Layout)
                            })
                        };
                        match why {
                            None => g,
                            Some(why) => {
                                cut(g, i, why, &mut plan);
                                Group::new(sizes)
                            }
                        }
                    }
                    None => Group::new(sizes),
                };
                g.add_elementwise(i, node);
                group = Some(g);
            }
            Op::Reduce { .. } => {
                if let Some(mm) = pending_mm.take() {
                    plan.push_matmul(mm);
                }
                let t = node.inputs[0].tensor().expect("reduce input is a tensor");
                let mut g = group
                    .take()
                    .unwrap_or_else(|| Group::new(t.layout.sizes.clone()));
                if !join_reduce(&mut g, i, &facts) {
                    let why = if g.sizes.as_slice() != t.layout.sizes.as_slice() {
                        CutReason::Shape
                    } else {
                        CutReason::Reduction
                    };
                    cut(g, i, why, &mut plan);
                    g = Group::new(t.layout.sizes.clone());
                    let joined = join_reduce(&mut g, i, &facts);
                    assert!(
                        joined,
                        "the runtime copies inputs whose reduced dims do not coalesce"
                    );
                }
                group = Some(g);
            }
            _ => {
                if let Some(mm) = pending_mm.take() {
                    plan.push_matmul(mm);
                }
                if let Some(g) = group.take() {
                    cut(g, i, CutReason::Unfusable, &mut plan);
                }
                if matches!(node.op, Op::Matmul | Op::Addmm) {
                    // Held back: the next op may become its epilogue.
                    pending_mm = Some(PendingMatmul {
                        node: i,
                        steps: lower_node(node, i),
                    });
                } else {
                    plan.push_lowered(node, i);
                }
            }
        }
    }
    if let Some(g) = group {
        close(g, &facts, &mut plan);
    }
    if let Some(mm) = pending_mm {
        plan.push_matmul(mm);
    }
    plan
}
