//! The timeline through the C ABI: start and stop a Chrome trace / Perfetto JSON file at run
//! time (`DEFERFUSE_TRACE` records one from creation instead), and add the host backend's own
//! events (why a sync point happened, which op fell back) to it.

use crate::error::{guard, invalid, slice_out, write_out, DfuseStatus, Result};
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

/// Starts (`on` = 1) or stops (0) timing program runs for `dfuse_profiler_point`: the device
/// clock a profiler (torch.profiler's PrivateUse1 hooks) reads. While on, each program costs
/// two clock reads more.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_profiler_enable(rt: *const DfuseRuntime, on: u32) -> DfuseStatus {
    guard("dfuse_profiler_enable", || {
        let rt = runtime(rt)?;
        if on > 1 {
            return Err(invalid(format!("on = {on}: expected 0 or 1")));
        }
        rt.profiler_enable(on == 1);
        Ok(())
    })
}

/// Waits for the work already launched on every stream (deferred ops are not flushed, and
/// errors are left for the next sync point), then writes to `*busy_ns` the nanoseconds
/// programs have run while profiling was on. The difference of two points is the device time
/// of the programs that ran between them.
///
/// # Safety
/// `busy_ns` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_profiler_point(
    rt: *const DfuseRuntime,
    busy_ns: *mut u64,
) -> DfuseStatus {
    guard("dfuse_profiler_point", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(busy_ns, "busy_ns", 0)? };
        let t = runtime(rt)?.profiler_point();
        // SAFETY: the caller's contract.
        unsafe { write_out(busy_ns, "busy_ns", t) }
    })
}

/// Bytes of a [`DfuseProfiledRun`]'s label, its NUL included (longer labels are cut).
pub const DFUSE_PROFILED_LABEL_LEN: usize = 128;

/// One program run collected for a profiler (`dfuse_profiler_take`): what a device activity
/// in torch.profiler's trace shows.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DfuseProfiledRun {
    /// The stream whose work it was.
    pub stream: u64,
    /// The CPU worker that ran it inside a wave, or -1 when it ran on the stream's own track.
    pub worker: i64,
    /// The tag (`dfuse_profiler_tag`) of the thread that prepared it: the op that launched it.
    pub tag: u64,
    /// Start in nanoseconds since the Unix epoch.
    pub start_unix_ns: i64,
    /// How long it ran, in nanoseconds.
    pub dur_ns: u64,
    /// The region's label, NUL-terminated.
    pub label: [c_char; DFUSE_PROFILED_LABEL_LEN],
}

/// Starts (`max_runs` > 0: keeping at most that many, the oldest dropped) or stops (0)
/// collecting program runs (stream, start, duration, region label, tag) for a profiler's
/// device activities: torch.profiler's trace and its device time. A start discards runs not
/// yet taken. `*dropped` (may be NULL) gets the runs dropped so far.
///
/// # Safety
/// `dropped` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_profiler_capture(
    rt: *const DfuseRuntime,
    max_runs: u64,
    dropped: *mut u64,
) -> DfuseStatus {
    guard("dfuse_profiler_capture", || {
        let rt = runtime(rt)?;
        let n = usize::try_from(max_runs)
            .map_err(|_| invalid(format!("max_runs = {max_runs} does not fit in size_t")))?;
        if !dropped.is_null() {
            // Checked before anything starts or stops: a bad pointer changes nothing.
            // SAFETY: the caller's contract.
            unsafe { write_out(dropped, "dropped", 0)? };
        }
        let d = rt.profiler_capture(n);
        if dropped.is_null() {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { write_out(dropped, "dropped", d) }
    })
}

/// Sets the calling thread's tag: runs prepared on this thread from now on carry it, so a
/// profiler links each run to the op that launched it (torch.profiler's correlation id).
/// 0 means none.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_profiler_tag(rt: *const DfuseRuntime, tag: u64) -> DfuseStatus {
    guard("dfuse_profiler_tag", || {
        runtime(rt)?.profiler_tag(tag);
        Ok(())
    })
}

