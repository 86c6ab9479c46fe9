//! The planner: cuts a stream's pending nodes into ordered steps.
//!
//! Greedy and linear in the trace: nodes nobody can observe are dropped; consecutive elementwise
//! nodes over one iteration shape become one loop region, reading each other's values from
//! registers. A reduction turns its loop into a row kernel: later reductions over the same dims
//! and elementwise consumers of the results (over the rows, or per row) join it as further
//! sweeps over each row, so softmax and layernorm read their input from memory once. A value is
//! written to memory only if a live handle, a later step or an in-place write needs it. Every cut
//! has a reason, counted in [`Plan::cuts`].

mod capabilities;
mod group;
mod reorder;
mod whole;
pub use capabilities::{Capabilities, KernelsInRegion};
pub use group::MAX_LOADED_BUFFERS;

use crate::epilogue::{combine, PendingMatmul};
use crate::ir::{Layout, Op, Strides};
use crate::lower::{
    elementwise_step, loop_step, lower_node, reduce_acc_dtype, ScalarSrc, StepReduce,
};
use crate::reduce_geometry::{reduce_out_strides, reduce_space_for, reduced_dims};
use crate::region::{InstrKind, Step, ValueIdx};
use crate::trace::{BufferId, Node, TensorRef};
use group::{Group, GroupReduce};
/// Std maps with a fast hasher: keys are our own ids, and planning runs on every new trace.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
type HashSet<K> = std::collections::HashSet<K, ahash::RandomState>;

/// Why a loop region ended where it did.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutReason {
    /// The next op is not a loop op (matmul, arange), or on a backend that fuses whole
    /// programs, an op it cannot lower (a kernel op): it runs as its own step.
    Unfusable = 0,
    /// The next op iterates over another shape (or reduces over other dims).
    Shape = 1,
    /// The next op reads or writes a buffer of this loop through another view.
    Layout = 2,
    /// A reduction could not join the loop before it.
    Reduction = 3,
    /// The loop reached the configured maximum of ops per region (for whole programs:
    /// [`Capabilities::max_region_ops`]).
    MaxOps = 4,
}

impl CutReason {
    /// Number of reasons (the length of `Plan::cuts`).
    pub const COUNT: usize = 5;

    /// The reason's name in stats and logs.
    pub fn name(self) -> &'static str {
        match self {
            CutReason::Unfusable => "unfusable",
            CutReason::Shape => "shape",
            CutReason::Layout => "layout",
            CutReason::Reduction => "reduction",
            CutReason::MaxOps => "max_ops",
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
    /// What the backend takes in one region (loop regions, or whole programs).
    pub capabilities: Capabilities,
    /// The last node writing the value a host read waits for, when the flush runs for one on
    /// a backend that [splits at host reads](Capabilities::splits_at_host_read). A
    /// whole-program plan closes its program after that node, so the read waits for the part
    /// of the flush it needs (a training step's forward, for `loss.item()`) while the rest
    /// (the backward and the optimizer) runs as a second program after it, as the host goes
    /// on recording. It is not a fusion cut (`Plan::cuts` does not count it): the flush's
    /// timeline span says how many steps ran after the read (`after_read`). Loop plans ignore
    /// it: their steps already end near the value.
    pub read_node: Option<usize>,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            fuse: true,
            max_ops_per_region: 64,
            capabilities: Capabilities::LOOPS,
            read_node: None,
        }
    }
}

/// The planner's output.
#[derive(Debug, Default)]
pub struct Plan {
    /// What to run, in order.
    pub steps: Vec<Step>,
    /// Cuts by `CutReason as usize`.
    pub cuts: [u64; CutReason::COUNT],
    /// Nodes dropped because nothing can observe their result.
    pub dead_nodes: usize,
    /// Values computed in registers and never written to memory.
    pub unmaterialized: usize,
    /// For each cut, the node that triggered it and why (for logs).
    pub cut_log: Vec<(usize, CutReason)>,
    /// Where `steps` came from, in order (what a cached plan needs to re-bind them). Empty in
    /// a plan handed back by the plan cache, which keeps its own copy.
    pub origins: Vec<StepOrigin>,
}

