//! Steady-state plan reuse: a loop that records the same op sequence every iteration gets the
//! plan of its first iteration back, re-bound to this iteration's buffers and scalars, instead
//! of being planned again.
//!
//! The key is the trace's structure, exactly what the planner looks at (see [`crate::key`]).
//! Keys are compared word for word on a hit, so a hash collision can never hand back a wrong
//! plan.

use crate::epilogue::rebind_gemm;
use crate::key::TraceKey;
use crate::lower::{lower_node, scalar_bits};
use crate::plan::{plan, CutReason, Plan, PlanOptions, StepOrigin};
use crate::region::{Binding, Region, Step};
use crate::trace::{BufferId, Node, Operand};
use std::sync::Arc;
/// The std map with a fast hasher: a steady-state flush builds these maps every time.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// A plan with buffer ids replaced by their order of first appearance.
struct Template {
    words: Vec<u64>,
    steps: Vec<Step>,
    origins: Vec<StepOrigin>,
    cuts: [u64; CutReason::COUNT],
    dead_nodes: usize,
    unmaterialized: usize,
    cut_log: Vec<(usize, CutReason)>,
    /// The options' read node: the same trace read at another node plans differently.
    read_node: Option<usize>,
}

impl Template {
    fn new(p: &Plan, words: Vec<u64>, buffers: &[BufferId], read_node: Option<usize>) -> Template {
        let rel: HashMap<BufferId, u64> = buffers
            .iter()
            .enumerate()
            .map(|(i, &b)| (b, i as u64))
            .collect();
        let mut steps = p.steps.clone();
        for s in &mut steps {
            for t in &mut s.binding.operands {
                t.buffer = rel[&t.buffer];
            }
            // A graph's parts are lowered again on every instantiation (see `instantiate`).
            s.binding.parts = Vec::new();
        }
        Template {
            words,
            steps,
            origins: p.origins.clone(),
            cuts: p.cuts,
            dead_nodes: p.dead_nodes,
            unmaterialized: p.unmaterialized,
            cut_log: p.cut_log.clone(),
            read_node,
        }
    }

    /// The plan for `nodes`, whose structure equals the template's; `None` when a graph's
    /// nodes lower to other regions than the template's did (a scalar that decides the
    /// lowering changed, like addmm's beta becoming 0), so the trace must be planned again.
    fn instantiate(&self, nodes: &[Node], buffers: &[BufferId]) -> Option<Plan> {
        let mut steps = Vec::with_capacity(self.steps.len());
        let mut k = 0;
        for o in &self.origins {
            match o {
                StepOrigin::Fused(src) => {
                    let mut s = self.steps[k].clone();
                    k += 1;
                    for t in &mut s.binding.operands {
                        t.buffer = buffers[t.buffer as usize];
                    }
                    debug_assert_eq!(src.len(), s.binding.scalars.len());
                    for (slot, sc) in s.binding.scalars.iter_mut().zip(src) {
                        if let Operand::Scalar(v) = nodes[sc.node].inputs[sc.input] {
                            *slot = scalar_bits(v, sc.to);
                        }
                    }
                    steps.push(s);
                }
                // Lowered steps may depend on scalar values (addmm's beta): lower them again.
                StepOrigin::Lowered { node, steps: n } => {
                    steps.extend(lower_node(&nodes[*node], *node));
                    k += n;
                }
                StepOrigin::MatmulEpilogue { node, prefix, src } => {
                    let mut lowered = lower_node(&nodes[*node], *node);
                    let gemm = lowered.pop().expect("a matmul lowers to its GEMM");
                    steps.extend(lowered);
                    let mut s = self.steps[k + prefix].clone();
                    k += prefix + 1;
                    for t in &mut s.binding.operands {
                        t.buffer = buffers[t.buffer as usize];
                    }
                    rebind_gemm(&mut s, &gemm);
                    for (slot, sc) in s.binding.scalars[2..].iter_mut().zip(src) {
                        if let Operand::Scalar(v) = nodes[sc.node].inputs[sc.input] {
                            *slot = scalar_bits(v, sc.to);
                        }
                    }
                    steps.push(s);
                }
                StepOrigin::Graph { nodes: members } => {
                    steps.push(self.graph_step(&self.steps[k], members, nodes, buffers)?);
                    k += 1;
                }
            }
        }
        Some(Plan {
            steps,
            cuts: self.cuts,
            dead_nodes: self.dead_nodes,
            unmaterialized: self.unmaterialized,
            cut_log: self.cut_log.clone(),
            // Only a fresh plan needs them (to become a template); the template keeps its own.
            origins: Vec::new(),
        })
    }

