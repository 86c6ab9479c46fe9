//! Host memory in use, its peak and a cap (`torch.tpu.memory_stats`,
//! `set_per_process_memory_fraction`): the runtime's buffers live in host memory, so the cap
//! turns "the machine runs out" into a clear `DFUSE_STATUS_OUT_OF_MEMORY` at the allocation.

use crate::error::{guard, write_out, DfuseStatus};
use crate::runtime_registry::{runtime, DfuseRuntime};

/// The runtime's memory counters (`dfuse_memory_info`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DfuseMemoryInfo {
    /// Bytes of buffers in use now (allocation sizes rounded up to the allocator's buckets;
    /// intermediates of running programs included).
    pub live_bytes: u64,
    /// The largest `live_bytes` since the runtime was made or `dfuse_memory_peak_reset`.
    pub peak_live_bytes: u64,
    /// The cap on `live_bytes` (0: none).
    pub limit_bytes: u64,
    /// Bytes of freed blocks kept for reuse (`dfuse_release_cached_memory` returns them).
    pub cached_bytes: u64,
}

/// Writes the memory counters to `*out`.
///
/// # Safety
/// `out` must be NULL or point to a writable `DfuseMemoryInfo`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_memory_info(
    rt: *const DfuseRuntime,
    out: *mut DfuseMemoryInfo,
) -> DfuseStatus {
    guard("dfuse_memory_info", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", DfuseMemoryInfo::default())? };
        let m = runtime(rt)?.memory();
        let info = DfuseMemoryInfo {
            live_bytes: m.live_bytes,
            peak_live_bytes: m.peak_live_bytes,
            limit_bytes: m.limit_bytes,
            cached_bytes: m.cached_bytes,
        };
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", info) }
    })
}

/// Caps the bytes of buffers in use at `bytes` (0 removes the cap; `DEFERFUSE_MEMORY_LIMIT`
/// sets it at creation). An allocation past the cap fails with `DFUSE_STATUS_OUT_OF_MEMORY`
/// naming the limit; buffers already in use stay.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_memory_limit_set(
    rt: *const DfuseRuntime,
    bytes: u64,
) -> DfuseStatus {
    guard("dfuse_memory_limit_set", || {
        runtime(rt)?.set_memory_limit(bytes);
        Ok(())
    })
}

/// Restarts the peak of memory in use (`DfuseMemoryInfo.peak_live_bytes`) from the current
/// value.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_memory_peak_reset(rt: *const DfuseRuntime) -> DfuseStatus {
    guard("dfuse_memory_peak_reset", || {
        runtime(rt)?.reset_memory_peak();
        Ok(())
    })
}
