//! Whole-program planning, for a backend whose own compiler fuses (see [`Capabilities`]).
//!
//! Every needed node between two cuts goes into one [`Region::Graph`]: each node is lowered
//! alone (`lower_node`) into a part, and the backend compiles the parts as one program, fusing
//! across shapes, matmuls and reductions itself. A graph of a single step stays that step. A
//! graph is cut only by an op the backend cannot lower (a kernel op outside
//! [`Capabilities::kernels_in_region`], which runs as its own step; so does an op over an
//! empty tensor), by the size bound, or by a buffer seen with two dtypes (a program holds each
//! buffer as one array).
//!
//! The planner decides what crosses the program's boundary: a buffer is an input when the graph
//! reads it before writing it, writes it first through a view that may not cover it (a partial
//! or in-place write: the rest keeps its old value), or writes first a buffer some handle can
//! see (the backend skips that input when the write covers the whole buffer); a written buffer
//! is an output when a live handle or a later step reads it. Every other value stays inside the
//! program and is counted as unmaterialized.

use super::{Capabilities, CutReason, Plan, StepOrigin};
use crate::ir::DType;
use crate::lower::lower_node;
use crate::region::{Binding, GraphPart, GraphRegion, Region, Step};
use crate::trace::{BufferId, Node, TensorRef};
use std::sync::Arc;
/// Std maps with a fast hasher: keys are our own ids, and planning runs on every new trace.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
type HashSet<K> = std::collections::HashSet<K, ahash::RandomState>;

/// What the planner knows of the trace as a whole.
struct Facts<'a> {
    live: &'a dyn Fn(BufferId) -> bool,
    /// (buffer, node) pairs where the node's output is the buffer's first appearance in the
    /// trace, as a full contiguous tensor: the node creates the buffer's whole value.
    fresh: HashSet<(BufferId, usize)>,
    /// For each buffer, the last needed node that reads it.
    last_read: HashMap<BufferId, usize>,
}

/// A graph being built: trace nodes and the steps they lowered to.
#[derive(Default)]
struct Graph {
    nodes: Vec<usize>,
    parts: Vec<Step>,
    dtypes: HashMap<BufferId, DType>,
}

impl Graph {
    /// Whether `node` would give a buffer of this graph a second dtype.
    fn dtype_conflict(&self, node: &Node) -> bool {
        node.inputs
            .iter()
            .filter_map(|o| o.tensor())
            .chain([&node.output])
            .any(|t| self.dtypes.get(&t.buffer).is_some_and(|&d| d != t.dtype))
    }

    fn add(&mut self, i: usize, node: &Node) {
        for t in node
            .inputs
            .iter()
            .filter_map(|o| o.tensor())
            .chain([&node.output])
        {
            self.dtypes.insert(t.buffer, t.dtype);
        }
        self.nodes.push(i);
        self.parts.extend(lower_node(node, i));
    }
}

/// The buffers a step reads: its inputs, and a matmul's old output when beta is not 0.
fn part_reads(s: &Step) -> impl Iterator<Item = &TensorRef> {
    let b = &s.binding;
    let old_out = matches!(*s.region, Region::Matmul { .. }) && f64::from_bits(b.scalars[1]) != 0.0;
    b.operands[..b.n_inputs]
        .iter()
        .chain(old_out.then(|| &b.operands[b.n_inputs]))
}

