//! `torch.gather`: `out[..i..] = src[..index[..i..]..]` along one dim.

use super::elem::{convert, read_i64, with_index_reader};
use super::{for_each_row, out_of_bounds, View};
use crate::error::Result;
use smallvec::SmallVec;

/// Checks every element of `index` names one of `size` positions, before anything is written:
/// a bad index leaves the output untouched, as in torch.
pub(super) fn check_indices(op: &str, index: &View, dim: usize, size: usize) -> Result<()> {
    // An expanded dim (stride 0) repeats the same values: each is checked once.
    let sizes: SmallVec<[usize; 6]> = index
        .sizes
        .iter()
        .zip(&index.strides)
        .map(|(&n, &st)| if st == 0 { n.min(1) } else { n })
        .collect();
    let n = sizes[dim];
    let st = index.strides[dim];
    let mut bad = None;
    for_each_row(&sizes, dim, &[index], |_, o| {
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
    if let Some(last) = rows_of_one_index(dim, index, &[src, out]) {
        gather_rows(dim, last, src, index, out);
        return Ok(());
    }
    if src.dtype == out.dtype {
        with_index_reader!(index.dtype, |read| match src.dtype.size() {
            8 => gather_same::<u64>(dim, src, index, out, read),
            4 => gather_same::<u32>(dim, src, index, out, read),
            2 => gather_same::<u16>(dim, src, index, out, read),
            _ => gather_same::<u8>(dim, src, index, out, read),
        });
        return Ok(());
    }
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

/// The last dim, when every row along it takes one index value: the index is expanded along
/// it (stride 0) and it is not the indexed dim. Embedding's forward and backward and
/// `index_select`/`index_add` reach the kernels in this form (an index of rows expanded over
/// the row's width), so a row is read or combined with one index read instead of one per
/// element.
pub(super) fn rows_of_one_index(dim: usize, index: &View, others: &[&View]) -> Option<usize> {
    let last = index.sizes.len() - 1;
    let rows = dim != last && index.strides[last] == 0;
    let same_width = others.iter().all(|v| v.sizes.len() == index.sizes.len());
    (rows && same_width).then_some(last)
}

/// The element walk for a source and output of one dtype: each element's bits moved as one
/// `T` (the dtype's width). `convert`'s dtype dispatch per element was most of a gather along
/// the last dim (bilinear interpolation's forward: 4 ns an element).
fn gather_same<T: Copy>(
    dim: usize,
    src: &View,
    index: &View,
    out: &View,
    read: impl Fn(*const u8, isize) -> isize,
) {
    let n = index.sizes[dim] as isize;
    let (is, os, ss) = (index.strides[dim], out.strides[dim], src.strides[dim]);
    for_each_row(&index.sizes, dim, &[index, out, src], |_, o| {
        for j in 0..n {
            // SAFETY: as the walk in `run`: the index was checked, so the source element is
            // one of the source view's; `T` is the views' element width.
            unsafe {
                let v = read(index.base, o[0] + j * is);
                *(out.base as *mut T).offset(o[1] + j * os) =
                    *(src.base as *const T).offset(o[2] + v * ss);
            }
        }
    });
}

/// Gather one row at a time: `out[.., :] = src[..index[.., 0].., :]`, a memcpy per row when
/// both rows are contiguous and of one dtype.
fn gather_rows(dim: usize, last: usize, src: &View, index: &View, out: &View) {
    let n = index.sizes[last];
    let ss = src.strides[dim];
    let (sl, ol) = (src.strides[last], out.strides[last]);
    let es = src.dtype.size() as isize;
    let contiguous = sl == 1 && ol == 1 && src.dtype == out.dtype;
    for_each_row(&index.sizes, last, &[index, out, src], |idx, o| {
        // SAFETY: every view lies inside its buffer and the index was checked, so the source
        // row is one of the source view's.
        unsafe {
            let v = read_i64(index.dtype, index.base, o[0]) as isize;
            let from = o[2] + (v - idx[dim] as isize) * ss;
            if contiguous {
                std::ptr::copy_nonoverlapping(
                    src.base.offset(from * es),
                    out.base.offset(o[1] * es),
                    n * es as usize,
                );
            } else {
                for j in 0..n as isize {
                    convert(
                        src.dtype,
                        src.base,
                        from + j * sl,
                        out.dtype,
                        out.base,
                        o[1] + j * ol,
                    );
                }
            }
        }
    });
}
