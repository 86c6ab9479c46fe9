//! Streams and events, with CUDA's semantics: a stream runs its work in order, asynchronously to
//! the host; an event marks a point in a stream that other streams or the host can wait for.
//! Stream handle 0 is the runtime's default stream.

use crate::error::{guard, write_out, DfuseStatus};
use crate::runtime_registry::{runtime, DfuseRuntime};

/// Creates a stream and writes its handle to `*out` (0 on failure). Destroy it with
/// `dfuse_stream_destroy`.
///
/// # Safety
/// `out` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_stream_create(
    rt: *const DfuseRuntime,
    out: *mut u64,
) -> DfuseStatus {
    guard("dfuse_stream_create", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", 0)? };
        let s = runtime(rt)?.create_stream()?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", s) }
    })
}

/// Runs and waits for the stream's pending work, then destroys it. The default stream (0)
/// cannot be destroyed (`DFUSE_STATUS_INVALID_ARGUMENT`); a destroyed stream is
/// `DFUSE_STATUS_INVALID_HANDLE`.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_stream_destroy(rt: *const DfuseRuntime, stream: u64) -> DfuseStatus {
    guard("dfuse_stream_destroy", || {
        runtime(rt)?.destroy_stream(stream)
    })
}

/// Runs everything pending on `stream` (0 = default) and blocks until it is done; returns the
/// first error its asynchronous work reported.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_stream_synchronize(
    rt: *const DfuseRuntime,
    stream: u64,
) -> DfuseStatus {
    guard("dfuse_stream_synchronize", || {
        runtime(rt)?.synchronize(stream)
    })
}

/// Synchronizes every stream of the runtime (like `cudaDeviceSynchronize`).
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_device_synchronize(rt: *const DfuseRuntime) -> DfuseStatus {
    guard("dfuse_device_synchronize", || {
        runtime(rt)?.synchronize_all()
    })
}

/// Creates an event and writes its handle to `*out` (0 on failure). An event that was never
/// recorded counts as complete.
///
/// # Safety
/// `out` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_event_create(rt: *const DfuseRuntime, out: *mut u64) -> DfuseStatus {
    guard("dfuse_event_create", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", 0)? };
        let e = runtime(rt)?.create_event()?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", e) }
    })
}

/// Destroys an event. Streams already waiting on it still wait for its point.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_event_destroy(rt: *const DfuseRuntime, event: u64) -> DfuseStatus {
    guard("dfuse_event_destroy", || runtime(rt)?.destroy_event(event))
}

/// Records `event` at the current end of `stream` (0 = default): it completes once everything
/// issued to the stream so far has run. Pending deferred work on the stream is flushed.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_event_record(
    rt: *const DfuseRuntime,
    event: u64,
    stream: u64,
) -> DfuseStatus {
    guard("dfuse_event_record", || {
        runtime(rt)?.record_event(event, stream)
    })
}

/// Makes `stream` (0 = default) wait, on its own worker and not on the host, until `event`
/// completes: work issued to the stream afterwards runs after the event's point.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_event_wait(
    rt: *const DfuseRuntime,
    stream: u64,
    event: u64,
) -> DfuseStatus {
    guard("dfuse_event_wait", || {
        runtime(rt)?.wait_event(stream, event)
    })
}

/// Writes whether `event` has completed to `*done`, without blocking.
///
/// # Safety
/// `done` must be NULL or point to a writable `bool`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_event_query(
    rt: *const DfuseRuntime,
    event: u64,
    done: *mut bool,
) -> DfuseStatus {
    guard("dfuse_event_query", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(done, "done", false)? };
        let d = runtime(rt)?.query_event(event)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(done, "done", d) }
    })
}

/// Blocks the host until `event` completes.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_event_synchronize(
    rt: *const DfuseRuntime,
    event: u64,
) -> DfuseStatus {
    guard("dfuse_event_synchronize", || {
        runtime(rt)?.synchronize_event(event)
    })
}

/// Creates an event that also keeps the time each record is reached (`torch.Event(
/// enable_timing=True)`), for `dfuse_event_elapsed_ms`, and writes its handle to `*out` (0 on
/// failure). Recording it queues one small job on the stream; a plain event queues none.
///
/// # Safety
/// `out` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_event_create_timing(
    rt: *const DfuseRuntime,
    out: *mut u64,
) -> DfuseStatus {
    guard("dfuse_event_create_timing", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", 0)? };
        let e = runtime(rt)?.create_timing_event()?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", e) }
    })
}

/// Writes the milliseconds from `start`'s recorded point to `end`'s to `*ms` (negative when
/// `end`'s point was reached first), blocking until both are reached. Both events must come from
/// `dfuse_event_create_timing` and have been recorded, else `DFUSE_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `ms` must be NULL or point to a writable `double`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_event_elapsed_ms(
    rt: *const DfuseRuntime,
    start: u64,
    end: u64,
    ms: *mut f64,
) -> DfuseStatus {
    guard("dfuse_event_elapsed_ms", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(ms, "ms", 0.0)? };
        let v = runtime(rt)?.event_elapsed_ms(start, end)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(ms, "ms", v) }
    })
}

/// Writes whether everything issued to `stream` (0 = default) has completed to `*done`. Pending
/// deferred work is flushed first (so a loop polling this makes progress), then the call
/// returns without waiting.
///
/// # Safety
/// `done` must be NULL or point to a writable `bool`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_stream_query(
    rt: *const DfuseRuntime,
    stream: u64,
    done: *mut bool,
) -> DfuseStatus {
    guard("dfuse_stream_query", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(done, "done", false)? };
        let d = runtime(rt)?.query_stream(stream)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(done, "done", d) }
    })
}
