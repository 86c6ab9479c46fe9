//! `dfuse_pending_dump`: the deferred ops a stream holds, as text. A host backend (the PyTorch
//! device's `dump_pending()`) shows it so a user can see what a sync point is about to run.

use crate::error::{guard, slice_out, write_out, DfuseStatus};
use crate::runtime_registry::{runtime, DfuseRuntime};
use std::ffi::c_char;

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
    buf: *mut c_char,
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
        let out = unsafe { slice_out(buf.cast::<u8>(), n, "buf")? };
        out[..text.len()].copy_from_slice(text.as_bytes());
        out[text.len()] = 0;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DfuseStatus;
    use crate::runtime_registry::{
        dfuse_config_default, dfuse_runtime_create, dfuse_runtime_destroy,
    };
    use crate::stream::dfuse_stream_synchronize;
    use crate::tensor::{dfuse_tensor_from_host, dfuse_tensor_release};
    use crate::types::{DfuseDtype, DfuseMode};
    use std::ptr;

    fn dump(rt: *const DfuseRuntime) -> String {
        let mut need = 0usize;
        // SAFETY: valid out-pointer; capacity 0 asks for the size only.
        let s = unsafe { dfuse_pending_dump(rt, 0, ptr::null_mut(), 0, &mut need) };
        assert_eq!(s, DfuseStatus::Ok);
        let mut buf = vec![0u8; need];
        // SAFETY: buf is writable for need bytes.
        let s = unsafe { dfuse_pending_dump(rt, 0, buf.as_mut_ptr().cast(), need, &mut need) };
        assert_eq!(s, DfuseStatus::Ok);
        assert_eq!(buf.pop(), Some(0), "NUL-terminated");
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn dump_shows_deferred_ops_until_they_run_and_checks_its_buffer() {
        let mut cfg = std::mem::MaybeUninit::uninit();
        let mut rt = ptr::null_mut();
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(dfuse_config_default(cfg.as_mut_ptr()), DfuseStatus::Ok);
            let mut cfg = cfg.assume_init();
            cfg.mode = DfuseMode::Defer as u32;
            assert_eq!(dfuse_runtime_create(&cfg, &mut rt), DfuseStatus::Ok);
        }
        assert_eq!(dump(rt), "");
        let data = [1.0f32, -2.0, 3.0];
        let sizes = [3i64];
        let (mut x, mut y) = (0u64, 0u64);
        // SAFETY: slices and out-pointers are valid.
        unsafe {
            let s = dfuse_tensor_from_host(
                rt,
                data.as_ptr().cast(),
                12,
                DfuseDtype::F32 as u32,
                sizes.as_ptr(),
                1,
                &mut x,
            );
            assert_eq!(s, DfuseStatus::Ok);
            let s = crate::test_ops::record_exp(rt, x, &mut y);
            assert_eq!(s, DfuseStatus::Ok);
        }
        let text = dump(rt);
        assert!(text.contains("exp"), "{text}");
        let mut need = 0usize;
        let mut small = [0u8; 2];
        // SAFETY: small is writable for 2 bytes.
        let s = unsafe { dfuse_pending_dump(rt, 0, small.as_mut_ptr().cast(), 2, &mut need) };
        assert_eq!(s, DfuseStatus::InvalidArgument);
        assert_eq!(need, text.len() + 1);
        assert_eq!(small, [0, 0], "nothing written on failure");
        // SAFETY: a NULL `needed` is reported, not dereferenced.
        let s = unsafe { dfuse_pending_dump(rt, 0, ptr::null_mut(), 0, ptr::null_mut()) };
        assert_eq!(s, DfuseStatus::InvalidArgument);
        // SAFETY: live runtime and handles.
        unsafe {
            assert_eq!(dfuse_stream_synchronize(rt, 0), DfuseStatus::Ok);
            assert_eq!(dump(rt), "");
            dfuse_tensor_release(rt, y);
            dfuse_tensor_release(rt, x);
            assert_eq!(dfuse_runtime_destroy(rt), DfuseStatus::Ok);
        }
    }
}
