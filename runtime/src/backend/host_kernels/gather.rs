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
    // Every element is checked, so the walk may go along any dim: the longest, so that each
    // row's loop does the work (along a gather's dim of 1, every row was one element).
    let walk = (0..sizes.len()).max_by_key(|&d| sizes[d]).unwrap_or(dim);
    let n = sizes[walk] as isize;
    let (st, ib) = (index.strides[walk], index.base);
    let mut bad = None;
    with_index_reader!(index.dtype, |read| for_each_row(
        &sizes,
        walk,
        &[index],
        |_, o| {
            if bad.is_some() {
                return;
            }
            // The row's first bad value, if any: a branch-free scan, then a search only in a
            // row that has one (the index read typed once, not per element).
            let (st, ib, at) = (st, ib, o[0]);
            let out_of_range = |j: isize| read(ib, at + j * st) as u64 >= size as u64;
            if (0..n).fold(false, |any, j| any | out_of_range(j)) {
                bad = (0..n)
                    .find(|&j| out_of_range(j))
                    .map(|j| read(ib, at + j * st) as i64);
            }
        }
    ));
    match bad {
        Some(v) => Err(out_of_bounds(op, v, dim, size)),
        None => Ok(()),
    }
}

/// Runs `kernel::<T>(dim, src, index, out, read)` with `T` as wide as the source's elements
/// (their bits moved as one `T`) and `read` the index's typed reader.
macro_rules! by_width {
    ($kernel:ident, $dim:expr, $src:expr, $index:expr, $out:expr) => {
        with_index_reader!($index.dtype, |read| match $src.dtype.size() {
            8 => $kernel::<u64>($dim, $src, $index, $out, read),
            4 => $kernel::<u32>($dim, $src, $index, $out, read),
            2 => $kernel::<u16>($dim, $src, $index, $out, read),
            _ => $kernel::<u8>($dim, $src, $index, $out, read),
        })
    };
}

