//! The deferfuse C ABI (`dfuse_*`), the one interface a PyTorch device backend links.
//!
//! Deliberately thin: each entry point validates its pointers and enum numbers, converts them to
//! the runtime's types, calls `deferfuse_runtime::Runtime`, and turns the outcome into a
//! `DfuseStatus`. No behaviour lives here.
//!
//! Conventions every entry point follows (the header, generated from this crate by cbindgen,
//! repeats them):
//! - Every function returns a `DfuseStatus`, except `dfuse_last_error` and `dfuse_version`.
//!   On failure `dfuse_last_error()` says which function, which parameter and what to do.
//! - No panic crosses the boundary: each body runs under `catch_unwind`, and a panic becomes
//!   `DFUSE_STATUS_INTERNAL`.
//! - Pointers are checked where they can be: a NULL (or misaligned) out-parameter, array with a
//!   non-zero length, or runtime pointer is `DFUSE_STATUS_INVALID_ARGUMENT`. A runtime pointer
//!   that was destroyed or never created is `DFUSE_STATUS_INVALID_HANDLE`, as is a stale tensor,
//!   stream or event handle.
//! - Enum-valued parameters are `uint32_t`, never C enums, so an unknown value is an error we
//!   report instead of undefined behaviour.
//! - Handles are `uint64_t`; 0 is the null handle, and as a stream it means the default stream.
//! - Handle out-parameters are set to 0 (pointers to NULL) when a call fails after checking them.
//!
//! Entry points are `unsafe extern "C"`: the pointers they take must be valid for the access
//! their `# Safety` section describes (or NULL, which is reported). That is the one thing the
//! ABI cannot check, so it is the caller's contract.

#![warn(missing_docs)]

mod error;
mod graph;
mod kernel_op;
mod memory;
mod op;
mod op_call;
mod op_group;
mod pending;
mod runtime_registry;
mod stream;
mod tensor;
#[cfg(test)]
mod test_ops;
mod trace;
mod types;
mod view;

pub use error::DfuseStatus;
pub use graph::{
    dfuse_graph_arity, dfuse_graph_capture_abort, dfuse_graph_capture_begin,
    dfuse_graph_capture_end, dfuse_graph_destroy, dfuse_graph_launch,
};
pub use kernel_op::{
    DfuseConvPart, DfuseCtcPart, DfuseDepthwisePart, DfuseGroupedMm, DfuseRandomDist,
    DfuseRecurrencePart, DfuseScanOp, DfuseScatterReduce,
};
pub use memory::{
    dfuse_memory_info, dfuse_memory_limit_set, dfuse_memory_peak_reset, DfuseMemoryInfo,
};
pub use op::{DfuseAttrs, DfuseBinaryOp, DfuseOpKind, DfuseReduceOp, DfuseUnaryOp};
pub use op_call::{dfuse_op, dfuse_op_meta};
pub use op_group::{dfuse_op_group_begin, dfuse_op_group_end};
pub use pending::dfuse_pending_dump;
pub use runtime_registry::{
    dfuse_config_default, dfuse_mode_get, dfuse_mode_pop, dfuse_mode_push, dfuse_mode_set,
    dfuse_pipeline_ops_set, dfuse_release_cached_memory, dfuse_runtime_create,
    dfuse_runtime_destroy, dfuse_stats, DfuseConfig, DfuseRuntime,
};
pub use stream::{
    dfuse_device_synchronize, dfuse_event_create, dfuse_event_create_timing, dfuse_event_destroy,
    dfuse_event_elapsed_ms, dfuse_event_query, dfuse_event_record, dfuse_event_synchronize,
    dfuse_event_wait, dfuse_stream_create, dfuse_stream_destroy, dfuse_stream_query,
    dfuse_stream_synchronize,
};
pub use tensor::{
    dfuse_tensor_dtype, dfuse_tensor_empty, dfuse_tensor_from_host, dfuse_tensor_full,
    dfuse_tensor_item, dfuse_tensor_meta, dfuse_tensor_ndim, dfuse_tensor_release,
    dfuse_tensor_retain, dfuse_tensor_shape, dfuse_tensor_state, dfuse_tensor_strides,
    dfuse_tensor_to_host, dfuse_tensor_to_host_for_size,
};
pub use trace::{
    dfuse_log_cuts, dfuse_profiler_capture, dfuse_profiler_enable, dfuse_profiler_point,
    dfuse_profiler_tag, dfuse_profiler_take, dfuse_source_name, dfuse_trace_active,
    dfuse_trace_mark, dfuse_trace_start, dfuse_trace_stop, DfuseProfiledRun,
    DFUSE_PROFILED_LABEL_LEN,
};
pub use types::{
    DfuseBackend, DfuseBufferState, DfuseCutReason, DfuseDtype, DfuseMode, DfuseOperand,
    DfuseOperandKind, DfuseScalar, DfuseScalarKind, DfuseStats, DfuseSyncReason,
    DFUSE_BACKEND_FROM_ENV, DFUSE_CUT_REASON_COUNT, DFUSE_MAX_REDUCE_DIMS, DFUSE_MODE_FROM_ENV,
    DFUSE_SYNC_REASON_COUNT,
};
pub use view::{dfuse_as_strided, dfuse_view, DfuseViewKind};

use std::ffi::c_char;

/// The message of the last failing `dfuse_*` call on the calling thread, or "" if none failed.
/// Successful calls leave it as it is. The string is owned by the library and stays valid until
/// the next `dfuse_*` call on this thread; copy it to keep it. Never NULL.
#[no_mangle]
pub extern "C" fn dfuse_last_error() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    std::panic::catch_unwind(error::last_error_ptr).unwrap_or(EMPTY.as_ptr().cast())
}

/// The library version, e.g. "0.1.0": a static string, never freed.
#[no_mangle]
pub extern "C" fn dfuse_version() -> *const c_char {
    // A constant: nothing here can panic, so there is nothing to catch.
    static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr().cast()
}
