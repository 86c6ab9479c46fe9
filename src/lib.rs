//! deferfuse: deferred, fused, compiled eager execution for a PyTorch device backend.
//!
//! This root crate only re-exports the workspace's crates; see `README.md` for the tour.

#![warn(missing_docs)]

pub use deferfuse_cache as cache;
pub use deferfuse_fusion as fusion;
pub use deferfuse_runtime as runtime;

pub use deferfuse_fusion::ir::{BinaryOp, DType, Op, ReduceOp, Scalar, UnaryOp};
pub use deferfuse_runtime::{
    BackendKind, BufferState, Config, Error, Handle, Input, Mode, Runtime, Stats, Status,
    SyncReason, View,
};
