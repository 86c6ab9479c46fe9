//! What a backend can take in one region: the seam between the planner and the backends.
//!
//! The planner cuts a flush by these, not by naming a backend. A backend that compiles loops
//! itself (the CPU JIT) takes loop regions: one iteration shape each, a reduction as a row
//! kernel, a matmul with an elementwise epilogue; the planner's fusion rules decide the cuts. A
//! backend whose own compiler fuses whole programs (XLA through PJRT) takes everything between
//! two sync points as one region, matmuls, reductions, views, shape changes and in-place
//! writes included, bounded in size; only the ops it cannot lower cut.

use crate::ir::{DType, KernelOp, Op, ScatterReduce};

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
    /// The kernel ops a whole-program region may hold (the backend lowers them into the
    /// program, bounds checks included); every other kernel op runs as its own step and cuts
    /// (counted as `unfusable`).
    pub kernels_in_region: KernelsInRegion,
    /// A flush run for a host read waits only for the steps up to the read value's writer
    /// (a whole program then ends at that value: see [`super::PlanOptions::read_node`]); the
    /// rest runs on the stream's worker while the host goes on. A training step ends with
    /// `loss.item()` after the optimizer, so the host records the next step while the
    /// backward and the update run. On the CPU JIT the rest runs on the stream's worker
    /// thread, one core, while the host records on another (as strict mode's ops do).
    pub splits_at_host_read: bool,
}

/// Which kernel ops a backend lowers into its whole programs. Gather and scatter are what a
/// training step needs (a loss's target check, embeddings and their backward), and depthwise
/// convolutions what a MobileNet, EfficientNet or ConvNeXt step is made of: without them each
/// one cuts the step's program in two, with a download and an upload around a host routine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KernelsInRegion {
    /// `gather` (and so `index_select` and embedding lookups), any dtype.
    pub gather: bool,
    /// The scatter reductions lowered, for f32, f64, i32 and i64 results (f16/bf16 round
    /// each combining step on the host, which a fused program does not reproduce).
    pub scatter: &'static [ScatterReduce],
    /// Depthwise convolutions (`KernelOp::Depthwise`), all three parts, every float dtype
    /// (f16 and bf16 accumulate in f32 and round once, as the host routine does).
    pub depthwise: bool,
}

impl KernelsInRegion {
    /// None: every kernel op runs as its own step.
    pub const NONE: KernelsInRegion = KernelsInRegion {
        gather: false,
        scatter: &[],
        depthwise: false,
    };

    /// Whether kernel `k` with result dtype `dtype` may sit inside a whole program.
    pub fn takes(&self, k: &KernelOp, dtype: DType) -> bool {
        match k {
            KernelOp::Gather { .. } => self.gather,
            KernelOp::Scatter { reduce, .. } => {
                self.scatter.contains(reduce)
                    && matches!(dtype, DType::F32 | DType::F64 | DType::I32 | DType::I64)
            }
            KernelOp::Depthwise(_) => self.depthwise,
            _ => false,
        }
    }
}

impl Capabilities {
    /// A backend that compiles loop regions (the CPU JIT): the planner's own fusion rules,
    /// and host reads split (the loss's read does not wait for the backward).
    pub const LOOPS: Capabilities = Capabilities {
        fuses_whole_programs: false,
        max_region_ops: usize::MAX,
        kernels_in_region: KernelsInRegion::NONE,
        splits_at_host_read: true,
    };

    /// A backend whose compiler fuses whole programs, with regions of at most `max_ops` ops,
    /// no kernel ops (see [`Capabilities::with_kernels`]) and no split at host reads (see
    /// [`Capabilities::with_split_at_host_read`]).
    pub fn whole_programs(max_ops: usize) -> Capabilities {
        Capabilities {
            fuses_whole_programs: true,
            max_region_ops: max_ops.max(1),
            kernels_in_region: KernelsInRegion::NONE,
            splits_at_host_read: false,
        }
    }

    /// The same, with host reads' flushes split at the read value (see
    /// [`Capabilities::splits_at_host_read`]).
    pub fn with_split_at_host_read(self) -> Capabilities {
        Capabilities {
            splits_at_host_read: true,
            ..self
        }
    }

    /// The same, with `kernels` lowered into whole programs.
    pub fn with_kernels(self, kernels: KernelsInRegion) -> Capabilities {
        Capabilities {
            kernels_in_region: kernels,
            ..self
        }
    }

    /// Whether `op`, giving a result of `dtype`, may sit inside a whole-program region.
    pub fn takes(&self, op: &Op, dtype: DType) -> bool {
        match op {
            Op::Kernel(k) => self.kernels_in_region.takes(k, dtype),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Depthwise, DepthwisePart};
    use smallvec::smallvec;

    #[test]
    fn a_depthwise_convolution_sits_in_a_whole_program_only_where_the_backend_lowers_it() {
        let k = KernelOp::Depthwise(Box::new(Depthwise {
            part: DepthwisePart::WeightGrad,
            kernel: smallvec![3, 3],
            stride: smallvec![1, 1],
            padding: smallvec![1, 1],
            dilation: smallvec![1, 1],
            input: smallvec![],
        }));
        let lowered = KernelsInRegion {
            depthwise: true,
            ..KernelsInRegion::NONE
        };
        for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            assert!(lowered.takes(&k, d), "{d}");
            assert!(!KernelsInRegion::NONE.takes(&k, d), "{d}");
        }
        let whole = Capabilities::whole_programs(64);
        let op = Op::Kernel(k);
        assert!(!whole.takes(&op, DType::F32));
        assert!(whole.with_kernels(lowered).takes(&op, DType::F32));
        assert!(!Capabilities::LOOPS.takes(&op, DType::F32));
    }
}
