//! Lowering reuse for ops run one at a time (strict and debug mode): the second time a node of
//! the same structure runs, its lowered steps come back re-bound to the new node's buffers and
//! scalar values, together with whatever the caller kept with them (the runtime keeps the
//! steps' compiled programs), so neither lowering nor the program lookup runs again.
//!
//! The key is the node's structural key ([`TraceKey`] of a one-node trace: op and attributes,
//! dtypes, layouts, which operands share a buffer, scalar kinds) plus [`lowering_word`], the
//! scalar facts a lowering depends on. Keys are compared word for word on a hit, so a hash
//! collision can never hand back another node's steps. The cache is bounded: a few ways per set
//! of a fixed number of sets, the least recently used way replaced.

use crate::key::{hash_words, TraceKey};
use crate::lower::{lower_node_rebindable, lowering_word, ScalarSlot};
use crate::region::Step;
use crate::trace::{BufferId, Node};

/// Entries per set: a few structures whose hashes share a set all stay.
const WAYS: usize = 4;

/// A node's lowering with buffer ids replaced by their numbers in the node's key.
struct Template {
    words: Vec<u64>,
    /// [`lowering_word`] of the node.
    facts: u64,
    steps: Vec<Step>,
    slots: Vec<Vec<ScalarSlot>>,
}

impl Template {
    /// `steps` (lowered from the node `key` holds) with every operand's buffer numbered.
    fn new(key: &TraceKey, facts: u64, steps: &[Step], slots: Vec<Vec<ScalarSlot>>) -> Template {
        let mut steps = steps.to_vec();
        for t in steps.iter_mut().flat_map(|s| &mut s.binding.operands) {
            t.buffer = key
                .number_of(t.buffer)
                .expect("a lowered step's operands are the node's tensors")
                as BufferId;
        }
        Template {
            words: key.words().to_vec(),
            facts,
            steps,
            slots,
        }
    }

    /// The steps for `node`, whose key (`buffers` by number) equals the template's.
    fn instantiate(&self, node: &Node, buffers: &[BufferId]) -> Vec<Step> {
        let mut steps = self.steps.clone();
        for (s, slots) in steps.iter_mut().zip(&self.slots) {
            for t in &mut s.binding.operands {
                t.buffer = buffers[t.buffer as usize];
            }
            debug_assert_eq!(s.binding.scalars.len(), slots.len());
            for (bits, slot) in s.binding.scalars.iter_mut().zip(slots) {
                *bits = slot.bits(node);
            }
        }
        steps
    }
}

struct Entry<P> {
    hash: u64,
    last_use: u64,
    template: Template,
    payload: P,
}

/// What [`NodeCache::lower`] found.
pub enum Lookup<'a, P> {
    /// A node of the same structure ran before: its steps, re-bound, and what was kept with
    /// them.
    Hit {
        /// The node's steps, as [`crate::lower::lower_node`] at index 0 would make them.
        steps: Vec<Step>,
        /// What [`NodeCache::insert`] kept with the steps.
        payload: &'a P,
    },
    /// The node was lowered now; [`NodeCache::insert`] keeps the lowering for the next node
    /// of its structure.
    Miss {
        /// The node's steps, from [`crate::lower::lower_node`] at index 0.
        steps: Vec<Step>,
        /// The lowering to keep.
        miss: Miss,
    },
}

/// A node's lowering not yet in the cache: kept by [`NodeCache::insert`] once the caller has
/// what it keeps with it (a step whose program failed to compile is not kept, so the next
/// node of its structure fails the same way).
pub struct Miss {
    hash: u64,
    template: Template,
}

/// Lowerings of recently run node structures, each with a payload `P` (bounded).
pub struct NodeCache<P> {
    /// `sets * WAYS` entries, set by set; empty until the first insert, so a stream that never
    /// runs an op alone costs nothing.
    entries: Vec<Option<Entry<P>>>,
    sets: usize,
    tick: u64,
    /// The key of the node looked up last (kept to reuse its allocations).
    key: TraceKey,
}