/// Gathers `src` along `dim` at `index` into `out` (which has the index's shape and the
/// source's dtype).
pub(super) fn run(dim: usize, src: &View, index: &View, out: &View) -> Result<()> {
    check_indices("gather", index, dim, src.sizes[dim])?;
    if let Some(last) = rows_of_one_index(dim, index, &[src, out]) {
        match whole_blocks(dim, src, index, out) {
            Some([src, index, out]) => gather_rows(dim, dim + 1, &src, &index, &out),
            None => gather_rows(dim, last, src, index, out),
        }
        return Ok(());
    }
    if src.dtype == out.dtype {
        let last = index.sizes.len() - 1;
        if dim == last && one_index_row(dim, index) {
            by_width!(gather_one_row, dim, src, index, out);
        } else {
            by_width!(gather_walk, dim, src, index, out);
        }
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

/// True when every row along `dim` takes the same index values: the index is expanded over
/// every other dim (`index_select` and `flip` reach the kernel so).
fn one_index_row(dim: usize, index: &View) -> bool {
    (0..index.sizes.len()).all(|d| d == dim || index.strides[d] == 0 || index.sizes[d] == 1)
}

/// [`gather_walk`] along the last dim when every row takes one index row: its source offsets
/// are read once, and a row that reverses its source (`flip`) is read forwards and written
/// backwards, which the compiler vectorizes (`[16, 3, 224, 224].flip(3)` 9.2 -> 1.9-2.3 ms,
/// CPU eager 1.4-1.8; it read the index per element).
fn gather_one_row<T: Copy>(
    dim: usize,
    src: &View,
    index: &View,
    out: &View,
    read: impl Fn(*const u8, isize) -> isize,
) {
    let n = index.sizes[dim];
    let (is, os, ss) = (index.strides[dim], out.strides[dim], src.strides[dim]);
    let from: Vec<isize> = (0..n as isize)
        .map(|j| read(index.base, index.offset + j * is) * ss)
        .collect();
    let reversed = os == 1 && ss == 1 && from.iter().rev().copied().eq(0..n as isize);
    for_each_row(&index.sizes, dim, &[out, src], |_, o| {
        // SAFETY: every view lies inside its buffer and the index was checked, so each source
        // element is one of the source view's; with `reversed`, both rows are n contiguous
        // elements, and the output shares no memory with the source (see `Dst`).
        unsafe {
            let (to, row) = (
                (out.base as *mut T).offset(o[0]),
                (src.base as *const T).offset(o[1]),
            );
            if reversed {
                let to = std::slice::from_raw_parts_mut(to, n);
                let row = std::slice::from_raw_parts(row, n);
                for (t, &v) in to.iter_mut().rev().zip(row) {
                    *t = v;
                }
            } else {
                // The stride in a local of the call, as in `gather_walk`.
                let out_step = os;
                for (j, &f) in from.iter().enumerate() {
                    *to.offset(j as isize * out_step) = *row.offset(f);
                }
            }
        }
    });
}

/// The views with the dims after `dim` merged into one, when each row there takes one index
/// value (index stride 0) and the source and output hold those dims contiguously with one
/// dtype: `gather_rows` then copies one block per index value instead of one row (`[16, 64,
/// 32, 32].flip(1)`: 32,768 rows of 32 floats -> 1,024 blocks of 1,024, 0.82 -> 0.3-0.4 ms).
fn whole_blocks(dim: usize, src: &View, index: &View, out: &View) -> Option<[View; 3]> {
    let rank = index.sizes.len();
    if dim + 2 > rank || src.dtype != out.dtype {
        return None;
    }
    if !(dim + 1..rank).all(|d| index.strides[d] == 0)
        || !src.is_dense_from(dim + 1)
        || !out.is_dense_from(dim + 1)
    {
        return None;
    }
    let block: usize = index.sizes[dim + 1..].iter().product();
    let merged = |v: &View, inner: isize| View {
        base: v.base,
        dtype: v.dtype,
        sizes: v.sizes[..=dim].iter().copied().chain([block]).collect(),
        strides: v.strides[..=dim].iter().copied().chain([inner]).collect(),
        offset: v.offset,
    };
    Some([merged(src, 1), merged(index, 0), merged(out, 1)])
}

/// The element walk for a source and output of one dtype: each element's bits moved as one
/// `T` (the dtype's width). `convert`'s dtype dispatch per element was most of a gather along
/// the last dim (bilinear interpolation's forward: 4 ns an element). It walks rows along the
/// gathered dim, or along the index's last dim when that is longer ([`walks_last`]), each
/// position then reading at its own index along `dim`.
fn gather_walk<T: Copy>(
    dim: usize,
    src: &View,
    index: &View,
    out: &View,
    read: impl Fn(*const u8, isize) -> isize,
) {
    if walks_last(dim, index) {
        walk_rows::<T, true>(dim, src, index, out, read)
    } else {
        walk_rows::<T, false>(dim, src, index, out, read)
    }
}

/// [`gather_walk`]'s loop, along the last dim (`ACROSS`) or along `dim`, where the source
/// moves by the index's values only: a constant, so that loop carries no step of its own (as a
/// run-time zero it cost 10-20%).
#[inline(always)]
fn walk_rows<T: Copy, const ACROSS: bool>(
    dim: usize,
    src: &View,
    index: &View,
    out: &View,
    read: impl Fn(*const u8, isize) -> isize,
) {
    let walk = if ACROSS { index.sizes.len() - 1 } else { dim };
    let n = index.sizes[walk] as isize;
    let (is, os, ss) = (index.strides[walk], out.strides[walk], src.strides[dim]);
    let sl = if ACROSS { src.strides[walk] } else { 0 };
    let (ib, ob, sb) = (index.base, out.base as *mut T, src.base as *const T);
    for_each_row(&index.sizes, walk, &[index, out, src], |idx, o| {
        // Pointers and strides copied into the call's locals: read through the closure's
        // captures, every element reloaded them after its store, which might have changed
        // them (2.8 ns an element for a gather within a plane).
        let (is, os, ss, ib, ob, sb) = (is, os, ss, ib, ob, sb);
        // The source row at index 0 along `dim`: the walk's offset counts the index's own
        // position along it (0 when walking `dim`).
        let (iv, ov, row) = (o[0], o[1], o[2] - idx[dim] as isize * ss);
        for j in 0..n {
            // SAFETY: as the walk in `run`: the index was checked, so the source element is
            // one of the source view's; `T` is the views' element width.
            unsafe {
                let v = read(ib, iv + j * is);
                let at = if ACROSS {
                    row + v * ss + j * sl
                } else {
                    row + v * ss
                };
                *ob.offset(ov + j * os) = *sb.offset(at);
            }
        }
    });
}

/// True when a gather along `dim` is better walked along the index's last dim: `dim` is not
/// the last, and the last is longer than `dim` (nll_loss2d's pick of one class per pixel,
/// `[N, 1, H, W]` from `[N, C, H, W]`: walked along dim 1, every row was one element, 15 ns
/// each).
fn walks_last(dim: usize, index: &View) -> bool {
    let last = index.sizes.len() - 1;
    dim != last && index.sizes[last] > index.sizes[dim]
}

/// Gather one row at a time: `out[.., :] = src[..index[.., 0].., :]`, a memcpy per row when
/// both rows are contiguous and of one dtype.
fn gather_rows(dim: usize, last: usize, src: &View, index: &View, out: &View) {
    let n = index.sizes[last];
    let ss = src.strides[dim];
    let (sl, ol) = (src.strides[last], out.strides[last]);
    let es = src.dtype.size() as isize;
    let contiguous = sl == 1 && ol == 1 && src.dtype == out.dtype;
    if contiguous && dim == 0 && last == 1 {
        return gather_table_rows(src, index, out);
    }
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

/// Rows ahead of the copy whose source lines are prefetched.
const PREFETCH_ROWS: isize = 8;

/// [`gather_rows`] of a table's rows (`out[i, :] = src[index[i], :]`, embedding's forward):
/// the rows are random, so each is a run of cache misses, and copying one at a time waited
/// out every one (81,920 rows of 64 floats from a 100,000-row table: 11.3 ms, CPU eager 3.8).
/// The lines of the row `PREFETCH_ROWS` ahead are requested before each copy, so the misses
/// overlap.
fn gather_table_rows(src: &View, index: &View, out: &View) {
    let (rows, n) = (index.sizes[0] as isize, index.sizes[1]);
    let es = src.dtype.size() as isize;
    let bytes = n * es as usize;
    // SAFETY (both closures): i < rows, the index was checked, and every view lies inside its
    // buffer, so each row is one of the source's (or output's) rows of n contiguous elements.
    let source_row = |i: isize| unsafe {
        let v = read_i64(index.dtype, index.base, index.offset + i * index.strides[0]) as isize;
        src.base.offset((src.offset + v * src.strides[0]) * es) as *const u8
    };
    let out_row = |i: isize| unsafe { out.base.offset((out.offset + i * out.strides[0]) * es) };
    for i in 0..rows {
        if i + PREFETCH_ROWS < rows {
            prefetch(source_row(i + PREFETCH_ROWS), bytes);
        }
        // SAFETY: see above; the output shares no memory with the source (see `Dst`).
        unsafe { std::ptr::copy_nonoverlapping(source_row(i), out_row(i), bytes) };
    }
}

/// Asks for the cache lines of `bytes` bytes at `p` (a hint: it reads nothing, faults nothing).
fn prefetch(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch of any address is harmless; wrapping_add computes it safely.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(line) as *const i8,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}
