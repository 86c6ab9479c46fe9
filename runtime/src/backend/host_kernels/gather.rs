//! `torch.gather`: `out[..i..] = src[..index[..i..]..]` along one dim.

use super::elem::{convert, read_i64};
use super::{for_each_row, out_of_bounds, View};
use crate::error::Result;

/// Checks every element of `index` names one of `size` positions, before anything is written:
/// a bad index leaves the output untouched, as in torch.
pub(super) fn check_indices(op: &str, index: &View, dim: usize, size: usize) -> Result<()> {
    let n = index.sizes[dim];
    let st = index.strides[dim];
    let mut bad = None;
    for_each_row(&index.sizes, dim, &[index], |_, o| {
        if bad.is_some() {
            return;
        }
        for j in 0..n as isize {
            // SAFETY: the index view lies inside its buffer (checked when it was made).
            let v = unsafe { read_i64(index.dtype, index.base, o[0] + j * st) };
            if v < 0 || v as u64 >= size as u64 {
                bad = Some(v);
                return;
            }
        }
    });
    match bad {
        Some(v) => Err(out_of_bounds(op, v, dim, size)),
        None => Ok(()),
    }
}

/// Gathers `src` along `dim` at `index` into `out` (which has the index's shape and the
/// source's dtype).
pub(super) fn run(dim: usize, src: &View, index: &View, out: &View) -> Result<()> {
    check_indices("gather", index, dim, src.sizes[dim])?;
    let n = index.sizes[dim];
    let (is, os, ss) = (index.strides[dim], out.strides[dim], src.strides[dim]);
    for_each_row(&index.sizes, dim, &[index, out, src], |_, o| {
        for j in 0..n as isize {
            // SAFETY: every view lies inside its buffer and the index was checked above, so
            // the source element is one of the source view's.
            unsafe {
                let v = read_i64(index.dtype, index.base, o[0] + j * is) as isize;
                convert(
                    src.dtype,
                    src.base,
                    o[2] + v * ss,
                    out.dtype,
                    out.base,
                    o[1] + j * os,
                );
            }
        }
    });
    Ok(())
}
