//! Status codes, the per-thread last error message, the panic guard every entry point runs its
//! body in, and the pointer checks the entry points share.
//!
//! The guard is the one place where a Rust `Result` or panic becomes a C status: an entry point
//! does nothing but `guard("dfuse_name", || { ... })`, so no entry point can forget to catch a
//! panic or to record its message.

use deferfuse_runtime::{Error, Status};
use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What every `dfuse_*` call returns (except `dfuse_last_error` and `dfuse_version`).
///
/// The numbers mirror the runtime's status codes and never change. On anything but
/// `DFUSE_STATUS_OK`, `dfuse_last_error()` explains what went wrong and what to do.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseStatus {
    /// The call succeeded; its out-parameters are written.
    Ok = 0,
    /// A NULL pointer, an unknown enum value, a bad length or a malformed argument.
    InvalidArgument = 1,
    /// A runtime pointer, tensor, stream or event handle that is stale, released, NULL where a
    /// live one is needed, or from another runtime.
    InvalidHandle = 2,
    /// An op rejected when it was issued (shapes, dtypes, dims); nothing was recorded.
    BadOp = 3,
    /// An allocation failed.
    OutOfMemory = 4,
    /// The backend failed to compile or run a program (reported at the next sync point when
    /// the work ran asynchronously).
    Backend = 5,
    /// Invalid configuration: the config struct or the `TORCH_TPU_*` environment variables.
    Config = 6,
    /// A bug: a panic was caught at the ABI boundary. The runtime stays usable.
    Internal = 7,
    /// `dfuse_graph_capture_end` refused the capture (a sync point, host read or random op in
    /// it; the message says which): the captured ops stay recorded and run as ordinary
    /// deferred ops, so the caller keeps issuing them op by op for this graph.
    NotCapturable = 8,
}

impl From<Status> for DfuseStatus {
    fn from(s: Status) -> DfuseStatus {
        match s {
            Status::Ok => DfuseStatus::Ok,
            Status::InvalidArgument => DfuseStatus::InvalidArgument,
            Status::InvalidHandle => DfuseStatus::InvalidHandle,
            Status::BadOp => DfuseStatus::BadOp,
            Status::OutOfMemory => DfuseStatus::OutOfMemory,
            Status::Backend => DfuseStatus::Backend,
            Status::Config => DfuseStatus::Config,
            Status::Internal => DfuseStatus::Internal,
            Status::NotCapturable => DfuseStatus::NotCapturable,
        }
    }
}

/// The result type of an entry point's body.
pub(crate) type Result<T> = std::result::Result<T, Error>;

thread_local! {
    /// The message of the last failing call on this thread (empty until one fails).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error. Interior NULs are replaced so the message is
/// never cut short in C.
pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\u{fffd}")).unwrap_or_default();
    // A thread that is exiting has no thread-locals left; the message is then dropped.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

/// Pointer to this thread's last error message ("" if no call failed on this thread).
pub(crate) fn last_error_ptr() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(EMPTY.as_ptr().cast())
}

/// The text of a panic payload (`panic!` gives `&str` or `String`).
fn panic_text(p: &(dyn Any + Send)) -> &str {
    if let Some(s) = p.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = p.downcast_ref::<String>() {
        s
    } else {
        "a panic with a non-string payload"
    }
}

/// Drops a panic payload; a payload whose destructor panics is leaked instead, so even that
/// cannot unwind into C.
fn drop_payload(p: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(p))) {
        std::mem::forget(again);
    }
}

/// Runs an entry point's body: `Ok` is `DFUSE_STATUS_OK`; an error is recorded as the last
/// error (prefixed with `func`) and turned into its status; a panic becomes
/// `DFUSE_STATUS_INTERNAL` and never crosses into C.
pub(crate) fn guard(func: &'static str, body: impl FnOnce() -> Result<()>) -> DfuseStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => DfuseStatus::Ok,
        Ok(Err(e)) => {
            set_last_error(&format!("{func}: {e}"));
            e.status().into()
        }
        Err(payload) => {
            set_last_error(&format!(
                "{func}: internal error: a panic was caught at the C boundary: {}; this is a \
                 deferfuse bug, please report it (the runtime stays usable)",
                panic_text(&*payload)
            ));
            drop_payload(payload);
            DfuseStatus::Internal
        }
    }
}

/// An `InvalidArgument` error.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// `what` is only formatted on error: these checks run on every call, the op path included.
pub(crate) fn check_ptr<T>(p: *const T, name: &str, what: impl std::fmt::Display) -> Result<()> {
    if p.is_null() {
        return Err(invalid(format!("{name} is NULL; pass {what}")));
    }
    if !p.is_aligned() {
        return Err(invalid(format!(
            "{name} ({p:p}) is not aligned to {} bytes; pass {what}",
            std::mem::align_of::<T>()
        )));
    }
    Ok(())
}