impl<P> NodeCache<P> {
    /// A cache of at most `capacity` lowerings (rounded up to a power of two, at least
    /// [`WAYS`]).
    pub fn new(capacity: usize) -> NodeCache<P> {
        NodeCache {
            entries: Vec::new(),
            sets: capacity.div_ceil(WAYS).max(1).next_power_of_two(),
            tick: 0,
            key: TraceKey::default(),
        }
    }

    /// The steps of `node` (lowered at index 0): re-bound from an earlier node of the same
    /// structure, or lowered now.
    pub fn lower(&mut self, node: &Node) -> Lookup<'_, P> {
        self.key.clear();
        self.key.push(node);
        let facts = lowering_word(node);
        let hash = hash_words(self.key.words()) ^ facts;
        if let Some(i) = self.find(hash, facts) {
            self.tick += 1;
            let e = self.entries[i].as_mut().expect("found entries are full");
            e.last_use = self.tick;
            let steps = e.template.instantiate(node, self.key.buffers());
            return Lookup::Hit {
                steps,
                payload: &e.payload,
            };
        }
        let lowered = lower_node_rebindable(node, 0);
        let template = Template::new(&self.key, facts, &lowered.steps, lowered.slots);
        Lookup::Miss {
            steps: lowered.steps,
            miss: Miss { hash, template },
        }
    }

    /// Keeps `miss` with `payload`, replacing the least recently used lowering of its set when
    /// the set is full (or the same structure, inserted meanwhile).
    pub fn insert(&mut self, miss: Miss, payload: P) {
        if self.entries.is_empty() {
            self.entries = (0..self.sets * WAYS).map(|_| None).collect();
        }
        let set = self.set(miss.hash);
        let t = &miss.template;
        let same = |e: &Entry<P>| {
            e.hash == miss.hash && e.template.facts == t.facts && e.template.words == t.words
        };
        let slot = set
            .clone()
            .find(|&i| self.entries[i].as_ref().is_none_or(same))
            .or_else(|| set.min_by_key(|&i| self.entries[i].as_ref().map_or(0, |e| e.last_use)))
            .expect("a set has ways");
        self.tick += 1;
        self.entries[slot] = Some(Entry {
            hash: miss.hash,
            last_use: self.tick,
            template: miss.template,
            payload,
        });
    }

    /// The entries of the set `hash` falls in.
    fn set(&self, hash: u64) -> std::ops::Range<usize> {
        let first = (hash as usize & (self.sets - 1)) * WAYS;
        first..first + WAYS
    }

    /// The entry holding the structure now in `self.key` (with `facts`), if any.
    fn find(&self, hash: u64, facts: u64) -> Option<usize> {
        if self.entries.is_empty() {
            return None;
        }
        let words = self.key.words();
        self.set(hash).find(|&i| {
            self.entries[i].as_ref().is_some_and(|e| {
                e.hash == hash && e.template.facts == facts && e.template.words == words
            })
        })
    }
}

