//! `argsort(stable=True)`: the int64 positions of a stable sort along one dim. NaN sorts as the
//! largest value (first when descending); -0.0 and 0.0 are equal and keep their order.

use super::elem::{read_f64, read_i64, write_i64};
use super::{for_each_row, View};
use std::cmp::Ordering;

/// Writes into `out` (int64) the argsort of `input` along `dim`.
pub(super) fn run(dim: usize, descending: bool, input: &View, out: &View) {
    if input.dtype.is_float() {
        // f64 holds every float dtype's values exactly.
        sort_rows(
            dim,
            descending,
            input,
            out,
            read_f64,
            |a: &f64, b: &f64| match (a.is_nan(), b.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                _ => a.partial_cmp(b).unwrap_or(Ordering::Equal),
            },
        );
    } else {
        sort_rows(dim, descending, input, out, read_i64, |a: &i64, b: &i64| {
            a.cmp(b)
        });
    }
}

fn sort_rows<K: Copy>(
    dim: usize,
    descending: bool,
    input: &View,
    out: &View,
    read: unsafe fn(deferfuse_fusion::ir::DType, *const u8, isize) -> K,
    cmp: impl Fn(&K, &K) -> Ordering,
) {
    let n = input.sizes[dim];
    let (is, os) = (input.strides[dim], out.strides[dim]);
    let mut row: Vec<(K, i64)> = Vec::with_capacity(n);
    for_each_row(&input.sizes, dim, &[input, out], |_, o| {
        row.clear();
        for j in 0..n as isize {
            // SAFETY: the input view lies inside its buffer.
            row.push((
                unsafe { read(input.dtype, input.base, o[0] + j * is) },
                j as i64,
            ));
        }
        // `sort_by` is stable: equal keys keep their order either way.
        if descending {
            row.sort_by(|a, b| cmp(&b.0, &a.0));
        } else {
            row.sort_by(|a, b| cmp(&a.0, &b.0));
        }
        for (j, (_, i)) in row.iter().enumerate() {
            // SAFETY: the output view lies inside its buffer.
            unsafe { write_i64(out.dtype, out.base, o[1] + j as isize * os, *i) };
        }
    });
}