/// Writes `v` through the out-parameter `p` (named `name` in the error).
///
/// # Safety
/// `p` must be NULL or valid for writing one `T`.
pub(crate) unsafe fn write_out<T>(p: *mut T, name: &str, v: T) -> Result<()> {
    check_ptr(p, name, "a pointer to writable memory for the result")?;
    // SAFETY: non-null and aligned (checked); valid for writes per the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Reads the struct `p` points to.
///
/// # Safety
/// `p` must be NULL or valid for reading one `T`.
pub(crate) unsafe fn read_in<'a, T>(p: *const T, name: &str) -> Result<&'a T> {
    check_ptr(p, name, "a pointer to an initialized struct")?;
    // SAFETY: non-null and aligned (checked); valid for reads per the caller's contract.
    Ok(unsafe { &*p })
}

fn check_len<T>(n: usize, name: &str) -> Result<()> {
    match n.checked_mul(std::mem::size_of::<T>()) {
        Some(b) if b <= isize::MAX as usize => Ok(()),
        _ => Err(invalid(format!(
            "{name} has {n} elements, more than fit in memory; pass the real count"
        ))),
    }
}

/// The array of `n` elements at `p`; NULL is allowed when `n` is 0.
///
/// # Safety
/// When `n > 0`, `p` must be NULL or valid for reading `n` elements.
pub(crate) unsafe fn slice_in<'a, T>(p: *const T, n: usize, name: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    check_ptr(
        p,
        name,
        format_args!("an array of {n} elements (or a count of 0)"),
    )?;
    check_len::<T>(n, name)?;
    // SAFETY: non-null, aligned, size fits isize (checked); readable per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The writable array of `n` elements at `p`; NULL is allowed when `n` is 0.
///
/// # Safety
/// When `n > 0`, `p` must be NULL or valid for writing `n` elements, and not aliased.
pub(crate) unsafe fn slice_out<'a, T>(p: *mut T, n: usize, name: &str) -> Result<&'a mut [T]> {
    if n == 0 {
        return Ok(&mut []);
    }
    check_ptr(p, name, format_args!("writable memory for {n} elements"))?;
    check_len::<T>(n, name)?;
    // SAFETY: non-null, aligned, size fits isize (checked); writable per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: the pointer is to this thread's NUL-terminated message.
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn guard_turns_a_panic_into_internal() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let s = guard("dfuse_test", || panic!("boom {}", 42));
        let s2 = guard("dfuse_test2", || std::panic::panic_any(7u8));
        std::panic::set_hook(prev);
        assert_eq!(s, DfuseStatus::Internal);
        assert_eq!(s2, DfuseStatus::Internal);
        assert!(
            last().starts_with("dfuse_test2: internal error"),
            "{}",
            last()
        );
        assert!(last().contains("non-string payload"), "{}", last());
    }

    #[test]
    fn guard_records_the_error_with_the_function_name() {
        let s = guard("dfuse_x", || Err(invalid("out is NULL")));
        assert_eq!(s, DfuseStatus::InvalidArgument);
        assert_eq!(last(), "dfuse_x: invalid argument: out is NULL");
        // A later success keeps the message of the last failing call.
        assert_eq!(guard("dfuse_y", || Ok(())), DfuseStatus::Ok);
        assert_eq!(last(), "dfuse_x: invalid argument: out is NULL");
    }

    #[test]
    fn messages_with_nul_survive() {
        set_last_error("a\0b");
        assert_eq!(last(), "a\u{fffd}b");
    }

    #[test]
    fn status_numbers_match_the_runtime() {
        for (s, n) in [
            (Status::Ok, 0),
            (Status::InvalidArgument, 1),
            (Status::InvalidHandle, 2),
            (Status::BadOp, 3),
            (Status::OutOfMemory, 4),
            (Status::Backend, 5),
            (Status::Config, 6),
            (Status::Internal, 7),
            (Status::NotCapturable, 8),
        ] {
            assert_eq!(s as i32, n);
            assert_eq!(DfuseStatus::from(s) as i32, n);
        }
    }

    #[test]
    fn pointer_checks_name_the_parameter() {
        // SAFETY: NULL and misaligned pointers are rejected before any access.
        unsafe {
            let e = write_out(std::ptr::null_mut::<u64>(), "out", 1).unwrap_err();
            assert!(e.to_string().contains("out is NULL"), "{e}");
            let e = slice_in(std::ptr::null::<i64>(), 2, "sizes").unwrap_err();
            assert!(e.to_string().contains("sizes is NULL"), "{e}");
            assert!(slice_in(std::ptr::null::<i64>(), 0, "sizes")
                .unwrap()
                .is_empty());
            let mut buf = [0u64; 2];
            let odd = buf.as_mut_ptr().cast::<u8>().add(1).cast::<u64>();
            let e = write_out(odd, "out", 1).unwrap_err();
            assert!(e.to_string().contains("not aligned"), "{e}");
        }
    }
}
