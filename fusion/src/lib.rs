//! deferfuse-fusion: the IR, the per-stream trace buffer and the fusion planner.
//!
//! This crate knows nothing of backends or buffers' storage: it sees tensors as
//! (buffer id, layout, dtype) and decides what work exists and how it is cut into regions.

#![warn(missing_docs)]

pub mod epilogue;
pub mod ir;
pub mod iter;
pub mod key;
pub mod lower;
pub mod node_cache;
pub mod plan;
pub mod plan_cache;
pub mod reduce_geometry;
pub mod region;
pub mod scalar_slot;
pub mod trace;

pub use iter::{IterSpace, StrideKind};
pub use key::TraceKey;
pub use region::{Binding, Region, Step};
pub use trace::{BufferId, Node, Operand, TensorRef, Trace};
