//! The structural key of a trace: what the planner looks at, as exact 64-bit words. Ops and
//! attributes, dtypes, layouts, which operands name the same buffer (buffers numbered in order
//! of first appearance), which buffers are live, and scalar kinds (not values).
//!
//! A stream builds its key node by node as it records ([`TraceKey::push`]), so a flush whose
//! plan is cached only adds the liveness words and hashes them instead of walking every node
//! again (that walk was about half of a cache-hit flush). The numbering doubles as the
//! stream's index of its pending buffers.

use crate::ir::{DType, Layout, Op, Scalar};
use crate::trace::{BufferId, Node, Operand};
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
    /// times the cost). A dense row-major layout (offset 0, the strides `Layout::contiguous`
    /// gives), which most are, sets [`DENSE`] in the kind and leaves out its strides and
    /// offset: they follow from the sizes. A header whose fields do not fit is written field by
    /// field after a word with kind `0xFF`, which no packed header has: the words still decode
    /// one way.
    #[inline(always)]
    fn tensor(&mut self, kind: u64, number: u64, l: &Layout, dtype: DType) {
        let (sizes, strides) = (l.sizes.as_slice(), l.strides.as_slice());
        let rank = sizes.len() as u64;
        if number < 1 << 32 && rank < 1 << 16 && strides.len() == sizes.len() {
            let dense = l.offset == 0 && row_major(sizes, strides);
            let kind = if dense { kind | DENSE } else { kind };
            self.push(number | kind << 32 | (dtype as u64) << 40 | rank << 48);
            // Plain pushes over the slices: `extend` with a mapped SmallVec iterator cost ~4
            // times as much for the short dims of a typical tensor.
            for &s in sizes {
                self.push(s as u64);
            }
            if dense {
                return;
            }
        } else {
            self.push(0xFF << 32 | kind);
            self.push(number);
            self.push(dtype as u64);
            self.push(rank);
            self.push(strides.len() as u64);
            for &s in sizes {
                self.push(s as u64);
            }
        }
        for &s in strides {
            self.push(s as u64);
        }
        self.push(l.offset as u64);
    }
}

/// Marks an op written as one word by [`Words::op`]; the derived `Hash` of the other ops starts
/// with the variant's index, a small number, so the two forms never read alike.
const OP_WORD: u64 = 0x0F << 56;

impl Words<'_> {
    /// The op as words: the common ones (no attributes, or one small enum) as one word, the
    /// others through their derived `Hash` (an out-of-line call per field, ~30 instructions
    /// more per recorded op).
    #[inline(always)]
    fn op(&mut self, op: &Op) {
        let (variant, field) = match op {
            Op::Unary(u) => (1, *u as u64),
            Op::Binary(b) => (2, *b as u64),
            Op::Where => (3, 0),
            Op::Clamp => (4, 0),
            Op::Cast(d) => (5, *d as u64),
            Op::Copy => (6, 0),
            Op::Matmul => (7, 0),
            Op::Addmm => (8, 0),
            _ => return op.hash(self),
        };
        self.push(OP_WORD | variant << 32 | field);
    }
}

/// Set in a packed tensor header's kind: the layout is dense row-major, its strides and
/// offset are not written.
const DENSE: u64 = 0x80;

/// Whether `strides` are exactly the row-major strides of `sizes` (as `Layout::contiguous`
/// makes them: a size-1 dim's stride too), so the sizes alone say what they are.
#[inline(always)]
fn row_major(sizes: &[usize], strides: &[isize]) -> bool {
    let mut acc = 1isize;
    for (&s, &st) in sizes.iter().zip(strides).rev() {
        if st != acc {
            return false;
        }
        acc = acc.wrapping_mul(s.max(1) as isize);
    }
    true
}

/// Words of a long key that [`hash_words`] reads: this many from each end.
const HASHED_END: usize = 64;

/// FxHash-style mixing of `words` in four independent lanes (one serial chain spent ~5 cycles
/// of latency per word); collisions are caught by the word comparison on a hit. A long key is
/// hashed by its length and both ends only (where its liveness words and its latest ops are):
/// keys that differ only in the middle share a bucket and are told apart by that comparison,
/// and hashing every word was ~4 instructions per word of a flush that reuses its plan.
pub(crate) fn hash_words(words: &[u64]) -> u64 {
    if words.len() > 2 * HASHED_END {
        let (head, tail) = (&words[..HASHED_END], &words[words.len() - HASHED_END..]);
        return hash_all(head) ^ hash_all(tail).rotate_left(17) ^ words.len() as u64;
    }
    hash_all(words)
}

