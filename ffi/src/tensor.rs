//! Tensors: creating them from host data, reading them back, their metadata, and their
//! reference counts.
//!
//! A tensor handle is a counted reference: every call that returns a new handle gives the
//! caller one reference, `dfuse_tensor_retain` adds one, `dfuse_tensor_release` drops one. A
//! handle used after its last release is `DFUSE_STATUS_INVALID_HANDLE`, never a crash. Sizes and
//! strides are `int64_t` in elements, row-major, like PyTorch's.

use crate::error::{guard, invalid, slice_in, slice_out, write_out, DfuseStatus, Result};
use crate::runtime_registry::{runtime, DfuseRuntime};
use crate::types::{dtype_from, scalar_from, scalar_to, sizes_from, DfuseScalar};
use deferfuse_fusion::ir::{DType, Dims, Op, Scalar};
use deferfuse_runtime::Input;

/// Creates a tensor holding a copy of `nbytes` bytes at `data`: row-major elements of `dtype`
/// (a `DfuseDtype`) with `ndim` sizes at `sizes`. `nbytes` must be exactly numel times the
/// element size. Writes the new handle to `*out` (0 on failure).
///
/// # Safety
/// `data` must be NULL or readable for `nbytes` bytes (NULL only when `nbytes` is 0); `sizes`
/// must be NULL or readable for `ndim` values (NULL only when `ndim` is 0); `out` must be NULL or
/// point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_from_host(
    rt: *const DfuseRuntime,
    data: *const std::ffi::c_void,
    nbytes: usize,
    dtype: u32,
    sizes: *const i64,
    ndim: usize,
    out: *mut u64,
) -> DfuseStatus {
    guard("dfuse_tensor_from_host", || {
        // SAFETY: the caller's contract, for each pointer.
        let (data, sizes) = unsafe {
            write_out(out, "out", 0)?;
            (
                slice_in(data.cast::<u8>(), nbytes, "data")?,
                slice_in(sizes, ndim, "sizes")?,
            )
        };
        let rt = runtime(rt)?;
        let h = rt.from_host(
            data,
            dtype_from(dtype, "dtype")?,
            &sizes_from(sizes, "sizes")?,
        )?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", h) }
    })
}

/// Creates a contiguous tensor of `dtype` and `sizes`, like `torch.empty` (its contents read as
/// zeros; its memory is allocated when first used). Writes the handle to `*out`.
///
/// Sizes whose byte count overflows or exceeds `PTRDIFF_MAX` are `DFUSE_STATUS_INVALID_ARGUMENT`.
/// Memory that cannot be allocated is `DFUSE_STATUS_OUT_OF_MEMORY` from the call that first
/// needs it: an op writing or reading the tensor (in defer mode, the sync point that runs it)
/// or a host read. The runtime stays usable.
///
/// # Safety
/// `sizes` must be NULL or readable for `ndim` values (NULL only when `ndim` is 0); `out` must be
/// NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_empty(
    rt: *const DfuseRuntime,
    dtype: u32,
    sizes: *const i64,
    ndim: usize,
    out: *mut u64,
) -> DfuseStatus {
    guard("dfuse_tensor_empty", || {
        // SAFETY: the caller's contract, for each pointer.
        let sizes = unsafe {
            write_out(out, "out", 0)?;
            slice_in(sizes, ndim, "sizes")?
        };
        let rt = runtime(rt)?;
        let h = rt.empty(dtype_from(dtype, "dtype")?, &sizes_from(sizes, "sizes")?)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", h) }
    })
}

/// Records `torch.full(sizes, value, dtype=dtype)` on `stream` (0 = default) and writes the new
/// handle to `*out`. Like every op, it runs according to the calling thread's mode.
/// Sizes with too many elements are `DFUSE_STATUS_BAD_OP`; memory that cannot be allocated is
/// `DFUSE_STATUS_OUT_OF_MEMORY` (in defer mode, possibly from the sync point that runs it).
///
/// # Safety
/// `sizes` must be NULL or readable for `ndim` values (NULL only when `ndim` is 0); `out` must be
/// NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_full(
    rt: *const DfuseRuntime,
    stream: u64,
    sizes: *const i64,
    ndim: usize,
    value: DfuseScalar,
    dtype: u32,
    out: *mut u64,
) -> DfuseStatus {
    guard("dfuse_tensor_full", || {
        // SAFETY: the caller's contract, for each pointer.
        let sizes = unsafe {
            write_out(out, "out", 0)?;
            slice_in(sizes, ndim, "sizes")?
        };
        let rt = runtime(rt)?;
        let op = Op::Full {
            sizes: Dims::from_vec(sizes_from(sizes, "sizes")?),
            dtype: dtype_from(dtype, "dtype")?,
        };
        let h = rt.op(
            stream,
            op,
            &[Input::Scalar(scalar_from(&value, "value")?)],
            None,
        )?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", h) }
    })
}

