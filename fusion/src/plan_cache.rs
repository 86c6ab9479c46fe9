//! Steady-state plan reuse: a loop that records the same op sequence every iteration gets the
//! plan of its first iteration back, re-bound to this iteration's buffers and scalars, instead
//! of being planned again.
//!
//! The key is the trace's structure, exactly what the planner looks at: ops and attributes,
//! dtypes, layouts, which operands name the same buffer (buffers renumbered in order of first
//! appearance), which buffers are live, and scalar kinds (not values). Keys are compared word
//! for word on a hit, so a hash collision can never hand back a wrong plan.

use crate::epilogue::rebind_gemm;
use crate::ir::{DType, Layout, Scalar};
use crate::lower::{lower_node, scalar_bits};
use crate::plan::{plan, CutReason, Plan, PlanOptions, StepOrigin};
use crate::region::Step;
use crate::trace::{BufferId, Node, Operand};
/// The std map with a fast hasher: a steady-state flush builds these maps every time.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
use std::hash::{Hash, Hasher};

/// Collects `Hash` output as 64-bit words: the exact key, hashed once it is complete.
struct Words<'a> {
    words: &'a mut Vec<u64>,
}

impl Words<'_> {
    #[inline]
    fn push(&mut self, w: u64) {
        self.words.push(w);
    }

    /// A tensor operand (`kind` 1) or output (`kind` 6) as words: its buffer's number, kind,
    /// dtype and rank packed in one header word, then sizes, strides and offset, written out
    /// directly (a layout's derived `Hash` goes through [`Hasher::write`] byte chunks, several
    /// times the cost). A header whose fields do not fit is written field by field after a
    /// word with kind `0xFF`, which no packed header has: the words still decode one way.
    #[inline]
    fn tensor(&mut self, kind: u64, number: u64, l: &Layout, dtype: DType) {
        let rank = l.sizes.len() as u64;
        if number < 1 << 32 && rank < 1 << 16 && l.strides.len() == l.sizes.len() {
            self.push(number | kind << 32 | (dtype as u64) << 40 | rank << 48);
        } else {
            self.push(0xFF << 32 | kind);
            self.push(number);
            self.push(dtype as u64);
            self.push(rank);
            self.push(l.strides.len() as u64);
        }
        // Plain pushes over the slices: `extend` with a mapped SmallVec iterator cost ~4 times
        // as much for the short dims of a typical tensor (its size hint, reserve and length
        // guard outweigh one or two words).
        for &s in l.sizes.as_slice() {
            self.push(s as u64);
        }
        for &s in l.strides.as_slice() {
            self.push(s as u64);
        }
        self.push(l.offset as u64);
    }
}

/// FxHash-style mixing of `words` in four independent lanes (one serial chain spent ~5 cycles
/// of latency per word); collisions are caught by the word comparison on a hit.
fn hash_words(words: &[u64]) -> u64 {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
    let mut lanes = [0u64, 1, 2, 3];
    let chunks = words.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..4 {
            lanes[k] = mix(lanes[k], c[k]);
        }
    }
    let mut h = mix(words.len() as u64, 0);
    for w in lanes.into_iter().chain(rest.iter().copied()) {
        h = mix(h, w);
    }
    h
}

