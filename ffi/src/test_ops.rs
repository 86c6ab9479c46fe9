//! What the crate's unit tests share: recording an op through the C ABI as a C caller would.

use crate::error::DfuseStatus;
use crate::op::{DfuseAttrs, DfuseOpKind, DfuseUnaryOp};
use crate::op_call::dfuse_op;
use crate::runtime_registry::DfuseRuntime;
use crate::types::{DfuseOperand, DfuseOperandKind};

/// Records `exp(x)` on stream 0 into a new tensor whose handle goes to `out`.
///
/// # Safety
/// `rt` is a live runtime.
pub(crate) unsafe fn record_exp(rt: *const DfuseRuntime, x: u64, out: &mut u64) -> DfuseStatus {
    let attrs = DfuseAttrs {
        sub_op: DfuseUnaryOp::Exp as u32,
        // SAFETY: plain C data; zero is every other field's "unset".
        ..unsafe { std::mem::zeroed() }
    };
    let input = DfuseOperand {
        kind: DfuseOperandKind::Tensor as u32,
        tensor: x,
        f: 0.0,
        i: 0,
    };
    // SAFETY: the caller's live runtime; attrs, input and out are valid for the call.
    unsafe { dfuse_op(rt, 0, DfuseOpKind::Unary as u32, &attrs, &input, 1, 0, out) }
}
