//! The planner: cuts a stream's pending nodes into ordered steps.
//!
//! Greedy and linear in the trace: nodes nobody can observe are dropped; consecutive elementwise
//! nodes over one iteration shape become one loop region, reading each other's values from
//! registers; a reduction closes the loop it ends (its elementwise producers run inside it).
//! A value is written to memory only if a live handle, a later step or an in-place write needs
//! it. Every cut has a reason, counted in [`Plan::cuts`].

use crate::ir::{Dims, Layout, Op, Strides};
use crate::lower::{
    elementwise_step, emit_elementwise, loop_step, lower_node, reduce_acc_dtype,
    reduce_out_strides, reduce_space_for, LoopBuilder,
};
use crate::region::{Step, ValueIdx};
use crate::trace::{BufferId, Node, TensorRef};
use std::collections::{HashMap, HashSet};

/// Why a loop region ended where it did.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutReason {
    /// The next op is not a loop op (matmul, arange): it runs as its own step.
    Unfusable = 0,
    /// The next op iterates over another shape.
    Shape = 1,
    /// The next op reads or writes a buffer of this loop through another view.
    Layout = 2,
    /// A reduction ended the loop (its consumers start the next one).
    Reduction = 3,
    /// The loop reached the configured maximum of ops per region.
    MaxOps = 4,
}

impl CutReason {
    pub const COUNT: usize = 5;

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
}

/// A loop region being built.
struct Group {
    b: LoopBuilder,
    sizes: Dims,
    /// Values written to buffer views, in order: (view, value, node index).
    written: Vec<(TensorRef, ValueIdx, usize)>,
    /// Views of buffers this loop loads.
    reads: HashMap<BufferId, Vec<Layout>>,
    nodes: Vec<usize>,
    ops: usize,
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
        }
    }

    /// Why `node` cannot join, if it cannot.
    fn conflict(&self, node: &Node, sizes: &[usize], max_ops: usize) -> Option<CutReason> {
        if self.sizes.as_slice() != sizes {
            return Some(CutReason::Shape);
        }
        if self.ops >= max_ops {
            return Some(CutReason::MaxOps);
        }
        for t in node.inputs.iter().filter_map(|o| o.tensor()) {
            let view = t.layout.expand(sizes);
            let written: Vec<&TensorRef> = self
                .written
                .iter()
                .map(|(w, _, _)| w)
                .filter(|w| w.buffer == t.buffer)
                .collect();
            if !written.is_empty()
                && !written
                    .iter()
                    .any(|w| w.layout == view && w.dtype == t.dtype)
            {
                return Some(CutReason::Layout);
            }
        }
        let out = &node.output;
        if self
            .reads
            .get(&out.buffer)
            .is_some_and(|ls| ls.iter().any(|l| *l != out.layout))
        {
            return Some(CutReason::Layout);
        }
        if self
            .written
            .iter()
            .any(|(w, _, _)| w.buffer == out.buffer && w.layout != out.layout)
        {
            return Some(CutReason::Layout);
        }
        None
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
        let v = emit_elementwise(&mut self.b, node);
        self.b.forwards.push((node.output.clone(), v));
        self.written.push((node.output.clone(), v, i));
        self.nodes.push(i);
        self.ops += 1;
    }
}

/// What the planner knows of the trace as a whole.
struct Facts<'a> {
    nodes: &'a [Node],
    live: &'a dyn Fn(BufferId) -> bool,
    /// For each buffer, the indices of the nodes that read it.
    readers: HashMap<BufferId, Vec<usize>>,
    /// Buffers first seen as the full, contiguous output of a node (a fresh tensor).
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

fn stored_outputs(
    g: &Group,
    facts: &Facts,
    end: usize,
    plan: &mut Plan,
) -> Vec<(ValueIdx, TensorRef)> {
    let mut out: Vec<(ValueIdx, TensorRef)> = Vec::new();
    for (k, (t, v, node)) in g.written.iter().enumerate() {
        // Only the last write to a view reaches memory.
        let overwritten = g.written[k + 1..].iter().any(|(w, _, _)| w == t);
        if !overwritten && facts.must_store(t, *node, end) {
            out.push((*v, t.clone()));
        } else {
            plan.unmaterialized += 1;
        }
    }
    out
}

fn close(g: Group, facts: &Facts, plan: &mut Plan) {
    let end = *g.nodes.last().expect("groups are never empty");
    let outputs = stored_outputs(&g, facts, end, plan);
    if !outputs.is_empty() {
        plan.steps.push(elementwise_step(g.b, outputs, g.nodes));
    }
}