/// Copies the tensor (any view) to `dst` as row-major elements, waiting for the work that
/// produces it (a sync point). `nbytes` must be exactly numel times the element size.
///
/// # Safety
/// `dst` must be NULL or writable for `nbytes` bytes (NULL only when `nbytes` is 0).
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_to_host(
    rt: *const DfuseRuntime,
    tensor: u64,
    dst: *mut std::ffi::c_void,
    nbytes: usize,
) -> DfuseStatus {
    guard("dfuse_tensor_to_host", || {
        // SAFETY: the caller's contract.
        let dst = unsafe { slice_out(dst.cast::<u8>(), nbytes, "dst")? };
        runtime(rt)?.to_host(tensor, dst)
    })
}

/// `dfuse_tensor_to_host` for a read whose values decide the size of an op's output (nonzero,
/// boolean-mask indexing, unique): the same copy, counted as
/// `DFUSE_SYNC_REASON_DATA_DEPENDENT_SIZE` instead of `HOST_READ`, so such syncs can be told
/// apart in `DfuseStats.sync_points`.
///
/// # Safety
/// As `dfuse_tensor_to_host`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_to_host_for_size(
    rt: *const DfuseRuntime,
    tensor: u64,
    dst: *mut std::ffi::c_void,
    nbytes: usize,
) -> DfuseStatus {
    guard("dfuse_tensor_to_host_for_size", || {
        // SAFETY: the caller's contract.
        let dst = unsafe { slice_out(dst.cast::<u8>(), nbytes, "dst")? };
        runtime(rt)?.to_host_for_size(tensor, dst)
    })
}

/// An f16's value (IEEE 754 binary16).
fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let frac = f64::from(bits & 0x3ff);
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        0x1f if frac == 0.0 => sign * f64::INFINITY,
        0x1f => f64::NAN,
        e => sign * (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// The scalar one element of `dtype` (native byte order, in `b`) holds.
fn element_scalar(dtype: DType, b: [u8; 8]) -> Scalar {
    let b2 = [b[0], b[1]];
    let b4 = [b[0], b[1], b[2], b[3]];
    match dtype {
        DType::F32 => Scalar::Float(f64::from(f32::from_ne_bytes(b4))),
        DType::F64 => Scalar::Float(f64::from_ne_bytes(b)),
        DType::F16 => Scalar::Float(f16_to_f64(u16::from_ne_bytes(b2))),
        DType::BF16 => Scalar::Float(f64::from(f32::from_bits(
            u32::from(u16::from_ne_bytes(b2)) << 16,
        ))),
        DType::I32 => Scalar::Int(i64::from(i32::from_ne_bytes(b4))),
        DType::I64 => Scalar::Int(i64::from_ne_bytes(b)),
        DType::U8 => Scalar::Int(i64::from(b[0])),
        DType::Bool => Scalar::Bool(b[0] != 0),
    }
}

/// `tensor.item()`: waits for the tensor and writes its one element to `*out` (float dtypes as
/// `DFUSE_SCALAR_KIND_FLOAT`, integers as `INT`, bool as `BOOL`). The tensor must have exactly
/// one element (else `DFUSE_STATUS_INVALID_ARGUMENT`).
///
/// # Safety
/// `out` must be NULL or point to writable memory for a `DfuseScalar`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_item(
    rt: *const DfuseRuntime,
    tensor: u64,
    out: *mut DfuseScalar,
) -> DfuseStatus {
    guard("dfuse_tensor_item", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", scalar_to(Scalar::Int(0)))? };
        let rt = runtime(rt)?;
        let sizes = rt.sizes(tensor)?;
        let numel: usize = sizes.iter().product();
        if numel != 1 {
            return Err(invalid(format!(
                "tensor of shape {:?} has {numel} elements; item needs exactly 1",
                sizes.as_slice()
            )));
        }
        let dtype = rt.dtype(tensor)?;
        let mut b = [0u8; 8];
        rt.to_host(tensor, &mut b[..dtype.size()])?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", scalar_to(element_scalar(dtype, b))) }
    })
}

/// Writes the tensor's number of dims to `*out`.
///
/// # Safety
/// `out` must be NULL or point to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_ndim(
    rt: *const DfuseRuntime,
    tensor: u64,
    out: *mut usize,
) -> DfuseStatus {
    guard("dfuse_tensor_ndim", || {
        let n = runtime(rt)?.sizes(tensor)?.len();
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", n) }
    })
}

