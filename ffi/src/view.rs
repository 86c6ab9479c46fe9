//! Views: new tensor handles over the same buffer with another layout, free until read (only a
//! `reshape` that cannot be a view copies). Arguments follow PyTorch (negative dims count from
//! the end); the runtime checks them and reports `DFUSE_STATUS_BAD_OP`.

use crate::error::{guard, invalid, slice_in, write_out, DfuseStatus, Result};
use crate::runtime_registry::{runtime, DfuseRuntime};
use crate::types::sizes_from;
use deferfuse_runtime::View;

/// `dfuse_view`'s `kind`, and what `args` holds for it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseViewKind {
    /// `reshape(args)`: the new sizes, one of which may be -1. Copies (on `stream`) when the
    /// layout cannot be viewed.
    Reshape = 0,
    /// `permute(args)`: one dim per dim of the tensor.
    Permute = 1,
    /// `transpose(args[0], args[1])`.
    Transpose = 2,
    /// `expand(args)`: the new sizes; -1 keeps a size; new leading dims are allowed.
    Expand = 3,
    /// `x[.., start:end:step, ..]`: args are dim, start, end, step (bounds clamp like Python;
    /// step > 0).
    Slice = 4,
    /// `squeeze()` with no args (every size-1 dim), or `squeeze(args[0])`.
    Squeeze = 5,
    /// `unsqueeze(args[0])`.
    Unsqueeze = 6,
    /// `select(args[0], args[1])`: dim and index; drops the dim.
    Select = 7,
}

/// Builds the runtime view for `kind` and its `args`.
pub(crate) fn build_view(kind: u32, args: &[i64]) -> Result<View> {
    let n = args.len();
    let want = |name: &str, count: &str| {
        invalid(format!(
            "view kind {name} ({kind}) takes {count}, got n_args = {n}"
        ))
    };
    Ok(match (kind, args) {
        (0, _) => View::Reshape(args.to_vec()),
        (1, _) => View::Permute(args.to_vec()),
        (2, &[a, b]) => View::Transpose(a, b),
        (2, _) => return Err(want("TRANSPOSE", "2 args (dim0, dim1)")),
        (3, _) => View::Expand(args.to_vec()),
        (4, &[dim, start, end, step]) => View::Slice {
            dim,
            start,
            end,
            step,
        },
        (4, _) => return Err(want("SLICE", "4 args (dim, start, end, step)")),
        (5, &[]) => View::Squeeze(None),
        (5, &[d]) => View::Squeeze(Some(d)),
        (5, _) => return Err(want("SQUEEZE", "0 args (all size-1 dims) or 1 (a dim)")),
        (6, &[d]) => View::Unsqueeze(d),
        (6, _) => return Err(want("UNSQUEEZE", "1 arg (the dim)")),
        (7, &[dim, index]) => View::Select { dim, index },
        (7, _) => return Err(want("SELECT", "2 args (dim, index)")),
        (k, _) => {
            return Err(invalid(format!(
                "kind = {k} is not a DfuseViewKind; expected 0..=7 (RESHAPE, PERMUTE, \
                 TRANSPOSE, EXPAND, SLICE, SQUEEZE, UNSQUEEZE, SELECT)"
            )))
        }
    })
}

/// Makes a view of `tensor` (a `DfuseViewKind` with `args[0..n_args]`) and writes its handle
/// to `*out` (a new reference; 0 on failure). `stream` (0 = default) is used only when a
/// reshape must copy.
///
/// An unknown `kind` or the wrong number of args is `DFUSE_STATUS_INVALID_ARGUMENT`; args the
/// tensor cannot take (a dim or index out of range, a size that does not match, a step <= 0,
/// an element count that overflows) are `DFUSE_STATUS_BAD_OP`.
///
/// # Safety
/// `args` must be NULL or readable for `n_args` values (NULL only when `n_args` is 0); `out`
/// must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_view(
    rt: *const DfuseRuntime,
    stream: u64,
    kind: u32,
    tensor: u64,
    args: *const i64,
    n_args: usize,
    out: *mut u64,
) -> DfuseStatus {
    guard("dfuse_view", || {
        // SAFETY: the caller's contract, for each pointer.
        let args = unsafe {
            write_out(out, "out", 0)?;
            slice_in(args, n_args, "args")?
        };
        let rt = runtime(rt)?;
        let h = rt.view(stream, tensor, &build_view(kind, args)?)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", h) }
    })
}

/// `as_strided(sizes, strides, offset)`: a view with an explicit layout (sizes and strides in
/// elements, `offset` in elements from the start of the buffer), checked to stay inside the
/// tensor's buffer. Writes the new handle to `*out`.
///
/// A layout that reaches past the buffer (also one whose extent overflows), a negative size or
/// offset is `DFUSE_STATUS_INVALID_ARGUMENT`; a negative stride is `DFUSE_STATUS_BAD_OP`.
///
/// # Safety
/// `sizes` and `strides` must be NULL or readable for `ndim` values each (NULL only when `ndim`
/// is 0); `out` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_as_strided(
    rt: *const DfuseRuntime,
    tensor: u64,
    sizes: *const i64,
    strides: *const i64,
    ndim: usize,
    offset: i64,
    out: *mut u64,
) -> DfuseStatus {
    guard("dfuse_as_strided", || {
        // SAFETY: the caller's contract, for each pointer.
        let (sizes, strides) = unsafe {
            write_out(out, "out", 0)?;
            (
                slice_in(sizes, ndim, "sizes")?,
                slice_in(strides, ndim, "strides")?,
            )
        };
        let rt = runtime(rt)?;
        let view = View::AsStrided {
            sizes: sizes_from(sizes, "sizes")?,
            strides: strides
                .iter()
                .map(|&s| {
                    isize::try_from(s).map_err(|_| invalid(format!("stride {s} does not fit")))
                })
                .collect::<Result<_>>()?,
            offset: usize::try_from(offset).map_err(|_| {
                invalid(format!(
                    "offset = {offset} is not valid; offsets must be >= 0"
                ))
            })?,
        };
        let h = rt.view(0, tensor, &view)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", h) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_args_convert() {
        assert_eq!(build_view(0, &[-1, 3]).unwrap(), View::Reshape(vec![-1, 3]));
        assert_eq!(build_view(2, &[0, -1]).unwrap(), View::Transpose(0, -1));
        assert_eq!(
            build_view(4, &[1, 0, 5, 2]).unwrap(),
            View::Slice {
                dim: 1,
                start: 0,
                end: 5,
                step: 2
            }
        );
        assert_eq!(build_view(5, &[]).unwrap(), View::Squeeze(None));
        assert_eq!(build_view(5, &[-1]).unwrap(), View::Squeeze(Some(-1)));
        assert_eq!(
            build_view(7, &[0, 1]).unwrap(),
            View::Select { dim: 0, index: 1 }
        );
    }

    #[test]
    fn wrong_arg_counts_and_kinds_are_invalid_arguments() {
        for (k, args) in [
            (2, &[0][..]),
            (4, &[0, 1, 2]),
            (5, &[0, 1]),
            (6, &[]),
            (7, &[1]),
        ] {
            let e = build_view(k, args).unwrap_err();
            assert_eq!(e.status(), deferfuse_runtime::Status::InvalidArgument);
            assert!(e.to_string().contains("got n_args"), "{e}");
        }
        let e = build_view(8, &[]).unwrap_err();
        assert!(
            e.to_string().contains("kind = 8 is not a DfuseViewKind"),
            "{e}"
        );
    }
}
