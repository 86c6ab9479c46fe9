//! The timeline through the C ABI: start and stop a Chrome trace / Perfetto JSON file at run
//! time (`DEFERFUSE_TRACE` records one from creation instead), and add the host backend's own
//! events (why a sync point happened, which op fell back) to it.

use crate::error::{guard, invalid, write_out, DfuseStatus, Result};
use crate::runtime_registry::{runtime, DfuseRuntime};
use std::ffi::{c_char, CStr};

/// A required UTF-8 C string parameter.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, name: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(invalid(format!(
            "{name} is NULL; pass a NUL-terminated string"
        )));
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(format!("{name} is not valid UTF-8")))
}

/// Starts recording the runtime's timeline (flushes, plan lookups, compiles, program runs,
/// host copies, sync waits) into the file `path`, written as Chrome trace / Perfetto JSON
/// when the trace stops (`dfuse_trace_stop`, or when the runtime is destroyed). At most
/// `max_events` events are kept, the oldest dropped beyond that (0: `DEFERFUSE_TRACE_EVENTS`,
/// else 262144). The file is created now: a path that cannot be written is
/// `DFUSE_STATUS_INVALID_ARGUMENT`, as is a second start while a trace runs.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dfuse_trace_start(
    rt: *const DfuseRuntime,
    path: *const c_char,
    max_events: u64,
) -> DfuseStatus {
    guard("dfuse_trace_start", || {
        let rt = runtime(rt)?;
        // SAFETY: the caller's contract.
        let path = unsafe { text(path, "path") }?;
        let n = usize::try_from(max_events)
            .map_err(|_| invalid(format!("max_events = {max_events} does not fit in size_t")))?;
        rt.trace_start(std::path::Path::new(path), n)
    })
}

/// Stops the running trace and writes its file; `*events` gets the events written and
/// `*dropped` the oldest ones the ring buffer dropped. Work still running on a stream is in
/// the file only as far as it got: synchronize first. No trace running is
/// `DFUSE_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `events` and `dropped` must be NULL or point to writable `uint64_t`s.
#[no_mangle]
pub unsafe extern "C" fn dfuse_trace_stop(
    rt: *const DfuseRuntime,
    events: *mut u64,
    dropped: *mut u64,
) -> DfuseStatus {
    guard("dfuse_trace_stop", || {
        // SAFETY: the caller's contract.
        unsafe {
            write_out(events, "events", 0)?;
            write_out(dropped, "dropped", 0)?;
        }
        let s = runtime(rt)?.trace_stop()?;
        // SAFETY: the caller's contract.
        unsafe {
            write_out(events, "events", s.events)?;
            write_out(dropped, "dropped", s.dropped)
        }
    })
}

/// Writes 1 to `*on` while a trace runs, else 0: a host backend gathers what only it knows
/// (a sync point's source line) only then.
///
/// # Safety
/// `on` must be NULL or point to a writable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_trace_active(rt: *const DfuseRuntime, on: *mut u32) -> DfuseStatus {
    guard("dfuse_trace_active", || {
        let rt = runtime(rt)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(on, "on", rt.tracing() as u32) }
    })
}

/// Adds an instant event named `name` with the text `detail` to `stream`'s host track (0 =
/// default): what a host backend knows and the runtime does not, such as the user's source
/// line that forced a sync point or the op that ran on the host instead. Nothing happens when
/// no trace runs.
///
/// # Safety
/// `name` and `detail` must be NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn dfuse_trace_mark(
    rt: *const DfuseRuntime,
    stream: u64,
    name: *const c_char,
    detail: *const c_char,
) -> DfuseStatus {
    guard("dfuse_trace_mark", || {
        let rt = runtime(rt)?;
        // SAFETY: the caller's contract.
        let (name, detail) = unsafe { (text(name, "name")?, text(detail, "detail")?) };
        rt.trace_mark(stream, name, detail)
    })
}