/// Copies `values` (one per dim) into the caller's array of `capacity` entries.
///
/// # Safety
/// `dst` must be NULL or writable for `capacity` values.
pub(crate) unsafe fn write_dims(
    dst: *mut i64,
    capacity: usize,
    name: &str,
    values: impl ExactSizeIterator<Item = i64>,
) -> Result<()> {
    let n = values.len();
    if capacity < n {
        return Err(invalid(format!(
            "capacity {capacity} is less than the tensor's {n} dims; size {name} with \
             dfuse_tensor_ndim"
        )));
    }
    // SAFETY: the caller's contract; only the first `n` entries are touched.
    let dst = unsafe { slice_out(dst, n, name)? };
    for (d, v) in dst.iter_mut().zip(values) {
        *d = v;
    }
    Ok(())
}

/// Writes the tensor's sizes to `sizes[0..ndim]`. `capacity` is the array's length and must be
/// at least the tensor's ndim (else `DFUSE_STATUS_INVALID_ARGUMENT`; `sizes` may be NULL for a
/// 0-dim tensor).
///
/// # Safety
/// `sizes` must be NULL or writable for `capacity` values.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_shape(
    rt: *const DfuseRuntime,
    tensor: u64,
    sizes: *mut i64,
    capacity: usize,
) -> DfuseStatus {
    guard("dfuse_tensor_shape", || {
        let s = runtime(rt)?.sizes(tensor)?;
        // SAFETY: the caller's contract.
        unsafe { write_dims(sizes, capacity, "sizes", s.iter().map(|&x| x as i64)) }
    })
}

/// Writes the tensor's strides (in elements) to `strides[0..ndim]`. `capacity` is the array's
/// length and must be at least the tensor's ndim (else `DFUSE_STATUS_INVALID_ARGUMENT`).
///
/// # Safety
/// `strides` must be NULL or writable for `capacity` values.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_strides(
    rt: *const DfuseRuntime,
    tensor: u64,
    strides: *mut i64,
    capacity: usize,
) -> DfuseStatus {
    guard("dfuse_tensor_strides", || {
        let s = runtime(rt)?.strides(tensor)?;
        // SAFETY: the caller's contract.
        unsafe { write_dims(strides, capacity, "strides", s.iter().map(|&x| x as i64)) }
    })
}

/// Writes the tensor's dtype (a `DfuseDtype`) to `*dtype` and its number of dims to `*ndim`,
/// and, when `capacity` (the length of `sizes`) is at least that number, its sizes to
/// `sizes[0..ndim]`; a smaller `capacity` leaves `sizes` untouched and is not an error (read
/// `*ndim` and ask `dfuse_tensor_shape` with a large enough array). One call instead of
/// `dfuse_tensor_dtype` + `dfuse_tensor_ndim` + `dfuse_tensor_shape`: a front end wraps every
/// op's result this way, and each call costs a runtime and a handle lookup.
///
/// # Safety
/// `dtype` and `ndim` must be NULL or writable; `sizes` must be NULL or writable for
/// `capacity` values.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_meta(
    rt: *const DfuseRuntime,
    tensor: u64,
    dtype: *mut u32,
    sizes: *mut i64,
    capacity: usize,
    ndim: *mut usize,
) -> DfuseStatus {
    guard("dfuse_tensor_meta", || {
        let (d, s) = runtime(rt)?.dtype_and_sizes(tensor)?;
        // SAFETY: the caller's contract.
        unsafe {
            write_out(dtype, "dtype", d as u32)?;
            write_out(ndim, "ndim", s.len())?;
            if capacity >= s.len() {
                write_dims(sizes, capacity, "sizes", s.iter().map(|&x| x as i64))?;
            }
        }
        Ok(())
    })
}

/// Writes the tensor's dtype (a `DfuseDtype`) to `*out`.
///
/// # Safety
/// `out` must be NULL or point to a writable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_dtype(
    rt: *const DfuseRuntime,
    tensor: u64,
    out: *mut u32,
) -> DfuseStatus {
    guard("dfuse_tensor_dtype", || {
        let d = runtime(rt)?.dtype(tensor)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", d as u32) }
    })
}

/// Writes where the tensor's buffer is in its life (a `DfuseBufferState`) to `*out`.
///
/// # Safety
/// `out` must be NULL or point to a writable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_state(
    rt: *const DfuseRuntime,
    tensor: u64,
    out: *mut u32,
) -> DfuseStatus {
    guard("dfuse_tensor_state", || {
        let s = runtime(rt)?.state(tensor)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", s as u32) }
    })
}

/// Adds a reference to the tensor handle (one more `dfuse_tensor_release` is then needed).
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_retain(rt: *const DfuseRuntime, tensor: u64) -> DfuseStatus {
    guard("dfuse_tensor_retain", || runtime(rt)?.retain(tensor))
}

