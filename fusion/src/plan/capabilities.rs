//! What a backend can take in one region: the seam between the planner and the backends.
//!
//! The planner cuts a flush by these, not by naming a backend. A backend that compiles loops
//! itself (the CPU JIT) takes loop regions: one iteration shape each, a reduction as a row
//! kernel, a matmul with an elementwise epilogue; the planner's fusion rules decide the cuts. A
//! backend whose own compiler fuses whole programs (XLA through PJRT) takes everything between
//! two sync points as one region, matmuls, reductions, views, shape changes and in-place
//! writes included, bounded in size; only the ops it cannot lower cut.

use crate::ir::Op;

/// What one region may hold on a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend's compiler fuses across iteration shapes, matmuls and reductions itself:
    /// the planner hands it whole flushes ([`crate::region::Region::Graph`]) instead of cutting
    /// loop regions. False: the planner builds loop regions by its own rules.
    pub fuses_whole_programs: bool,
    /// Most ops one whole-program region holds (bounds compile time and module size); a longer
    /// flush is cut (counted as `max_ops`). Loop regions keep
    /// [`super::PlanOptions::max_ops_per_region`].
    pub max_region_ops: usize,
    /// Whether a whole-program region may hold kernel ops (gather, scatter, scans, sort,
    /// random numbers); without it each runs as its own step and cuts (counted as
    /// `unfusable`).
    pub kernel_ops_in_region: bool,
}

impl Capabilities {
    /// A backend that compiles loop regions (the CPU JIT): the planner's own fusion rules.
    pub const LOOPS: Capabilities = Capabilities {
        fuses_whole_programs: false,
        max_region_ops: usize::MAX,
        kernel_ops_in_region: false,
    };

    /// A backend whose compiler fuses whole programs, with regions of at most `max_ops` ops.
    pub fn whole_programs(max_ops: usize) -> Capabilities {
        Capabilities {
            fuses_whole_programs: true,
            max_region_ops: max_ops.max(1),
            kernel_ops_in_region: false,
        }
    }

    /// Whether `op` may sit inside a whole-program region.
    pub fn takes(&self, op: &Op) -> bool {
        match op {
            Op::Kernel(_) => self.kernel_ops_in_region,
            // The runtime records cat as copies into slices; it never reaches a plan.
            Op::Cat { .. } => false,
            _ => true,
        }
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities::LOOPS
    }
}