fn hash_all(words: &[u64]) -> u64 {
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

/// A trace's key, built node by node, and its buffers in order of first appearance.
#[derive(Default)]
pub struct TraceKey {
    words: Vec<u64>,
    ids: Renumber,
    /// Whether the liveness words were added ([`TraceKey::finish`]): no node may follow.
    finished: bool,
}

impl TraceKey {
    /// Adds `n`'s words, numbering its buffers: those it names first are appended to
    /// [`TraceKey::buffers`]. Returns the number of its output buffer.
    #[inline]
    pub fn push(&mut self, n: &Node) -> usize {
        debug_assert!(!self.finished, "a node after the liveness words");
        let ids = &mut self.ids;
        let mut w = Words {
            words: &mut self.words,
        };
        w.push(0xA11 << 32 | n.compute as u64);
        w.op(&n.op);
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
        let k = ids.number(out.buffer);
        w.tensor(6, k, &out.layout, out.dtype);
        k as usize
    }

    /// Completes the key with each buffer's liveness (`live` is asked by number); returns its
    /// hash.
    pub fn finish(&mut self, live: impl Fn(usize) -> bool) -> u64 {
        debug_assert!(!self.finished, "finished twice");
        self.finished = true;
        let n = self.ids.buffers.len();
        self.words.extend((0..n).map(|i| live(i) as u64));
        hash_words(&self.words)
    }

    /// The number of buffer `id`, if a pushed node names it.
    #[inline]
    pub fn number_of(&self, id: BufferId) -> Option<usize> {
        self.ids.find(id)
    }

    /// The buffers pushed nodes name, in order of first appearance (by number).
    pub fn buffers(&self) -> &[BufferId] {
        &self.ids.buffers
    }

    /// The key's words (with the liveness words once finished).
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Forgets every node, keeping the allocations for the next trace.
    pub fn clear(&mut self) {
        self.words.clear();
        self.ids.clear();
        self.finished = false;
    }

    /// The key of a whole trace at once.
    pub fn of(nodes: &[Node], live: &dyn Fn(BufferId) -> bool) -> (TraceKey, u64) {
        let mut k = TraceKey::default();
        k.words.reserve(nodes.len() * 16);
        for n in nodes {
            k.push(n);
        }
        let ids = k.ids.buffers.clone();
        let h = k.finish(|i| live(ids[i]));
        (k, h)
    }
}

/// Numbers buffers in order of first appearance, through an open-addressing table that is
/// kept from trace to trace (cleared, not rebuilt): a map built afresh every flush spent more
/// on growing than on lookups.
#[derive(Default)]
struct Renumber {
    buffers: Vec<BufferId>,
    /// (buffer, its number); `EMPTY` keys are free. Length is a power of two, at most half full.
    slots: Vec<(BufferId, u32)>,
    /// The slots taken, so that a clear after few buffers frees those only: a strict op's
    /// one-node key (two or three buffers) filled the whole 64-slot table per op (the key's
    /// clear: ~170 instructions a strict op under callgrind, ~40 this way).
    taken: Vec<u32>,
}

impl Renumber {
    /// A free slot's key. A buffer with this id (never made: ids count up from 1) would still
    /// be numbered correctly, by a scan.
    const EMPTY: BufferId = BufferId::MAX;

    /// Forgets every buffer, keeping the table's size (the next trace is likely as long).
    fn clear(&mut self) {
        if !self.buffers.is_empty() {
            self.buffers.clear();
            if self.taken.len() * 8 < self.slots.len() {
                for &i in &self.taken {
                    self.slots[i as usize] = (Self::EMPTY, 0);
                }
            } else {
                self.slots.fill((Self::EMPTY, 0));
            }
            self.taken.clear();
        }
    }

    #[inline]
    fn home(&self, b: BufferId) -> usize {
        (b.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & (self.slots.len() - 1)
    }

    /// `b`'s number (a new one, appended to `buffers`, the first time).
    /// Inlined: every recorded op numbers two or three buffers.
    #[inline(always)]
    fn number(&mut self, b: BufferId) -> u64 {
        if b == Self::EMPTY || self.slots.is_empty() {
            return self.number_slowly(b);
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
                self.taken.push(i as u32);
                if self.buffers.len() * 2 > self.slots.len() {
                    self.grow();
                }
                return n as u64;
            }
            i = (i + 1) & mask;
        }
    }

    /// `b`'s number without numbering it.
    #[inline(always)]
    fn find(&self, b: BufferId) -> Option<usize> {
        if b == Self::EMPTY || self.slots.is_empty() {
            return self.buffers.iter().position(|&x| x == b);
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(b);
        loop {
            let (k, v) = self.slots[i];
            if k == b {
                return Some(v as usize);
            }
            if k == Self::EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Numbering before the table exists (it is made here), or of the `EMPTY` id, which the
    /// table cannot hold.
    #[cold]
    fn number_slowly(&mut self, b: BufferId) -> u64 {
        if self.slots.is_empty() {
            self.slots = vec![(Self::EMPTY, 0); 64];
            if b != Self::EMPTY {
                return self.number(b);
            }
        }
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
        self.taken.clear();
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
            self.taken.push(i as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, Op};
    use crate::trace::TensorRef;
    use smallvec::smallvec;

    fn t(buffer: BufferId) -> Operand {
        Operand::Tensor(out(buffer))
    }

    fn out(buffer: BufferId) -> TensorRef {
        TensorRef {
            buffer,
            layout: Layout::contiguous(&[4]),
            dtype: DType::F32,
        }
    }

    /// `c = a + b`
    fn add(a: Operand, b: Operand, c: BufferId) -> Node {
        Node {
            op: Op::Binary(BinaryOp::Add),
            inputs: smallvec![a, b],
            output: out(c),
            compute: DType::F32,
        }
    }

    fn key(nodes: &[Node]) -> Vec<u64> {
        TraceKey::of(nodes, &|_| false).0.words().to_vec()
    }

    #[test]
    fn the_same_structure_on_other_buffers_and_scalar_values_has_the_same_key() {
        let a = [add(t(1), Operand::Scalar(Scalar::Float(1.0)), 2)];
        let b = [add(t(7), Operand::Scalar(Scalar::Float(3.0)), 9)];
        assert_eq!(key(&a), key(&b));
    }

    #[test]
    fn every_op_has_its_own_key() {
        use crate::ir::{ReduceOp, UnaryOp};
        let ops = [
            Op::Unary(UnaryOp::Neg),
            Op::Unary(UnaryOp::Abs),
            Op::Binary(BinaryOp::Add),
            Op::Binary(BinaryOp::Sub),
            Op::Where,
            Op::Clamp,
            Op::Cast(DType::F32),
            Op::Cast(DType::I32),
            Op::Copy,
            Op::Matmul,
            Op::Addmm,
            Op::Cat { dim: 0 },
            Op::Cat { dim: 1 },
            Op::Arange { dtype: DType::F32 },
            Op::Reduce {
                op: ReduceOp::Sum,
                dims: smallvec![0],
                keepdim: false,
            },
        ];
        let ops: Vec<Op> = ops.into_iter().chain(kernel_ops()).collect();
        let keys: Vec<Vec<u64>> = ops
            .iter()
            .map(|op| {
                let mut n = add(t(1), t(3), 2);
                n.op = op.clone();
                key(&[n])
            })
            .collect();
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    /// Kernel ops that differ in one attribute each.
    fn kernel_ops() -> Vec<Op> {
        use crate::ir::{KernelOp as K, RandomDist, ScanOp, ScatterReduce};
        let scatter = |dim, reduce, include_self| K::Scatter {
            dim,
            reduce,
            include_self,
            wide: false,
        };
        let random = |dist, sizes: &[usize], dtype| K::Random {
            dist,
            sizes: sizes.into(),
            dtype,
        };
        [
            K::Gather { dim: 0 },
            K::Gather { dim: 1 },
            scatter(0, ScatterReduce::Sum, true),
            scatter(1, ScatterReduce::Sum, true),
            scatter(0, ScatterReduce::Mean, true),
            scatter(0, ScatterReduce::Sum, false),
            K::Scatter {
                dim: 0,
                reduce: ScatterReduce::Sum,
                include_self: true,
                wide: true,
            },
            K::Scan {
                op: ScanOp::Sum,
                dim: 0,
                dtype: None,
            },
            K::Scan {
                op: ScanOp::Prod,
                dim: 0,
                dtype: None,
            },
            K::Scan {
                op: ScanOp::Sum,
                dim: 1,
                dtype: None,
            },
            K::Scan {
                op: ScanOp::Sum,
                dim: 0,
                dtype: Some(DType::F32),
            },
            K::Sort {
                dim: 0,
                descending: false,
                limit: None,
            },
            K::Sort {
                dim: 0,
                descending: true,
                limit: None,
            },
            K::Sort {
                dim: 1,
                descending: false,
                limit: None,
            },
            K::Sort {
                dim: 1,
                descending: false,
                limit: Some(3),
            },
            random(RandomDist::Uniform, &[4], DType::F32),
            random(RandomDist::Normal, &[4], DType::F32),
            random(RandomDist::Uniform, &[2, 2], DType::F32),
            random(RandomDist::Uniform, &[4], DType::F64),
        ]
        .into_iter()
        .map(Op::Kernel)
        .collect()
    }

    #[test]
    fn reading_one_buffer_twice_is_not_reading_two() {
        assert_ne!(key(&[add(t(1), t(1), 2)]), key(&[add(t(1), t(3), 2)]));
    }

    #[test]
    fn a_dense_layout_and_a_strided_one_of_the_same_sizes_differ() {
        let dense = [add(t(1), t(3), 2)];
        let mut strided = dense.clone();
        strided[0].output.layout.strides[0] = 2;
        let mut offset = dense.clone();
        offset[0].output.layout.offset = 1;
        assert_ne!(key(&dense), key(&strided));
        assert_ne!(key(&dense), key(&offset));
        assert_ne!(key(&strided), key(&offset));
    }

    #[test]
    fn liveness_is_part_of_the_key() {
        let n = [add(t(1), t(3), 2)];
        let (_, dead) = TraceKey::of(&n, &|_| false);
        let (live, live_hash) = TraceKey::of(&n, &|b| b == 2);
        assert_ne!(key(&n), live.words());
        assert_ne!(dead, live_hash);
    }

    #[test]
    fn a_key_built_as_nodes_are_recorded_numbers_buffers_in_order_of_first_appearance() {
        let mut k = TraceKey::default();
        assert_eq!(k.push(&add(t(5), t(3), 4)), 2, "the output's number");
        assert_eq!(k.buffers(), [5, 3, 4]);
        assert_eq!(k.push(&add(t(4), t(5), 6)), 3);
        assert_eq!(k.buffers(), [5, 3, 4, 6]);
        assert_eq!((k.number_of(4), k.number_of(8)), (Some(2), None));
        k.clear();
        assert!(k.words().is_empty() && k.number_of(5).is_none());
    }

    #[test]
    fn a_long_key_is_hashed_by_its_length_and_both_ends() {
        let words: Vec<u64> = (0..2000).collect();
        let mut middle = words.clone();
        middle[1000] = 7;
        let mut end = words.clone();
        end[1999] = 7;
        assert_eq!(hash_words(&words), hash_words(&middle));
        assert_ne!(hash_words(&words), hash_words(&end));
        assert_ne!(hash_words(&words), hash_words(&words[..1999]));
    }

    #[test]
    fn buffers_are_numbered_in_order_of_first_appearance_across_table_growth() {
        let mut r = Renumber::default();
        let ids: Vec<BufferId> = (0..500).map(|k| 1000 + 7 * k).collect();
        for (n, &b) in ids.iter().enumerate() {
            assert_eq!(r.number(b), n as u64);
        }
        for (n, &b) in ids.iter().enumerate().rev() {
            assert_eq!(r.number(b), n as u64, "the same buffer keeps its number");
            assert_eq!(r.find(b), Some(n));
        }
        assert_eq!(r.find(5), None);
        assert_eq!(
            r.number(Renumber::EMPTY),
            500,
            "even the id the table cannot hold"
        );
        assert_eq!(r.number(Renumber::EMPTY), 500);
        assert_eq!(r.buffers.len(), 501);
    }

    #[test]
    fn a_clear_forgets_every_buffer() {
        let mut r = Renumber::default();
        r.number(5);
        r.number(9);
        r.clear();
        assert_eq!(r.find(5), None);
        assert_eq!(r.number(9), 0);
        assert_eq!(r.buffers, vec![9]);
    }

    #[test]
    fn a_clear_frees_every_slot_whether_few_buffers_or_many_took_them() {
        let mut r = Renumber::default();
        let free = |r: &Renumber| r.slots.iter().all(|&(k, _)| k == Renumber::EMPTY);
        // Many (the table grows), then few (their slots freed one by one), colliding or not.
        for ids in [(1..300).collect::<Vec<BufferId>>(), vec![3, 3 + 64, 11]] {
            for &b in &ids {
                r.number(b);
            }
            r.clear();
            assert!(free(&r), "after {} buffers", ids.len());
            assert!(r.taken.is_empty());
        }
        assert_eq!(r.number(11), 0, "numbering starts over");
    }
}
