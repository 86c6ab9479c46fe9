//! Reduction geometry: which dims a reduction folds, where its result goes over the input's
//! dims, and the iteration space that walks it. Shared by lowering, the planner's row kernels
//! and the runtime's recording (which copies an input whose reduced dims cannot be walked as
//! one strided dim).

use crate::ir::layout::wrap_dim;
use crate::ir::{Dims, Layout, Strides};
use crate::iter::IterSpace;
use smallvec::SmallVec;

/// Dims of `rank` a reduction folds (`dims` empty means all), sorted and deduplicated. A 0-dim
/// tensor's dim 0 (or -1), which PyTorch accepts (`x.sum(0)`, `softmax(x, -1)`), names the
/// tensor itself: no dim to fold, the result is its one element.
pub fn reduced_dims(dims: &[usize], rank: usize) -> Dims {
    let mut r: Dims = if dims.is_empty() {
        (0..rank).collect()
    } else {
        dims.iter()
            .map(|&d| wrap_dim("reduce", d as i64, rank).unwrap_or(d))
            .filter(|&d| d < rank)
            .collect()
    };
    r.sort_unstable();
    r.dedup();
    r
}

/// Strides over the reduce input's dims of a reduction output (`keepdim` or not): kept dims
/// take the output's strides, reduced dims 0.
pub(crate) fn reduce_out_strides(
    out: &Layout,
    rank: usize,
    dims: &[usize],
    keepdim: bool,
) -> Strides {
    let red = reduced_dims(dims, rank);
    let mut j = 0;
    (0..rank)
        .map(|d| {
            if red.contains(&d) {
                if keepdim {
                    j += 1;
                }
                0
            } else {
                j += 1;
                out.strides[j - 1]
            }
        })
        .collect()
}

/// The iteration space of a reduction over `dims` of `sizes`, for operands given by their
/// strides over those dims: kept dims first, reduced dims last (merged into one when possible).
pub(crate) fn reduce_space_for(sizes: &[usize], dims: &[usize], strides: &[Strides]) -> IterSpace {
    let rank = sizes.len();
    let red = reduced_dims(dims, rank);
    let order: Vec<usize> = (0..rank)
        .filter(|d| !red.contains(d))
        .chain(red.iter().copied())
        .collect();
    let mut s: Dims = order.iter().map(|&d| sizes[d]).collect();
    // A trailing unit dim makes a reduction over nothing (a 0-dim input) still one inner dim.
    s.push(1);
    // With no element to read (`x.sum()` of a [5, 0] tensor), where the reduced dims point does
    // not matter: zero strides make them one dim, so no copy is needed and each output (if
    // any) gets the fold's identity.
    let empty = sizes.contains(&0);
    let st: Vec<Strides> = strides
        .iter()
        .map(|x| {
            let mut v: Strides = order
                .iter()
                .map(|&d| if empty && red.contains(&d) { 0 } else { x[d] })
                .collect();
            v.push(0);
            v
        })
        .collect();
    IterSpace::coalesce(&s, &st, red.len() + 1)
}

/// The iteration space of a reduction of `input` into `output` over `dims`.
pub(crate) fn reduce_space(
    input: &Layout,
    output: &Layout,
    dims: &[usize],
    keepdim: bool,
) -> IterSpace {
    let out = reduce_out_strides(output, input.rank(), dims, keepdim);
    reduce_space_for(&input.sizes, dims, &[input.strides.clone(), out])
}

/// Most elements a reduced dim may have for [`short_reduced_dim`].
pub const SHORT_REDUCTION_MAX: usize = 8;

/// Fewest kept elements for [`short_reduced_dim`]: below it the rows' overhead is negligible.
const SHORT_REDUCTION_MIN_KEPT: usize = 16;

/// The one dim a reduction of `input` over `dims` folds, when it has 2 to
/// [`SHORT_REDUCTION_MAX`] elements and many kept elements: such a reduction is better
/// recorded as a chain of element-wise adds of its slices (`0 + x[.., 0, ..] + x[.., 1, ..]`)
/// than as a row kernel, whose rows would be that short. Grouped-query attention's backward
/// sums each key/value head's gradient over the 2 query heads sharing it: as rows of 2 it took
/// ~270 us per 65K outputs, 5% of Llama's step.
pub fn short_reduced_dim(input: &Layout, dims: &[usize]) -> Option<usize> {
    let red = reduced_dims(dims, input.rank());
    let [d] = red.as_slice() else { return None };
    let n = input.sizes[*d];
    let kept = input.sizes.iter().product::<usize>() / n.max(1);
    ((2..=SHORT_REDUCTION_MAX).contains(&n) && kept >= SHORT_REDUCTION_MIN_KEPT).then_some(*d)
}

/// The trailing and leading dims of a reduction of `input` over `dims` that folds leading dims
/// `0..a` and trailing dims `b..rank` with kept dims between them, when the runtime would
/// otherwise copy the input (see [`reduce_needs_copy`]) and the trailing dims alone can be
/// walked in place. Batch norm's statistics over `{0, 2, 3}` are one: reduced over the
/// trailing dims first (each sample's channel a row), then over the leading dims (a few values
/// per kept element, summed in place), no transposing copy of the whole input is made.
pub fn trailing_then_leading(input: &Layout, dims: &[usize]) -> Option<(Dims, Dims)> {
    let rank = input.rank();
    let red = reduced_dims(dims, rank);
    let a = (0..rank).take_while(|d| red.contains(d)).count();
    let b = rank - (0..rank).rev().take_while(|d| red.contains(d)).count();
    let split = a > 0 && b < rank && a < b && red.len() == a + (rank - b);
    let trailing: Dims = (b..rank).collect();
    (split && reduce_needs_copy(input, dims) && !reduce_needs_copy(input, &trailing))
        .then(|| (trailing, (0..a).collect()))
}

/// True when the reduced dims of `input` cannot be walked as one strided dim, so the runtime
/// must first copy the input into a buffer with the reduced dims last.
pub fn reduce_needs_copy(input: &Layout, dims: &[usize]) -> bool {
    let zero: Strides = SmallVec::from_elem(0, input.rank());
    reduce_space_for(&input.sizes, dims, &[input.strides.clone(), zero]).reduced > 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reduction_over_leading_and_trailing_dims_splits_trailing_first() {
        let x = Layout::contiguous(&[4, 16, 64, 64]);
        let (trailing, leading) = trailing_then_leading(&x, &[0, 2, 3]).unwrap();
        assert_eq!(
            (trailing.as_slice(), leading.as_slice()),
            (&[2, 3][..], &[0][..])
        );
        let (trailing, leading) = trailing_then_leading(&x, &[1, 0, 3]).unwrap();
        assert_eq!(
            (trailing.as_slice(), leading.as_slice()),
            (&[3][..], &[0, 1][..])
        );
    }

    #[test]
    fn reductions_walked_in_place_or_with_a_reduced_dim_between_kept_ones_do_not_split() {
        let x = Layout::contiguous(&[4, 16, 64, 64]);
        for dims in [
            &[2, 3][..],
            &[0][..],
            &[0, 1][..],
            &[1, 3][..],
            &[0, 2][..],
            &[][..],
        ] {
            assert_eq!(trailing_then_leading(&x, dims), None, "{dims:?}");
        }
    }
}