/// Drops a reference to the tensor handle; the last release frees the handle (pending work
/// that reads its buffer keeps the buffer alive until it has run).
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_tensor_release(rt: *const DfuseRuntime, tensor: u64) -> DfuseStatus {
    guard("dfuse_tensor_release", || runtime(rt)?.release(tensor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime_registry::{dfuse_runtime_create, dfuse_runtime_destroy};
    use crate::types::DfuseDtype;
    use std::ptr;

    /// Runs `body` with a fresh runtime and a new int64 tensor of shape [2, 3, 4].
    fn with_tensor(body: impl FnOnce(*mut DfuseRuntime, u64)) {
        let mut rt = ptr::null_mut();
        let sizes = [2i64, 3, 4];
        let mut h = 0;
        // SAFETY: valid out-pointers and a sizes array of its stated length.
        unsafe {
            assert_eq!(dfuse_runtime_create(ptr::null(), &mut rt), DfuseStatus::Ok);
            let st = dfuse_tensor_empty(rt, DfuseDtype::I64 as u32, sizes.as_ptr(), 3, &mut h);
            assert_eq!(st, DfuseStatus::Ok);
        }
        body(rt, h);
        // SAFETY: a live runtime.
        unsafe { dfuse_runtime_destroy(rt) };
    }

    #[test]
    fn meta_writes_dtype_ndim_and_sizes_in_one_call() {
        with_tensor(|rt, h| {
            let (mut dt, mut nd, mut s) = (99u32, 0usize, [0i64; 8]);
            // SAFETY: valid out-pointers; s is writable for its length.
            let st = unsafe { dfuse_tensor_meta(rt, h, &mut dt, s.as_mut_ptr(), 8, &mut nd) };
            assert_eq!(st, DfuseStatus::Ok);
            assert_eq!(
                (dt, nd, &s[..3]),
                (DfuseDtype::I64 as u32, 3, &[2i64, 3, 4][..])
            );
        });
    }

    #[test]
    fn meta_with_too_short_an_array_writes_ndim_and_leaves_the_sizes_alone() {
        with_tensor(|rt, h| {
            let (mut dt, mut nd, mut s) = (99u32, 0usize, [-1i64; 2]);
            // SAFETY: valid out-pointers; s is writable for its length.
            let st = unsafe { dfuse_tensor_meta(rt, h, &mut dt, s.as_mut_ptr(), 2, &mut nd) };
            assert_eq!(st, DfuseStatus::Ok);
            assert_eq!((dt, nd, s), (DfuseDtype::I64 as u32, 3, [-1, -1]));
        });
    }

    #[test]
    fn meta_of_a_released_handle_is_an_invalid_handle() {
        with_tensor(|rt, h| {
            let (mut dt, mut nd) = (0u32, 0usize);
            // SAFETY: a live runtime and valid out-pointers; no sizes are asked for.
            unsafe {
                assert_eq!(dfuse_tensor_release(rt, h), DfuseStatus::Ok);
                let st = dfuse_tensor_meta(rt, h, &mut dt, ptr::null_mut(), 0, &mut nd);
                assert_eq!(st, DfuseStatus::InvalidHandle);
            }
        });
    }

    #[test]
    fn half_precision_elements_decode() {
        assert_eq!(f16_to_f64(0x3c00), 1.0);
        assert_eq!(f16_to_f64(0xc000), -2.0);
        assert_eq!(f16_to_f64(0x0001), 2f64.powi(-24));
        assert_eq!(f16_to_f64(0x7bff), 65504.0);
        assert_eq!(f16_to_f64(0xfc00), f64::NEG_INFINITY);
        assert!(f16_to_f64(0x7e00).is_nan());
        let mut b = [0u8; 8];
        b[..2].copy_from_slice(&0x3fc0u16.to_ne_bytes());
        assert_eq!(element_scalar(DType::BF16, b), Scalar::Float(1.5));
    }

    #[test]
    fn elements_decode_to_the_right_kind() {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&(-3i32).to_ne_bytes());
        assert_eq!(element_scalar(DType::I32, b), Scalar::Int(-3));
        b[..4].copy_from_slice(&2.5f32.to_ne_bytes());
        assert_eq!(element_scalar(DType::F32, b), Scalar::Float(2.5));
        assert_eq!(
            element_scalar(DType::U8, [200, 0, 0, 0, 0, 0, 0, 0]),
            Scalar::Int(200)
        );
        assert_eq!(
            element_scalar(DType::Bool, [1, 0, 0, 0, 0, 0, 0, 0]),
            Scalar::Bool(true)
        );
    }
}