/// Builds the graph's step from its parts (see the module doc for inputs and outputs). A
/// graph of one step is that step: the backend runs it as a one-region program, which serves
/// every shape of its bucket instead of compiling per exact signature.
fn close(mut g: Graph, facts: &Facts, plan: &mut Plan) {
    if g.parts.len() == 1 {
        let node = g.nodes[0];
        plan.origins.push(StepOrigin::Lowered { node, steps: 1 });
        plan.steps.push(g.parts.pop().expect("one part"));
        return;
    }
    let end = *g.nodes.last().expect("graphs are never empty");
    let mut index: HashMap<BufferId, u32> = HashMap::default();
    let mut refs: Vec<TensorRef> = Vec::new();
    let mut defined: HashSet<BufferId> = HashSet::default();
    let mut inputs: Vec<BufferId> = Vec::new();
    let mut written: Vec<BufferId> = Vec::new();
    for s in &g.parts {
        let node = s.nodes[0];
        for t in &s.binding.operands {
            index.entry(t.buffer).or_insert_with(|| {
                refs.push(t.clone());
                (refs.len() - 1) as u32
            });
        }
        for t in part_reads(s) {
            if !defined.contains(&t.buffer) && !inputs.contains(&t.buffer) {
                inputs.push(t.buffer);
            }
        }
        for t in &s.binding.operands[s.binding.n_inputs..] {
            let b = t.buffer;
            if defined.insert(b) {
                let whole = facts.fresh.contains(&(b, node));
                if (!whole || (facts.live)(b)) && !inputs.contains(&b) {
                    inputs.push(b);
                }
                // The binding names a written buffer by the view that created it.
                refs[index[&b] as usize] = t.clone();
            }
            if !written.contains(&b) {
                written.push(b);
            }
        }
    }
    let outputs: Vec<BufferId> = written
        .iter()
        .copied()
        .filter(|b| (facts.live)(*b) || facts.last_read.get(b).is_some_and(|&r| r > end))
        .collect();
    plan.unmaterialized += written.len() - outputs.len();
    let operands: Vec<u32> = inputs.iter().chain(&outputs).map(|b| index[b]).collect();
    let region = GraphRegion {
        parts: g
            .parts
            .iter()
            .map(|s| GraphPart {
                region: s.region.clone(),
                operands: s
                    .binding
                    .operands
                    .iter()
                    .map(|t| index[&t.buffer])
                    .collect(),
            })
            .collect(),
        buffers: refs.len() as u32,
        operands: operands.clone(),
        n_inputs: inputs.len(),
    };
    let binding = Binding {
        operands: operands.iter().map(|&k| refs[k as usize].clone()).collect(),
        iter: None,
        scalars: Vec::new(),
        n_inputs: inputs.len(),
        parts: g.parts.into_iter().map(|s| s.binding).collect(),
    };
    plan.origins.push(StepOrigin::Graph {
        nodes: g.nodes.clone(),
    });
    plan.steps.push(Step {
        region: Arc::new(Region::Graph(region)),
        binding,
        nodes: g.nodes,
        key: Default::default(),
    });
}

/// Plans the needed nodes of `nodes` into whole-program steps (and the steps of the ops the
/// backend cannot take), appending to `plan`. With `read_node`, the program holding that node
/// ends after it (see [`super::PlanOptions::read_node`]).
pub(super) fn plan(
    nodes: &[Node],
    needed: &[bool],
    live: &dyn Fn(BufferId) -> bool,
    caps: &Capabilities,
    read_node: Option<usize>,
    plan: &mut Plan,
) {
    let mut seen: HashSet<BufferId> = HashSet::default();
    let mut facts = Facts {
        live,
        fresh: HashSet::default(),
        last_read: HashMap::default(),
    };
    for (i, n) in nodes.iter().enumerate().filter(|(i, _)| needed[*i]) {
        for b in n.reads() {
            facts.last_read.insert(b, i);
            seen.insert(b);
        }
        let o = &n.output;
        if seen.insert(o.buffer) && o.layout.is_contiguous() && o.layout.offset == 0 {
            facts.fresh.insert((o.buffer, i));
        }
    }
    let mut graph = Graph::default();
    // A node over an empty tensor runs as its own step: its one-region program already
    // handles every empty shape, and it has no work worth fusing.
    let takes = |node: &Node| {
        caps.takes(&node.op, node.output.dtype)
            && node
                .inputs
                .iter()
                .filter_map(|o| o.tensor())
                .chain([&node.output])
                .all(|t| t.layout.numel() > 0)
    };
    for (i, node) in nodes.iter().enumerate().filter(|(i, _)| needed[*i]) {
        if read_node.is_some_and(|r| r < i && graph.nodes.last().is_some_and(|&l| l <= r)) {
            // The graph holds the read's value: what follows is the next program, which runs
            // while the host goes on. Not a fusion cut, so not counted as one.
            close(std::mem::take(&mut graph), &facts, plan);
        }
        let why = if !takes(node) {
            Some(CutReason::Unfusable)
        } else if graph.nodes.len() >= caps.max_region_ops {
            Some(CutReason::MaxOps)
        } else if graph.dtype_conflict(node) {
            Some(CutReason::Layout)
        } else {
            None
        };
        if let Some(why) = why {
            if !graph.nodes.is_empty() {
                plan.cuts[why as usize] += 1;
                plan.cut_log.push((i, why));
                close(std::mem::take(&mut graph), &facts, plan);
            }
        }
        if takes(node) {
            graph.add(i, node);
        } else {
            plan.push_lowered(node, i);
        }
    }
    if !graph.nodes.is_empty() {
        close(graph, &facts, plan);
    }
}