/// Writes 1 to `*on` when the runtime's log prints fusion cuts (`DEFERFUSE_LOG` at debug for
/// the runtime), else 0. A host backend then tags each op it records with its source
/// (`dfuse_profiler_tag`, the source id in the high 32 bits) and names each id once
/// (`dfuse_source_name`): the log follows each cut line with the user's source line of the op
/// it cut at. Finding an op's source line costs the host, which pays it only when this is 1.
///
/// # Safety
/// `on` must be NULL or point to a writable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_log_cuts(rt: *const DfuseRuntime, on: *mut u32) -> DfuseStatus {
    guard("dfuse_log_cuts", || {
        let rt = runtime(rt)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(on, "on", rt.logs_cuts() as u32) }
    })
}

/// Names source id `id` (the high 32 bits of the tags `dfuse_profiler_tag` sets) with `name`,
/// such as "train.py:12 in step": a cut at an op recorded with that id names it, as
/// `args.source` in a trace file and in the log (see `dfuse_log_cuts`). A new name for an id
/// replaces the old one. 0 means "no source" and cannot be named
/// (`DFUSE_STATUS_INVALID_ARGUMENT`).
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dfuse_source_name(
    rt: *const DfuseRuntime,
    id: u32,
    name: *const c_char,
) -> DfuseStatus {
    guard("dfuse_source_name", || {
        let rt = runtime(rt)?;
        if id == 0 {
            return Err(invalid(
                "id = 0: source id 0 means no source; name ids from 1".to_string(),
            ));
        }
        // SAFETY: the caller's contract.
        let name = unsafe { text(name, "name") }?;
        rt.name_source(id, name);
        Ok(())
    })
}

