//! The order the loop planner visits a flush's nodes in: program order, except that an
//! elementwise node moves up to just after the nearest earlier elementwise node of its shape
//! when no node in between depends on it or it on them.
//!
//! The planner cuts a loop region wherever the shape changes. An optimizer's foreach ops arrive
//! op-major (every parameter's `lerp_`, then every parameter's `mul_`, ...), so with parameters
//! of different shapes every op of the step was its own region: a pass over each parameter's
//! state per op. Moved together, each parameter's chain is one loop. Only independent nodes
//! change places, so every buffer sees its reads and writes in program order and the values
//! are the same bits.
//!
//! Moving up alone still leaves several parameters *of one shape* op-major: each op's node
//! lands after the previous parameter's node of that op, so the run reads `op1(p1) op1(p2)
//! op2(p1) op2(p2) ...`. One loop over such a run loads every parameter's state at once and is
//! cut at [`MAX_LOADED_BUFFERS`](super::MAX_LOADED_BUFFERS), and a value one op hands the next
//! (AdamW's `sqrt(v)`, SGD's decayed gradient) then crosses the cut through memory. So each run
//! of same-shape elementwise nodes is then reordered chain by chain ([`by_chain`]): the nodes
//! that share a buffer one of them writes stay together in their order, one chain after
//! another. resnet18's three `[512, 512, 3, 3]` SGD updates were three loops storing and
//! reloading the decayed gradients and momenta between them; chain by chain they are two
//! loops, and only the third weight's decayed gradient crosses between them.

use crate::trace::Node;
use crate::BufferId;
use smallvec::SmallVec;
/// Std maps with a fast hasher: keys are our own buffer ids.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
type HashSet<K> = std::collections::HashSet<K, ahash::RandomState>;

/// How far back (in nodes already placed) a node looks for its shape. A foreach op's node for
/// one parameter is about a node per parameter (or two) after the previous op's, so this
/// reaches the chain's head for models of up to ~500 parameters. It bounds a plan miss's cost:
/// GPT-2's 1,350-node step planned in 2.4-2.8 ms with 256 and 2.7-9 ms (noisy) with 1024; a
/// plan hit does not look at it.
const WINDOW: usize = 1024;

/// The buffers one node reads and the one it writes.
struct Access {
    reads: SmallVec<[BufferId; 4]>,
    write: BufferId,
}

impl Access {
    fn of(n: &Node) -> Access {
        Access {
            reads: n.reads().collect(),
            write: n.output.buffer,
        }
    }

    /// Whether the two nodes must keep their order: one reads what the other writes, or both
    /// write one buffer.
    fn conflicts(&self, other: &Access) -> bool {
        self.write == other.write
            || self.reads.contains(&other.write)
            || other.reads.contains(&self.write)
    }
}

/// The indices of the nodes with `needed[i]` set, in the order the planner visits them.
pub(super) fn visit_order(nodes: &[Node], needed: &[bool]) -> Vec<usize> {
    let access: Vec<Access> = nodes.iter().map(Access::of).collect();
    let mut order: Vec<usize> = Vec::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate().filter(|(i, _)| needed[*i]) {
        let at = if n.op.is_elementwise() {
            place(nodes, &access, &order, i)
        } else {
            None
        };
        match at {
            Some(k) => order.insert(k, i),
            None => order.push(i),
        }
    }
    for_each_same_shape_run(nodes, &mut order, |run| by_chain(&access, run));
    order
}

/// Calls `f` on each maximal run of consecutive elementwise nodes of one shape in `order`.
fn for_each_same_shape_run(nodes: &[Node], order: &mut [usize], mut f: impl FnMut(&mut [usize])) {
    let mut start = 0;
    while start < order.len() {
        let first = &nodes[order[start]];
        let len = match first.op.is_elementwise() {
            true => order[start..]
                .iter()
                .take_while(|&&k| {
                    let n = &nodes[k];
                    n.op.is_elementwise() && n.output.layout.sizes == first.output.layout.sizes
                })
                .count(),
            false => 1,
        };
        f(&mut order[start..start + len]);
        start += len;
    }
}

/// Reorders `run` (consecutive elementwise nodes of one shape) chain by chain: nodes that
/// touch a buffer some node of the run writes are one chain; chains go in the order of their
/// first node, each keeping its nodes' order. Two nodes of different chains share no written
/// buffer, so neither reads or writes what the other writes: they may trade places, and the
/// first node stays first (a matmul's epilogue starts with it).
fn by_chain(access: &[Access], run: &mut [usize]) {
    if run.len() < 3 {
        return;
    }
    let written: HashSet<BufferId> = run.iter().map(|&i| access[i].write).collect();
    // Union-find over positions in the run, joined through the written buffers they touch.
    let mut parent: Vec<usize> = (0..run.len()).collect();
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    let mut first_toucher: HashMap<BufferId, usize> = HashMap::default();
    for (pos, &i) in run.iter().enumerate() {
        let a = &access[i];
        for b in a.reads.iter().chain([&a.write]) {
            if !written.contains(b) {
                continue;
            }
            let other = *first_toucher.entry(*b).or_insert(pos);
            let (x, y) = (root(&mut parent, pos), root(&mut parent, other));
            // The earlier position is the root, so a chain's root is its first node.
            parent[x.max(y)] = x.min(y);
        }
    }
    let chain: Vec<usize> = (0..run.len()).map(|p| root(&mut parent, p)).collect();
    let mut placed: Vec<(usize, usize)> = run
        .iter()
        .enumerate()
        .map(|(p, &i)| (chain[p], i))
        .collect();
    // Stable: within a chain the nodes keep their order.
    placed.sort_by_key(|&(c, _)| c);
    for (slot, (_, i)) in run.iter_mut().zip(placed) {
        *slot = i;
    }
}

/// Where in `order` node `i` goes: just after the nearest placed elementwise node of its
/// shape, when every node placed after that one is independent of it; `None` for the end.
fn place(nodes: &[Node], access: &[Access], order: &[usize], i: usize) -> Option<usize> {
    let sizes = &nodes[i].output.layout.sizes;
    for (back, &m) in order.iter().rev().enumerate().take(WINDOW) {
        let other = &nodes[m];
        if other.op.is_elementwise() && other.output.layout.sizes == *sizes {
            // Already just after it: nothing to move.
            return (back > 0).then_some(order.len() - back);
        }
        if access[i].conflicts(&access[m]) {
            return None;
        }
    }
    None
}
