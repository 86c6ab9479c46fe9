//! `dfuse_pending_dump`: the deferred ops a stream holds, as text. A host backend (the PyTorch
//! device's `dump_pending()`) shows it so a user can see what a sync point is about to run.

use crate::error::{guard, slice_out, write_out, DfuseStatus};
use crate::runtime_registry::{runtime, DfuseRuntime};

/// Writes the pending (recorded, not yet run) ops of `stream` (0 = default) as NUL-terminated
/// text, one op per line, to `buf[0..capacity]`, and the bytes the whole text needs (including
/// the NUL) to `*needed`. Call it with `capacity` 0 (and `buf` NULL) to learn the size; a
/// `capacity` smaller than needed is `DFUSE_STATUS_INVALID_ARGUMENT` and writes nothing to
/// `buf`. Nothing is run: this is not a sync point.
///
/// # Safety
/// `buf` must be NULL or writable for `capacity` bytes (NULL only when `capacity` is 0);
/// `needed` must be NULL or point to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_pending_dump(
    rt: *const DfuseRuntime,
    stream: u64,
    buf: *mut u8,
    capacity: usize,
    needed: *mut usize,
) -> DfuseStatus {
    guard("dfuse_pending_dump", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(needed, "needed", 0)? };
        let text = runtime(rt)?.pending_text(stream)?;
        let n = text.len() + 1;
        // SAFETY: the caller's contract.
        unsafe { write_out(needed, "needed", n)? };
        if capacity == 0 {
            return Ok(());
        }
        if capacity < n {
            return Err(crate::error::invalid(format!(
                "buf: capacity {capacity} is too small; the text needs {n} bytes (see *needed)"
            )));
        }
        // SAFETY: the caller's contract.
        let out = unsafe { slice_out(buf, n, "buf")? };
        out[..text.len()].copy_from_slice(text.as_bytes());
        out[text.len()] = 0;
        Ok(())
    })
}