/// Moves up to `cap` collected runs, oldest first, into `out[0..*n]`; call again until `*n`
/// is less than `cap` to take them all.
///
/// # Safety
/// `out` must be NULL or point to `cap` writable `DfuseProfiledRun`s (NULL only when `cap`
/// is 0); `n` must be NULL or point to a writable `uint64_t` (NULL is reported).
#[no_mangle]
pub unsafe extern "C" fn dfuse_profiler_take(
    rt: *const DfuseRuntime,
    out: *mut DfuseProfiledRun,
    cap: u64,
    n: *mut u64,
) -> DfuseStatus {
    guard("dfuse_profiler_take", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(n, "n", 0)? };
        let rt = runtime(rt)?;
        let cap = usize::try_from(cap)
            .map_err(|_| invalid(format!("cap = {cap} does not fit in size_t")))?;
        // SAFETY: the caller's contract.
        let out = unsafe { slice_out(out, cap, "out") }?;
        let runs = rt.profiler_take(cap);
        for (slot, r) in out.iter_mut().zip(&runs) {
            let mut label = [0 as c_char; DFUSE_PROFILED_LABEL_LEN];
            for (d, b) in label
                .iter_mut()
                .zip(r.label.bytes().take(DFUSE_PROFILED_LABEL_LEN - 1))
            {
                *d = b as c_char;
            }
            *slot = DfuseProfiledRun {
                stream: r.stream,
                worker: r.worker.map_or(-1, |w| w as i64),
                tag: r.tag,
                start_unix_ns: r.start_unix_ns,
                dur_ns: r.dur_ns,
                label,
            };
        }
        // SAFETY: the caller's contract.
        unsafe { write_out(n, "n", runs.len() as u64) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::last_error_ptr;
    use crate::runtime_registry::{dfuse_runtime_create, dfuse_runtime_destroy};
    use std::ptr;

    fn runtime() -> *mut DfuseRuntime {
        let mut rt = ptr::null_mut();
        // SAFETY: NULL config means the defaults; valid out-pointer.
        assert_eq!(
            unsafe { dfuse_runtime_create(ptr::null(), &mut rt) },
            DfuseStatus::Ok
        );
        rt
    }

    fn last_error() -> String {
        // SAFETY: the library's own NUL-terminated string.
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_source_name_needs_an_id_from_1_and_a_name() {
        let rt = runtime();
        let mut on = 9u32;
        // SAFETY: live runtime, valid strings and out-pointers.
        unsafe {
            assert_eq!(dfuse_log_cuts(rt, &mut on), DfuseStatus::Ok);
            assert!(on <= 1, "{on}");
            assert_eq!(
                dfuse_source_name(rt, 1, c"train.py:3".as_ptr()),
                DfuseStatus::Ok
            );
            assert_eq!(
                dfuse_source_name(rt, 0, c"train.py:3".as_ptr()),
                DfuseStatus::InvalidArgument
            );
            assert!(last_error().contains("id = 0"), "{}", last_error());
            assert_eq!(
                dfuse_source_name(rt, 2, ptr::null()),
                DfuseStatus::InvalidArgument
            );
            assert!(last_error().contains("name is NULL"), "{}", last_error());
            dfuse_runtime_destroy(rt);
        }
    }

    #[test]
    fn a_trace_started_and_stopped_writes_its_file_and_reports_its_counts() {
        let rt = runtime();
        let path =
            std::env::temp_dir().join(format!("dfuse-ffi-trace-{}.json", std::process::id()));
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        let (mut on, mut events, mut dropped) = (0u32, 9u64, 9u64);
        // SAFETY: live runtime, valid strings and out-pointers.
        unsafe {
            assert_eq!(dfuse_trace_start(rt, c.as_ptr(), 0), DfuseStatus::Ok);
            assert_eq!(dfuse_trace_active(rt, &mut on), DfuseStatus::Ok);
            assert_eq!(on, 1);
            let (name, detail) = (c"sync: item".as_ptr(), c"train.py:3".as_ptr());
            assert_eq!(dfuse_trace_mark(rt, 0, name, detail), DfuseStatus::Ok);
            assert_eq!(
                dfuse_trace_stop(rt, &mut events, &mut dropped),
                DfuseStatus::Ok
            );
        }
        assert_eq!((events, dropped), (1, 0));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("train.py:3"), "{text}");
        let _ = std::fs::remove_file(path);
        // SAFETY: live runtime.
        assert_eq!(unsafe { dfuse_runtime_destroy(rt) }, DfuseStatus::Ok);
    }

    #[test]
    fn the_profiler_clock_advances_only_while_profiling_and_by_the_programs_run() {
        use crate::tensor::{dfuse_tensor_empty, dfuse_tensor_release};
        use crate::types::DfuseDtype;
        let rt = runtime();
        let sizes = [1i64 << 16];
        let (mut x, mut t0, mut t1, mut t2) = (0u64, 0u64, 0u64, 0u64);
        // SAFETY: live runtime, valid arrays and out-pointers.
        unsafe {
            let s = dfuse_tensor_empty(rt, DfuseDtype::F32 as u32, sizes.as_ptr(), 1, &mut x);
            assert_eq!(s, DfuseStatus::Ok);
            let exp = |out: &mut u64| crate::test_ops::record_exp(rt, x, out);
            let mut y = 0u64;
            assert_eq!(exp(&mut y), DfuseStatus::Ok);
            assert_eq!(dfuse_profiler_point(rt, &mut t0), DfuseStatus::Ok);
            assert_eq!(dfuse_profiler_enable(rt, 1), DfuseStatus::Ok);
            let mut z = 0u64;
            assert_eq!(exp(&mut z), DfuseStatus::Ok);
            assert_eq!(dfuse_profiler_point(rt, &mut t1), DfuseStatus::Ok);
            assert_eq!(dfuse_profiler_enable(rt, 0), DfuseStatus::Ok);
            let mut w = 0u64;
            assert_eq!(exp(&mut w), DfuseStatus::Ok);
            assert_eq!(dfuse_profiler_point(rt, &mut t2), DfuseStatus::Ok);
            assert_eq!(dfuse_profiler_enable(rt, 2), DfuseStatus::InvalidArgument);
            for h in [x, y, z, w] {
                dfuse_tensor_release(rt, h);
            }
            assert_eq!(dfuse_runtime_destroy(rt), DfuseStatus::Ok);
        }
        assert_eq!(t0, 0, "not profiling yet");
        assert!(t1 > t0, "the exp that ran while profiling counts");
        assert_eq!(t2, t1, "not after profiling stopped");
    }

    #[test]
    fn stopping_with_no_trace_running_is_an_invalid_argument_that_says_so() {
        let rt = runtime();
        let (mut events, mut dropped) = (0u64, 0u64);
        // SAFETY: live runtime, valid out-pointers.
        let s = unsafe { dfuse_trace_stop(rt, &mut events, &mut dropped) };
        assert_eq!(s, DfuseStatus::InvalidArgument);
        assert!(
            last_error().contains("no trace is running"),
            "{}",
            last_error()
        );
        // SAFETY: live runtime.
        assert_eq!(unsafe { dfuse_runtime_destroy(rt) }, DfuseStatus::Ok);
    }

    #[test]
    fn a_null_path_is_an_invalid_argument_naming_the_parameter() {
        let rt = runtime();
        // SAFETY: a NULL path is reported, not read.
        let s = unsafe { dfuse_trace_start(rt, ptr::null(), 0) };
        assert_eq!(s, DfuseStatus::InvalidArgument);
        assert!(last_error().contains("path is NULL"), "{}", last_error());
        // SAFETY: live runtime.
        assert_eq!(unsafe { dfuse_runtime_destroy(rt) }, DfuseStatus::Ok);
    }
    #[test]
    fn captured_runs_carry_the_tag_set_on_the_thread_that_launched_them() {
        use crate::tensor::{dfuse_tensor_empty, dfuse_tensor_release};
        use crate::types::DfuseDtype;
        let rt = runtime();
        let sizes = [1024i64];
        let (mut x, mut y, mut n, mut busy) = (0u64, 0u64, 0u64, 0u64);
        // SAFETY: zeroed plain C data.
        let mut out: [DfuseProfiledRun; 4] = unsafe { std::mem::zeroed() };
        // SAFETY: live runtime, valid arrays and out-pointers.
        unsafe {
            let s = dfuse_tensor_empty(rt, DfuseDtype::F32 as u32, sizes.as_ptr(), 1, &mut x);
            assert_eq!(s, DfuseStatus::Ok);
            assert_eq!(
                dfuse_profiler_capture(rt, 16, ptr::null_mut()),
                DfuseStatus::Ok
            );
            assert_eq!(dfuse_profiler_tag(rt, 77), DfuseStatus::Ok);
            assert_eq!(crate::test_ops::record_exp(rt, x, &mut y), DfuseStatus::Ok);
            assert_eq!(dfuse_profiler_tag(rt, 0), DfuseStatus::Ok);
            assert_eq!(dfuse_profiler_point(rt, &mut busy), DfuseStatus::Ok);
            assert_eq!(
                dfuse_profiler_capture(rt, 0, ptr::null_mut()),
                DfuseStatus::Ok
            );
            let s = dfuse_profiler_take(rt, out.as_mut_ptr(), 4, &mut n);
            assert_eq!(s, DfuseStatus::Ok);
            for h in [x, y] {
                dfuse_tensor_release(rt, h);
            }
            assert_eq!(dfuse_runtime_destroy(rt), DfuseStatus::Ok);
        }
        assert_eq!(n, 1, "the exp's one program");
        assert_eq!((out[0].tag, out[0].stream, out[0].worker), (77, 0, -1));
        assert!(out[0].start_unix_ns > 0);
        // SAFETY: take NUL-terminates the label.
        let label = unsafe { CStr::from_ptr(out[0].label.as_ptr()) };
        assert!(!label.to_bytes().is_empty(), "the region's label");
    }

    #[test]
    fn take_into_a_null_array_is_an_invalid_argument_naming_it() {
        let rt = runtime();
        let mut n = 0u64;
        // SAFETY: a NULL array is reported, not written.
        let s = unsafe { dfuse_profiler_take(rt, ptr::null_mut(), 4, &mut n) };
        assert_eq!(s, DfuseStatus::InvalidArgument);
        assert!(last_error().contains("out"), "{}", last_error());
        // SAFETY: live runtime.
        assert_eq!(unsafe { dfuse_runtime_destroy(rt) }, DfuseStatus::Ok);
    }
}