/// Tries to end group `g` with reduction node `i`; gives the group back if it cannot.
fn close_with_reduce(mut g: Group, i: usize, facts: &Facts, plan: &mut Plan) -> Result<(), Group> {
    let node = &facts.nodes[i];
    let Op::Reduce { op, dims, keepdim } = &node.op else {
        unreachable!()
    };
    let t = node.inputs[0].tensor().expect("reduce input is a tensor");
    if g.sizes.as_slice() != t.layout.sizes.as_slice()
        || g.conflict(node, &t.layout.sizes, usize::MAX).is_some()
    {
        return Err(g);
    }
    let outputs = stored_outputs(&g, facts, i, &mut Plan::default());
    let rank = t.layout.rank();
    let mut strides: Vec<Strides> =
        g.b.inputs
            .iter()
            .map(|x| x.layout.strides.clone())
            .collect();
    let forwarded = g.b.forwarded(t).is_some();
    if !forwarded && !g.b.inputs.iter().any(|x| x == t) {
        strides.push(t.layout.strides.clone());
    }
    strides.extend(outputs.iter().map(|(_, o)| o.layout.strides.clone()));
    strides.push(reduce_out_strides(
        &node.output.layout,
        rank,
        dims,
        *keepdim,
    ));
    if reduce_space_for(&t.layout.sizes, dims, &strides).reduced > 1 {
        return Err(g);
    }
    g.note_reads(node);
    let v = match g.b.forwarded(t) {
        Some(v) => v,
        None => g.b.load(t),
    };
    let v = g.b.cast(v, reduce_acc_dtype(*op, t.dtype));
    g.nodes.push(i);
    let outputs = stored_outputs(&g, facts, i, plan);
    let mut strides: Vec<Strides> =
        g.b.inputs
            .iter()
            .map(|x| x.layout.strides.clone())
            .collect();
    strides.extend(outputs.iter().map(|(_, o)| o.layout.strides.clone()));
    strides.push(reduce_out_strides(
        &node.output.layout,
        rank,
        dims,
        *keepdim,
    ));
    let iter = reduce_space_for(&t.layout.sizes, dims, &strides);
    plan.steps.push(loop_step(
        g.b,
        outputs,
        Some((*op, v, node.output.clone())),
        iter,
        g.nodes,
    ));
    Ok(())
}

/// Plans `nodes` (in program order) into steps that run in order. `live(b)` says whether
/// something outside the trace (a tensor handle) can still read buffer `b`.
pub fn plan(nodes: &[Node], live: &dyn Fn(BufferId) -> bool, opts: &PlanOptions) -> Plan {
    let mut plan = Plan::default();
    if !opts.fuse {
        plan.steps = nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| lower_node(n, i))
            .collect();
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
    for (i, node) in nodes.iter().enumerate().filter(|(i, _)| needed[*i]) {
        let cut = |g: Group, why: CutReason, plan: &mut Plan| {
            plan.cuts[why as usize] += 1;
            plan.cut_log.push((i, why));
            close(g, &facts, plan);
        };
        match &node.op {
            op if op.is_elementwise() => {
                let sizes = node.output.layout.sizes.clone();
                let mut g = match group.take() {
                    Some(g) => match g.conflict(node, &sizes, opts.max_ops_per_region) {
                        None => g,
                        Some(why) => {
                            cut(g, why, &mut plan);
                            Group::new(sizes)
                        }
                    },
                    None => Group::new(sizes),
                };
                g.add_elementwise(i, node);
                group = Some(g);
            }
            Op::Reduce { .. } => {
                let t = node.inputs[0].tensor().expect("reduce input is a tensor");
                let g = group
                    .take()
                    .unwrap_or_else(|| Group::new(t.layout.sizes.clone()));
                match close_with_reduce(g, i, &facts, &mut plan) {
                    Ok(()) => {}
                    Err(g) => {
                        let why = if g.sizes.as_slice() != t.layout.sizes.as_slice() {
                            CutReason::Shape
                        } else {
                            CutReason::Layout
                        };
                        if !g.nodes.is_empty() {
                            cut(g, why, &mut plan);
                        }
                        close_with_reduce(Group::new(t.layout.sizes.clone()), i, &facts, &mut plan)
                            .unwrap_or_else(|_| plan.steps.extend(lower_node(node, i)));
                    }
                }
                plan.cuts[CutReason::Reduction as usize] += 1;
            }
            _ => {
                if let Some(g) = group.take() {
                    cut(g, CutReason::Unfusable, &mut plan);
                }
                plan.steps.extend(lower_node(node, i));
            }
        }
    }
    if let Some(g) = group {
        close(g, &facts, &mut plan);
    }
    plan
}
