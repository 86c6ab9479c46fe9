//! The op entry points: `dfuse_op`, and `dfuse_op_meta`, which also describes the result.
//! Both record through one body; the second saves a front end that wraps every result in a
//! tensor of its own (the PyTorch device) a `dfuse_tensor_meta` call per op.

use crate::error::{guard, read_in, slice_in, slice_out, write_out, DfuseStatus, Result};
use crate::op::{build_op, first_rank, kind_name, DfuseAttrs};
use crate::runtime_registry::{runtime, DfuseRuntime};
use crate::tensor::write_dims;
use crate::types::{operand_from, DfuseOperand};
use deferfuse_fusion::ir::{DType, Dims};
use deferfuse_runtime::Input;

/// Records an op on `stream` (0 = default stream) according to the calling thread's mode.
///
/// `kind` is a `DfuseOpKind`; `attrs` holds its attributes (NULL for kinds without any);
/// `inputs[0..n_inputs]` are its operands. With `out` = 0 the result is a new tensor whose
/// handle is written to `*result` (the caller must release it). With `out` != 0 the result is
/// written into that tensor in place (its shape must match and the result dtype must cast to
/// its dtype), and `*result` is `out` itself, with no new reference.
///
/// An op that is invalid for its inputs fails here with `DFUSE_STATUS_BAD_OP`, in every mode.
/// An unknown `kind`, `sub_op`, dtype or operand kind, NULL `attrs` for a kind that reads them,
/// or `n_dims` > `DFUSE_MAX_REDUCE_DIMS` is `DFUSE_STATUS_INVALID_ARGUMENT`; a stale or foreign
/// input, `out` or `stream` handle is `DFUSE_STATUS_INVALID_HANDLE`; memory that cannot be
/// allocated is `DFUSE_STATUS_OUT_OF_MEMORY` (in defer mode, from the sync point that runs it).
///
/// # Safety
/// `attrs` must be NULL or point to a `DfuseAttrs`; `inputs` must be NULL or readable for
/// `n_inputs` operands (NULL only when `n_inputs` is 0); `result` must be NULL or point to a
/// writable `uint64_t`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dfuse_op(
    rt: *const DfuseRuntime,
    stream: u64,
    kind: u32,
    attrs: *const DfuseAttrs,
    inputs: *const DfuseOperand,
    n_inputs: usize,
    out: u64,
    result: *mut u64,
) -> DfuseStatus {
    guard("dfuse_op", || {
        // SAFETY: the caller's contract, for each pointer.
        let (h, ..) = unsafe { record(rt, stream, kind, attrs, inputs, n_inputs, out, result)? };
        // SAFETY: the caller's contract.
        unsafe { write_out(result, "result", h) }
    })
}

/// `dfuse_op`, and then what `dfuse_tensor_meta` would say of `*result`: its dtype (a
/// `DfuseDtype`) in `*dtype`, its number of dims in `*ndim` and, when `capacity` (the length of
/// `sizes`) is at least that number, its sizes in `sizes[0..ndim]` (a smaller `capacity`
/// leaves `sizes` untouched and is not an error). One call where a front end that wraps each
/// result made two, each with its own runtime and handle lookup. Every pointer is checked
/// before the op is recorded, so a failure leaves `*result` 0 as `dfuse_op`'s does.
///
/// # Safety
/// As `dfuse_op`; `dtype` and `ndim` must be NULL or writable, `sizes` NULL or writable for
/// `capacity` values.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dfuse_op_meta(
    rt: *const DfuseRuntime,
    stream: u64,
    kind: u32,
    attrs: *const DfuseAttrs,
    inputs: *const DfuseOperand,
    n_inputs: usize,
    out: u64,
    result: *mut u64,
    dtype: *mut u32,
    sizes: *mut i64,
    capacity: usize,
    ndim: *mut usize,
) -> DfuseStatus {
    guard("dfuse_op_meta", || {
        // SAFETY: the caller's contract, for each pointer. The description's pointers are
        // checked before the op is recorded, so a bad one records nothing and no write after
        // it can fail.
        unsafe {
            write_out(dtype, "dtype", 0)?;
            write_out(ndim, "ndim", 0)?;
            if capacity > 0 {
                slice_out(sizes, capacity, "sizes")?;
            }
            let (h, d, s) = record(rt, stream, kind, attrs, inputs, n_inputs, out, result)?;
            write_out(result, "result", h)?;
            write_out(dtype, "dtype", d as u32)?;
            write_out(ndim, "ndim", s.len())?;
            if capacity >= s.len() {
                write_dims(sizes, capacity, "sizes", s.iter().map(|&x| x as i64))?;
            }
            Ok(())
        }
    })
}

/// The shared body: checks the pointers, builds the op and records it; the result's handle,
/// dtype and sizes.
///
/// # Safety
/// As `dfuse_op`'s pointers.
#[allow(clippy::too_many_arguments)]
unsafe fn record(
    rt: *const DfuseRuntime,
    stream: u64,
    kind: u32,
    attrs: *const DfuseAttrs,
    inputs: *const DfuseOperand,
    n_inputs: usize,
    out: u64,
    result: *mut u64,
) -> Result<(u64, DType, Dims)> {
    // SAFETY: the caller's contract, for each pointer.
    let (attrs, operands) = unsafe {
        write_out(result, "result", 0)?;
        let a = if attrs.is_null() {
            None
        } else {
            Some(read_in(attrs, "attrs")?)
        };
        (a, slice_in(inputs, n_inputs, "inputs")?)
    };
    let rt = runtime(rt)?;
    // A plain loop: collecting through `Result` cost ~250 instructions per op here.
    let mut inputs = smallvec::SmallVec::<[Input; 4]>::with_capacity(operands.len());
    for (i, o) in operands.iter().enumerate() {
        inputs.push(operand_from(o, i)?);
    }
    let op = build_op(kind, attrs, || first_rank(&rt, &inputs, kind_name(kind)))?;
    rt.op_described(stream, op, &inputs, (out != 0).then_some(out))
}