impl Hasher for Words<'_> {
    fn finish(&self) -> u64 {
        0
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

/// The structural key of a trace, written into `words` (cleared first), and its hash; `ids`
/// is left holding the trace's buffers in order of first appearance.
fn signature(
    nodes: &[Node],
    live: &dyn Fn(BufferId) -> bool,
    words: &mut Vec<u64>,
    ids: &mut Renumber,
) -> u64 {
    words.clear();
    words.reserve(nodes.len() * 16);
    ids.reset(nodes.len() * 2);
    let mut w = Words { words };
    for n in nodes {
        w.push(0xA11 << 32 | n.compute as u64);
        n.op.hash(&mut w);
        for o in &n.inputs {
            match o {
                Operand::Tensor(t) => w.tensor(1, ids.number(t.buffer), &t.layout, t.dtype),
                Operand::Scalar(s) => w.push(match s {
                    Scalar::Float(_) => 2,
                    Scalar::Int(_) => 3,
                    Scalar::Bool(_) => 4,
                }),
                Operand::Absent => w.push(5),
            }
        }
        let out = &n.output;
        w.tensor(6, ids.number(out.buffer), &out.layout, out.dtype);
    }
    for &b in &ids.buffers {
        w.push(live(b) as u64);
    }
    hash_words(words)
}

/// Numbers buffers in order of first appearance, through an open-addressing table that is
/// kept from flush to flush (cleared, not rebuilt): a map built afresh every flush spent more
/// on growing than on lookups.
#[derive(Default)]
struct Renumber {
    buffers: Vec<BufferId>,
    /// (buffer, its number); `EMPTY` keys are free. Length is a power of two, at most half full.
    slots: Vec<(BufferId, u32)>,
}

impl Renumber {
    /// A free slot's key. A buffer with this id (never made: ids count up from 1) would still
    /// be numbered correctly, by a scan.
    const EMPTY: BufferId = BufferId::MAX;

    /// Forgets every buffer; sizes the table for about `expect` of them.
    fn reset(&mut self, expect: usize) {
        self.buffers.clear();
        let want = (expect * 2).next_power_of_two().max(64);
        if self.slots.len() < want || self.slots.len() > want * 8 {
            self.slots = vec![(Self::EMPTY, 0); want];
        } else {
            self.slots.fill((Self::EMPTY, 0));
        }
    }

    #[inline]
    fn home(&self, b: BufferId) -> usize {
        (b.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & (self.slots.len() - 1)
    }

    #[inline]
    fn number(&mut self, b: BufferId) -> u64 {
        if b == Self::EMPTY {
            return self.scan(b);
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(b);
        loop {
            let (k, v) = self.slots[i];
            if k == b {
                return v as u64;
            }
            if k == Self::EMPTY {
                let n = self.buffers.len();
                self.buffers.push(b);
                self.slots[i] = (b, n as u32);
                if self.buffers.len() * 2 > self.slots.len() {
                    self.grow();
                }
                return n as u64;
            }
            i = (i + 1) & mask;
        }
    }

    /// The number of the `EMPTY` id, which the table cannot hold.
    #[cold]
    fn scan(&mut self, b: BufferId) -> u64 {
        match self.buffers.iter().position(|&x| x == b) {
            Some(i) => i as u64,
            None => {
                self.buffers.push(b);
                (self.buffers.len() - 1) as u64
            }
        }
    }

    #[cold]
    fn grow(&mut self) {
        self.slots = vec![(Self::EMPTY, 0); self.slots.len() * 2];
        let mask = self.slots.len() - 1;
        for (n, &b) in self.buffers.iter().enumerate() {
            if b == Self::EMPTY {
                continue;
            }
            let mut i = self.home(b);
            while self.slots[i].0 != Self::EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = (b, n as u32);
        }
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
    fn new(p: &Plan, words: Vec<u64>, buffers: &[BufferId]) -> Template {
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
        }
        Template {
            words,
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
    /// Scratch kept across flushes: the current trace's key words and buffer numbering.
    words: Vec<u64>,
    ids: Renumber,
}

impl PlanCache {
    /// A cache of at most `capacity` plans.
    pub fn new(capacity: usize) -> PlanCache {
        PlanCache {
            map: HashMap::default(),
            len: 0,
            capacity: capacity.max(1),
            words: Vec::new(),
            ids: Renumber::default(),
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
        let hash = signature(nodes, live, &mut self.words, &mut self.ids);
        if let Some(t) = self
            .map
            .get(&hash)
            .and_then(|v| v.iter().find(|t| t.words == self.words))
        {
            return (t.instantiate(nodes, &self.ids.buffers), true);
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
        let words = self.words.clone();
        self.map
            .entry(hash)
            .or_default()
            .push(Template::new(&p, words, &self.ids.buffers));
        (p, false)
    }
}

impl Default for PlanCache {
    /// 64 structures: a training step's flushes, with room to spare.
    fn default() -> Self {
        PlanCache::new(64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_numbered_in_order_of_first_appearance_across_table_growth() {
        let mut r = Renumber::default();
        r.reset(4);
        let ids: Vec<BufferId> = (0..500).map(|k| 1000 + 7 * k).collect();
        for (n, &b) in ids.iter().enumerate() {
            assert_eq!(r.number(b), n as u64);
        }
        for (n, &b) in ids.iter().enumerate().rev() {
            assert_eq!(r.number(b), n as u64, "the same buffer keeps its number");
        }
        assert_eq!(
            r.number(Renumber::EMPTY),
            500,
            "even the id the table cannot hold"
        );
        assert_eq!(r.number(Renumber::EMPTY), 500);
        assert_eq!(r.buffers.len(), 501);
    }

    #[test]
    fn a_reset_forgets_every_buffer() {
        let mut r = Renumber::default();
        r.reset(8);
        r.number(5);
        r.number(9);
        r.reset(8);
        assert_eq!(r.number(9), 0);
        assert_eq!(r.buffers, vec![9]);
    }
}
