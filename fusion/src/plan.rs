//! The planner: cuts a stream's pending nodes into ordered steps.
//!
//! Today each node becomes its own step(s), in program order, which already gives every sync
//! point its right result; fusing chains into bigger loop regions plugs in here without
//! changing the runtime.

use crate::lower::lower_node;
use crate::region::Step;
use crate::trace::Node;

/// Plans `nodes` (in program order) into steps that run in order.
pub fn plan(nodes: &[Node]) -> Vec<Step> {
    nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| lower_node(n, i))
        .collect()
}
