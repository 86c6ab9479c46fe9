//! Op groups: one host-level op (an ATen op such as `layer_norm` or AdamW's `lerp_`) that the
//! caller records as several runtime ops runs in strict mode as that op's own fused program(s),
//! not as one program per recorded piece.
//!
//! Strict mode's contract is "each op its own program, launched asynchronously". For a PyTorch
//! backend the op is the ATen op: PyTorch's CPU kernel for `layer_norm` is one pass over the
//! rows, while its recorded pieces (mean, subtract, variance, rsqrt, scale, shift) run one by
//! one would each be a pass over memory and a launch. So the device opens a group around each
//! such kernel: inside it, the calling thread's strict ops are deferred, and the group's end
//! plans and launches them like a defer-mode flush of just those ops (intermediates the kernel
//! dropped are never written). Debug and defer mode are left as they are: debug keeps its
//! per-piece checks and waits, and defer already fuses across ops.

use crate::error::Result;
use crate::handle::Handle;
use crate::mode::{self, Mode};
use crate::runtime::Runtime;
use crate::stream::Stream;

impl Runtime {
    /// Opens an op group on the calling thread: until the matching [`Runtime::end_op_group`],
    /// the ops it records in strict mode are deferred. Groups nest; only the outermost end
    /// runs the ops.
    pub fn begin_op_group(&self) {
        mode::enter_group(self.id)
    }

    /// Closes the calling thread's innermost op group. When that was the outermost one and
    /// the thread is not in defer mode, the ops deferred on `stream` (0: the default stream)
    /// run now: planned and fused like a flush, launched like a strict op (not a sync point,
    /// nothing waits). Recording or launch errors are reported here, as strict mode reports
    /// them at the op. An error also when no group is open on this thread.
    pub fn end_op_group(&self, stream: Handle) -> Result<()> {
        if !mode::leave_group(self.id)? || self.mode() == Mode::Defer {
            return Ok(());
        }
        let mut slot = None;
        let s = self.stream_ref(stream, &mut slot)?;
        self.run_op_group(s)
    }

    /// Runs the ops an outermost op group, just closed on a thread not in defer mode,
    /// deferred on `s`.
    pub(crate) fn run_op_group(&self, s: &Stream) -> Result<()> {
        self.exec.flush_op_group(s, &self.spares)?;
        if self.mode() == Mode::Debug {
            // Only reached when the mode changed to debug inside the group: debug waits.
            s.synchronize()?;
        }
        Ok(())
    }
}