    /// Graph step `t` of the template for trace nodes `members`: the parts are lowered again
    /// (their bindings carry this trace's views and scalars) and must be the template's
    /// regions, so the graph region and its memoized key are shared.
    fn graph_step(
        &self,
        t: &Step,
        members: &[usize],
        nodes: &[Node],
        buffers: &[BufferId],
    ) -> Option<Step> {
        let Region::Graph(g) = &*t.region else {
            unreachable!("a graph origin names a graph step")
        };
        let mut parts = Vec::with_capacity(g.parts.len());
        for &n in members {
            parts.extend(lower_node(&nodes[n], n));
        }
        let same = parts.len() == g.parts.len()
            && parts
                .iter()
                .zip(&g.parts)
                .all(|(s, p)| Arc::ptr_eq(&s.region, &p.region) || s.region == p.region);
        if !same {
            return None;
        }
        let mut operands = t.binding.operands.clone();
        for o in &mut operands {
            o.buffer = buffers[o.buffer as usize];
        }
        Some(Step {
            region: t.region.clone(),
            binding: Binding {
                operands,
                iter: None,
                scalars: Vec::new(),
                n_inputs: t.binding.n_inputs,
                parts: parts.into_iter().map(|s| s.binding).collect(),
            },
            nodes: t.nodes.clone(),
            key: t.key.clone(),
        })
    }
}

/// Plans of recently seen trace structures (bounded; cleared when full).
pub struct PlanCache {
    map: HashMap<u64, Vec<Template>>,
    len: usize,
    capacity: usize,
}

impl PlanCache {
    /// A cache of at most `capacity` plans.
    pub fn new(capacity: usize) -> PlanCache {
        PlanCache {
            map: HashMap::default(),
            len: 0,
            capacity: capacity.max(1),
        }
    }

    /// Plans `nodes` like [`plan`], reusing the plan of an earlier trace with the same
    /// structure; the flag says whether it did.
    pub fn plan(
        &mut self,
        nodes: &[Node],
        live: &dyn Fn(BufferId) -> bool,
        opts: &PlanOptions,
    ) -> (Plan, bool) {
        let (key, hash) = TraceKey::of(nodes, live);
        self.plan_keyed(nodes, &key, hash, live, opts)
    }

    /// [`PlanCache::plan`] for a trace whose key was built as it was recorded: `key` holds
    /// every node of `nodes` and was finished (with `live`'s answers), giving `hash`.
    pub fn plan_keyed(
        &mut self,
        nodes: &[Node],
        key: &TraceKey,
        hash: u64,
        live: &dyn Fn(BufferId) -> bool,
        opts: &PlanOptions,
    ) -> (Plan, bool) {
        if let Some(t) = self.map.get(&hash).and_then(|v| {
            v.iter()
                .find(|t| t.words == key.words() && t.read_node == opts.read_node)
        }) {
            if let Some(p) = t.instantiate(nodes, key.buffers()) {
                return (p, true);
            }
            return (plan(nodes, live, opts), false);
        }
        let p = plan(nodes, live, opts);
        let covered: usize = p
            .origins
            .iter()
            .map(|o| match o {
                StepOrigin::Fused(_) => 1,
                StepOrigin::Lowered { steps, .. } => *steps,
                StepOrigin::MatmulEpilogue { prefix, .. } => prefix + 1,
                StepOrigin::Graph { .. } => 1,
            })
            .sum();
        debug_assert_eq!(covered, p.steps.len(), "every step has an origin");
        if covered != p.steps.len() {
            return (p, false);
        }
        if self.len >= self.capacity {
            self.map.clear();
            self.len = 0;
        }
        self.len += 1;
        self.map.entry(hash).or_default().push(Template::new(
            &p,
            key.words().to_vec(),
            key.buffers(),
            opts.read_node,
        ));
        (p, false)
    }
}

impl Default for PlanCache {
    /// 512 structures. A defer-mode training step has a few flushes, but in strict mode each
    /// compound ATen op (an op group) is a flush of its own, one structure per op and shape:
    /// resnet18's strict step has ~230, and with room for 64 the cache was cleared every step
    /// and ~80 groups were planned again.
    fn default() -> Self {
        PlanCache::new(512)
    }
}
