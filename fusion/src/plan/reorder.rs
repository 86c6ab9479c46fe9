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

use crate::trace::Node;
use crate::BufferId;
use smallvec::SmallVec;

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
    order
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