impl<P> Default for NodeCache<P> {
    /// 1024 structures: a model's distinct op shapes, with room to spare.
    fn default() -> Self {
        NodeCache::new(1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, DType, Layout, Op, Scalar};
    use crate::lower::lower_node;
    use crate::trace::{Operand, TensorRef};
    use smallvec::smallvec;

    fn t(buffer: BufferId, sizes: &[usize]) -> TensorRef {
        TensorRef {
            buffer,
            layout: Layout::contiguous(sizes),
            dtype: DType::F32,
        }
    }

    /// `out = x * s`
    fn mul(x: TensorRef, s: f64, out: BufferId) -> Node {
        let sizes = x.layout.sizes.clone();
        Node {
            op: Op::Binary(BinaryOp::Mul),
            inputs: smallvec![Operand::Tensor(x), Operand::Scalar(Scalar::Float(s))],
            output: t(out, &sizes),
            compute: DType::F32,
        }
    }

    /// `out = beta * c + a @ b` on 2x2 matrices.
    fn addmm(beta: f64) -> Node {
        let m = |b| Operand::Tensor(t(b, &[2, 2]));
        Node {
            op: Op::Addmm,
            inputs: smallvec![
                m(1),
                m(2),
                m(3),
                Operand::Scalar(Scalar::Float(beta)),
                Operand::Scalar(Scalar::Float(1.0)),
            ],
            output: t(4, &[2, 2]),
            compute: DType::F32,
        }
    }

    /// Looks `node` up, keeping a miss with payload `tag`; returns the steps and the payload
    /// of a hit.
    fn run(c: &mut NodeCache<u32>, node: &Node, tag: u32) -> (Vec<Step>, Option<u32>) {
        match c.lower(node) {
            Lookup::Hit { steps, payload } => (steps, Some(*payload)),
            Lookup::Miss { steps, miss } => {
                c.insert(miss, tag);
                (steps, None)
            }
        }
    }

    #[test]
    fn a_node_of_a_structure_seen_before_gets_its_lowering_rebound_to_its_buffers_and_scalars() {
        let mut c = NodeCache::default();
        let first = mul(t(1, &[8]), 2.0, 2);
        assert_eq!(run(&mut c, &first, 7), (lower_node(&first, 0), None));
        let second = mul(t(5, &[8]), -0.5, 9);
        let (steps, payload) = run(&mut c, &second, 8);
        assert_eq!(payload, Some(7), "the first node's payload");
        assert_eq!(steps, lower_node(&second, 0), "its own buffers and scalar");
    }

    #[test]
    fn other_shapes_dtypes_layouts_or_buffer_sharing_do_not_share_a_lowering() {
        let mut c = NodeCache::default();
        let base = mul(t(1, &[4, 4]), 2.0, 2);
        let mut transposed = base.clone();
        let Operand::Tensor(x) = &mut transposed.inputs[0] else {
            unreachable!()
        };
        x.layout = x.layout.permute(&[1, 0]);
        let mut f64_node = base.clone();
        f64_node.compute = DType::F64;
        let mut in_place = base.clone();
        in_place.output.buffer = 1;
        let others = [mul(t(1, &[16]), 2.0, 2), transposed, f64_node, in_place];
        run(&mut c, &base, 0);
        for (i, n) in others.iter().enumerate() {
            assert_eq!(run(&mut c, n, i as u32 + 1).1, None, "node {i} is new");
        }
        for (i, n) in others.iter().enumerate() {
            let (steps, payload) = run(&mut c, n, 99);
            assert_eq!(payload, Some(i as u32 + 1));
            assert_eq!(steps, lower_node(n, 0));
        }
    }

    #[test]
    fn an_addmm_whose_beta_is_zero_does_not_take_the_lowering_of_one_whose_beta_is_not() {
        let mut c = NodeCache::default();
        run(&mut c, &addmm(0.5), 1);
        let (steps, payload) = run(&mut c, &addmm(0.0), 2);
        assert_eq!(
            payload, None,
            "beta 0 drops the bias copy: another lowering"
        );
        assert_eq!(steps.len(), 1);
        let (steps, payload) = run(&mut c, &addmm(2.0), 3);
        assert_eq!(payload, Some(1));
        assert_eq!(steps, lower_node(&addmm(2.0), 0), "beta 2 re-bound");
        assert_eq!(run(&mut c, &addmm(-0.0), 4).1, Some(2));
    }

    #[test]
    fn a_full_set_drops_its_least_recently_used_lowering() {
        let mut c = NodeCache::new(WAYS);
        let nodes: Vec<Node> = (1..=WAYS + 1).map(|n| mul(t(1, &[n]), 1.0, 2)).collect();
        for (i, n) in nodes[..WAYS].iter().enumerate() {
            run(&mut c, n, i as u32);
        }
        // Node 0 is used again: node 1 is now the least recently used.
        assert_eq!(run(&mut c, &nodes[0], 99).1, Some(0));
        run(&mut c, &nodes[WAYS], 50);
        assert_eq!(run(&mut c, &nodes[1], 1).1, None, "dropped");
        assert_eq!(run(&mut c, &nodes[0], 99).1, Some(0), "kept");
        assert_eq!(c.entries.len(), WAYS, "one set of WAYS entries");
    }
}
