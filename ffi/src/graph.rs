//! Captured graphs: record a graph's ops once, then launch them again on new inputs with one
//! call, no per-op recording (see `deferfuse_runtime::graph`). A host backend's compiled
//! function captures its first call and launches the graph on every later call whose inputs
//! have the same sizes, strides and dtypes.

use crate::error::{guard, invalid, slice_in, slice_out, write_out, DfuseStatus};
use crate::runtime_registry::{runtime, DfuseRuntime};

/// Starts capturing the ops recorded on `stream` (0 = default) as a graph. What is pending on
/// the stream runs first. Record the graph's ops in defer mode, then end the capture with
/// `dfuse_graph_capture_end` or `dfuse_graph_capture_abort`. A stream already capturing is
/// `DFUSE_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_graph_capture_begin(
    rt: *const DfuseRuntime,
    stream: u64,
) -> DfuseStatus {
    guard("dfuse_graph_capture_begin", || {
        runtime(rt)?.graph_capture_begin(stream)
    })
}

/// Ends the capture on `stream` and writes the new graph's handle to `*graph` (0 on
/// failure): the `n_inputs` tensor handles at `inputs` become its input slots (a launch
/// passes tensors of the same sizes, strides, offsets and dtypes), and each launch returns a
/// new handle for each of the `n_outputs` tensors at `outputs`, a view of the same layout on
/// that launch's buffers. The captured ops stay pending and run at the next sync point. A
/// capture that cannot be replayed (a sync point, host read, random op, or op in another mode
/// or on another stream while capturing) is `DFUSE_STATUS_NOT_CAPTURABLE`, its ops still
/// pending as ordinary deferred ops. Destroy the graph with `dfuse_graph_destroy`.
///
/// # Safety
/// `inputs` and `outputs` must be NULL or readable for their counts (NULL only for a count of
/// 0); `graph` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_graph_capture_end(
    rt: *const DfuseRuntime,
    stream: u64,
    inputs: *const u64,
    n_inputs: usize,
    outputs: *const u64,
    n_outputs: usize,
    graph: *mut u64,
) -> DfuseStatus {
    guard("dfuse_graph_capture_end", || {
        // SAFETY: the caller's contract, for each pointer.
        let (ins, outs) = unsafe {
            write_out(graph, "graph", 0)?;
            (
                slice_in(inputs, n_inputs, "inputs")?,
                slice_in(outputs, n_outputs, "outputs")?,
            )
        };
        let g = runtime(rt)?.graph_capture_end(stream, ins, outs)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(graph, "graph", g) }
    })
}

/// Ends the capture on `stream` without making a graph; its ops stay pending as deferred ops.
/// For a caller whose graph failed halfway. A stream not capturing is
/// `DFUSE_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_graph_capture_abort(
    rt: *const DfuseRuntime,
    stream: u64,
) -> DfuseStatus {
    guard("dfuse_graph_capture_abort", || {
        runtime(rt)?.graph_capture_abort(stream)
    })
}

/// Writes how many input slots and outputs `graph` has to `*n_inputs` and `*n_outputs`.
///
/// # Safety
/// `n_inputs` and `n_outputs` must be NULL or point to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_graph_arity(
    rt: *const DfuseRuntime,
    graph: u64,
    n_inputs: *mut usize,
    n_outputs: *mut usize,
) -> DfuseStatus {
    guard("dfuse_graph_arity", || {
        // SAFETY: the caller's contract.
        unsafe {
            write_out(n_inputs, "n_inputs", 0)?;
            write_out(n_outputs, "n_outputs", 0)?;
        }
        let (i, o) = runtime(rt)?.graph_arity(graph)?;
        // SAFETY: the caller's contract.
        unsafe {
            write_out(n_inputs, "n_inputs", i)?;
            write_out(n_outputs, "n_outputs", o)
        }
    })
}

/// Launches `graph` on `stream` (0 = default) with the `n_inputs` tensor handles at `inputs`
/// (one per input slot, each of the sizes, strides, offset and dtype its slot had at capture)
/// and writes a new handle for each of its outputs to `outputs` (`n_outputs` of them, as many
/// as the graph has; release each). Work pending on the stream runs before it and work issued
/// later runs after it, as for an op; nothing is recorded. A stale graph handle is
/// `DFUSE_STATUS_INVALID_HANDLE`; a wrong count, shape, layout or dtype is
/// `DFUSE_STATUS_INVALID_ARGUMENT`, the message naming the graph, the input slot, what the
/// capture expects and what was given. Nothing runs when the call fails.
///
/// # Safety
/// `inputs` must be NULL or readable for `n_inputs` values (NULL only when 0); `outputs` must
/// be NULL or writable for `n_outputs` values (NULL only when 0).
#[no_mangle]
pub unsafe extern "C" fn dfuse_graph_launch(
    rt: *const DfuseRuntime,
    stream: u64,
    graph: u64,
    inputs: *const u64,
    n_inputs: usize,
    outputs: *mut u64,
    n_outputs: usize,
) -> DfuseStatus {
    guard("dfuse_graph_launch", || {
        // SAFETY: the caller's contract, for each pointer.
        let (ins, outs) = unsafe {
            (
                slice_in(inputs, n_inputs, "inputs")?,
                slice_out(outputs, n_outputs, "outputs")?,
            )
        };
        outs.fill(0);
        let rt = runtime(rt)?;
        let (_, want) = rt.graph_arity(graph)?;
        if want != n_outputs {
            return Err(invalid(format!(
                "outputs: graph {graph:#x} has {want} outputs, given room for {n_outputs}; pass \
                 n_outputs = {want}"
            )));
        }
        let got = rt.graph_launch(stream, graph, ins)?;
        outs.copy_from_slice(&got);
        Ok(())
    })
}

/// Destroys `graph`; launches already issued finish. A stale handle is
/// `DFUSE_STATUS_INVALID_HANDLE`.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_graph_destroy(rt: *const DfuseRuntime, graph: u64) -> DfuseStatus {
    guard("dfuse_graph_destroy", || runtime(rt)?.graph_destroy(graph))
}
