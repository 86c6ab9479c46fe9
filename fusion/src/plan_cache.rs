//! Steady-state plan reuse: a loop that records the same op sequence every iteration gets the
//! plan of its first iteration back, re-bound to this iteration's buffers and scalars, instead
//! of being planned again.
//!
//! The key is the trace's structure, exactly what the planner looks at: ops and attributes,
//! dtypes, layouts, which operands name the same buffer (buffers renumbered in order of first
//! appearance), which buffers are live, and scalar kinds (not values). Keys are compared word
//! for word on a hit, so a hash collision can never hand back a wrong plan.

use crate::epilogue::rebind_gemm;
use crate::ir::Scalar;
use crate::lower::{lower_node, scalar_bits};
use crate::plan::{plan, CutReason, Plan, PlanOptions, StepOrigin};
use crate::region::Step;
use crate::trace::{BufferId, Node, Operand};
/// The std map with a fast hasher: a steady-state flush builds these maps every time.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
use std::hash::{Hash, Hasher};

/// Collects `Hash` output as 64-bit words (the exact key) and a running hash of them.
struct Words {
    words: Vec<u64>,
    hash: u64,
}

impl Words {
    fn push(&mut self, w: u64) {
        self.words.push(w);
        // FxHash-style mixing: cheap, and collisions are caught by the word comparison.
        self.hash = (self.hash.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for Words {
    fn finish(&self) -> u64 {
        self.hash
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.push(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.push(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.push(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.push(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.push(i as u64);
    }
    fn write_isize(&mut self, i: isize) {
        self.push(i as u64);
    }
}

/// A trace's structural key and its buffers in order of first appearance.
struct Signature {
    words: Vec<u64>,
    hash: u64,
    buffers: Vec<BufferId>,
}

impl Signature {
    fn of(nodes: &[Node], live: &dyn Fn(BufferId) -> bool) -> Signature {
        let mut w = Words {
            words: Vec::with_capacity(nodes.len() * 24),
            hash: 0,
        };
        let mut ids = Renumber::default();
        let mut rel = |b: BufferId| ids.number(b);
        for n in nodes {
            w.push(0xA11);
            n.op.hash(&mut w);
            n.compute.hash(&mut w);
            for o in &n.inputs {
                match o {
                    Operand::Tensor(t) => {
                        w.push(1);
                        w.push(rel(t.buffer));
                        t.layout.hash(&mut w);
                        t.dtype.hash(&mut w);
                    }
                    Operand::Scalar(s) => w.push(match s {
                        Scalar::Float(_) => 2,
                        Scalar::Int(_) => 3,
                        Scalar::Bool(_) => 4,
                    }),
                    Operand::Absent => w.push(5),
                }
            }
            w.push(6);
            w.push(rel(n.output.buffer));
            n.output.layout.hash(&mut w);
            n.output.dtype.hash(&mut w);
        }
        for &b in &ids.buffers {
            w.push(live(b) as u64);
        }
        Signature {
            words: w.words,
            hash: w.hash,
            buffers: ids.buffers,
        }
    }
}

/// Numbers buffers in order of first appearance. A short trace names a handful of buffers,
/// where scanning a list beats hashing into a map built afresh every flush; long traces switch
/// to the map.
#[derive(Default)]
struct Renumber {
    buffers: Vec<BufferId>,
    map: HashMap<BufferId, u64>,
}

impl Renumber {
    const SCAN: usize = 32;

    fn number(&mut self, b: BufferId) -> u64 {
        if self.buffers.len() <= Self::SCAN {
            if let Some(i) = self.buffers.iter().position(|&x| x == b) {
                return i as u64;
            }
        } else if let Some(&i) = self.map.get(&b) {
            return i;
        }
        let i = self.buffers.len() as u64;
        self.buffers.push(b);
        if self.buffers.len() > Self::SCAN {
            if self.map.is_empty() {
                self.map
                    .extend(self.buffers.iter().enumerate().map(|(k, &x)| (x, k as u64)));
            } else {
                self.map.insert(b, i);
            }
        }
        i
    }
}

/// A plan with buffer ids replaced by their order of first appearance.
struct Template {
    words: Vec<u64>,
    steps: Vec<Step>,
    origins: Vec<StepOrigin>,
    cuts: [u64; CutReason::COUNT],
    dead_nodes: usize,
    unmaterialized: usize,
    cut_log: Vec<(usize, CutReason)>,
}

impl Template {
    fn new(p: &Plan, sig: Signature) -> Template {
        let rel: HashMap<BufferId, u64> = sig
            .buffers
            .iter()
            .enumerate()
            .map(|(i, &b)| (b, i as u64))
            .collect();
        let mut steps = p.steps.clone();
        for s in &mut steps {
            for t in &mut s.binding.operands {
                t.buffer = rel[&t.buffer];
            }
        }
        Template {
            words: sig.words,
            steps,
            origins: p.origins.clone(),
            cuts: p.cuts,
            dead_nodes: p.dead_nodes,
            unmaterialized: p.unmaterialized,
            cut_log: p.cut_log.clone(),
        }
    }

    /// The plan for `nodes`, whose structure equals the template's.
    fn instantiate(&self, nodes: &[Node], buffers: &[BufferId]) -> Plan {
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
            }
        }
        Plan {
            steps,
            cuts: self.cuts,
            dead_nodes: self.dead_nodes,
            unmaterialized: self.unmaterialized,
            cut_log: self.cut_log.clone(),
            // Only a fresh plan needs them (to become a template); the template keeps its own.
            origins: Vec::new(),
        }
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
        let sig = Signature::of(nodes, live);
        if let Some(t) = self
            .map
            .get(&sig.hash)
            .and_then(|v| v.iter().find(|t| t.words == sig.words))
        {
            return (t.instantiate(nodes, &sig.buffers), true);
        }
        let p = plan(nodes, live, opts);
        let covered: usize = p
            .origins
            .iter()
            .map(|o| match o {
                StepOrigin::Fused(_) => 1,
                StepOrigin::Lowered { steps, .. } => *steps,
                StepOrigin::MatmulEpilogue { prefix, .. } => prefix + 1,
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
        self.map
            .entry(sig.hash)
            .or_default()
            .push(Template::new(&p, sig));
        (p, false)
    }
}

impl Default for PlanCache {
    /// 64 structures: a training step's flushes, with room to spare.
    fn default() -> Self {
        PlanCache::new(64)
    }
}
