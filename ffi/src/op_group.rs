//! `dfuse_op_group_begin` / `dfuse_op_group_end`: one host-level op recorded as several
//! `dfuse_op` calls runs in strict mode as its own fused program(s) (see the runtime's
//! `op_group` module).

use crate::error::{guard, DfuseStatus};
use crate::runtime_registry::{runtime, DfuseRuntime};

/// Opens an op group on the calling thread: until the matching `dfuse_op_group_end`, the ops
/// this thread records in strict mode are deferred, then run together as one op's program(s)
/// (fused as defer mode would fuse them; intermediates nothing holds are never written). Use it
/// around a kernel that records one user-level op (a layer norm, an optimizer update) as several
/// `dfuse_op` calls. Groups nest; debug and defer mode are unaffected.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_op_group_begin(rt: *const DfuseRuntime) -> DfuseStatus {
    guard("dfuse_op_group_begin", || {
        runtime(rt)?.begin_op_group();
        Ok(())
    })
}

/// Closes the calling thread's innermost op group. When it was the outermost one (and the
/// thread is not in defer mode), the ops it deferred on `stream` (0 = default) are planned and
/// launched now, asynchronously like a strict op (small ones on the calling thread). Release
/// the handles of the group's intermediates before this call so they are never written. A
/// launch failure is returned here; `DFUSE_STATUS_INVALID_ARGUMENT` when no group is open on
/// this thread.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_op_group_end(rt: *const DfuseRuntime, stream: u64) -> DfuseStatus {
    guard("dfuse_op_group_end", || runtime(rt)?.end_op_group(stream))
}