/// How a run of steps was made.
#[derive(Clone, Debug, PartialEq)]
pub enum StepOrigin {
    /// One fused loop step; its scalar slots come from these node inputs.
    Fused(Vec<ScalarSrc>),
    /// `steps` steps lowered from trace node `node` alone (matmul, arange).
    Lowered {
        /// Index of the node in the trace.
        node: usize,
        /// How many steps it lowered to.
        steps: usize,
    },
    /// Matmul node `node`'s `prefix` lowered steps (a bias copy), then its GEMM combined with
    /// a fused epilogue whose scalar slots (after alpha and beta) come from `src`.
    MatmulEpilogue {
        /// Index of the matmul node in the trace.
        node: usize,
        /// How many lowered steps come before the GEMM.
        prefix: usize,
        /// Origins of the epilogue's scalar slots.
        src: Vec<ScalarSrc>,
    },
    /// One whole-program step ([`crate::region::Region::Graph`]) of trace nodes `nodes`, each
    /// lowered alone into the graph's parts.
    Graph {
        /// The trace nodes, in order.
        nodes: Vec<usize>,
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

/// What the planner knows of the trace as a whole.
struct Facts<'a> {
    nodes: &'a [Node],
    live: &'a dyn Fn(BufferId) -> bool,
    /// For each buffer, the indices of the nodes that read it.
    readers: HashMap<BufferId, Vec<usize>>,
    /// (buffer, node) pairs where the node's output is a fresh, full, contiguous tensor.
    fresh: HashSet<(BufferId, usize)>,
    /// Each node's place in the order the planner visits them (see `reorder`).
    position: Vec<usize>,
}

impl Facts<'_> {
    /// Must the value `node` wrote to `t` reach memory, given that the nodes visited up to
    /// `end` ran?
    fn must_store(&self, t: &TensorRef, node: usize, end: usize) -> bool {
        (self.live)(t.buffer)
            || !self.fresh.contains(&(t.buffer, node))
            || self
                .readers
                .get(&t.buffer)
                .is_some_and(|r| r.iter().any(|&j| self.position[j] > self.position[end]))
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
    if g.reduces.is_empty() && !g.nodes.is_empty() && reduces_leading_dims(&t.layout, &red) {
        // A reduction over leading dims (a bias gradient's `g.sum(0)`, layer norm's weight
        // gradient) runs on gathered columns when elementwise ops share its loop
        // (`backend/cpu/columns.rs`): 1.5-5x slower than those ops' own loop followed by the
        // reduction alone, which sums its input in place (`[16384, 256]` `(g * x).sum(0)` 10.0
        // ms fused against 1.7 + 1.6). The same values and sum order either way. A loop that
        // already reduces (softmax over a leading dim: its max, then exp, then the sum) stays
        // whole: split, it materialized the exp and ran 1.4x slower.
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
    // Later ops read the [.., 1, ..] result broadcast along the row: forward the value. A
    // squeezed result is read the same way by the ops `Group::keepdim_form` rewrites.
    let keepdim_view = if *keepdim {
        node.output.clone()
    } else {
        group::unsqueeze_reduced(&node.output, &g.sizes, &red)
    };
    let view = TensorRef {
        layout: keepdim_view.layout.expand(&g.sizes),
        ..keepdim_view
    };
    g.b.forwards.push((view, r));
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

/// True when `layout`'s fastest-moving dim (the smallest stride among dims longer than 1) is
/// not among the reduced dims `red` and some reduced dim is longer than 1: the reduction walks
/// memory across its rows.
fn reduces_leading_dims(layout: &Layout, red: &[usize]) -> bool {
    let inner = (0..layout.rank())
        .filter(|&d| layout.sizes[d] > 1)
        .min_by_key(|&d| layout.strides[d].unsigned_abs());
    inner.is_some_and(|d| !red.contains(&d)) && red.iter().any(|&d| layout.sizes[d] > 1)
}

/// Which nodes must run: a node is needed if its output is live or read by a needed later
/// node (a backward pass). Counts the others in `plan.dead_nodes`.
fn needed_nodes(nodes: &[Node], live: &dyn Fn(BufferId) -> bool, plan: &mut Plan) -> Vec<bool> {
    let mut needed = vec![false; nodes.len()];
    let mut wanted: HashSet<BufferId> = HashSet::default();
    for (i, n) in nodes.iter().enumerate().rev() {
        if live(n.output.buffer) || wanted.contains(&n.output.buffer) {
            needed[i] = true;
            wanted.extend(n.reads());
        } else {
            plan.dead_nodes += 1;
        }
    }
    needed
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
    let needed = needed_nodes(nodes, live, &mut plan);
    if opts.capabilities.fuses_whole_programs {
        whole::plan(
            nodes,
            &needed,
            live,
            &opts.capabilities,
            opts.read_node,
            &mut plan,
        );
        return plan;
    }
    let order = reorder::visit_order(nodes, &needed);
    let mut position = vec![usize::MAX; nodes.len()];
    for (k, &i) in order.iter().enumerate() {
        position[i] = k;
    }
    let mut readers: HashMap<BufferId, Vec<usize>> = HashMap::default();
    let mut seen: HashSet<BufferId> = HashSet::default();
    let mut fresh = HashSet::default();
    for &i in &order {
        let n = &nodes[i];
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
        position,
    };
    let mut group: Option<Group> = None;
    let mut pending_mm: Option<PendingMatmul> = None;
    let cut = |g: Group, i: usize, why: CutReason, plan: &mut Plan| {
        plan.cuts[why as usize] += 1;
        plan.cut_log.push((i, why));
        close(g, &facts, plan);
    };
    for &i in &order {
        let node = &nodes[i];
        match &node.op {
            op if op.is_elementwise() => {
                let keepdim = group.as_ref().and_then(|g| g.keepdim_form(node));
                let node = keepdim.as_ref().unwrap_or(node);
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
