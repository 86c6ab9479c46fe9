//! Iteration spaces: how a loop walks the elements of its operands.
//!
//! Dims that every operand walks contiguously are merged ("coalesced") so that most loops run
//! over one long inner dim; the kernel gets the two innermost dims and the executor walks the
//! rest. Merging depends only on strides, so it is done per launch and costs no compile.

use crate::ir::{Dims, Strides};
use smallvec::SmallVec;

/// How an operand steps along the innermost dim; part of a compiled loop's identity because a
/// contiguous f32 operand is loaded four lanes at a time and a broadcast one once per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StrideKind {
    /// Stride 1: vector loads.
    Contig,
    /// Stride 0: one load per row, splatted.
    Bcast,
    /// Any other stride: lane-by-lane loads.
    Strided,
}

impl StrideKind {
    /// The kind of an operand's innermost stride.
    pub fn of(stride: isize) -> StrideKind {
        match stride {
            1 => StrideKind::Contig,
            0 => StrideKind::Bcast,
            _ => StrideKind::Strided,
        }
    }
}

/// A coalesced iteration space shared by several operands (element strides, not bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IterSpace {
    /// Sizes, outermost first; never empty (a scalar loop is `[1]`).
    pub sizes: Dims,
    /// Per operand, one stride per dim of `sizes`.
    pub strides: Vec<Strides>,
    /// How many trailing dims are reduced (0 or 1 after coalescing).
    pub reduced: usize,
}

impl IterSpace {
    /// Builds the space for `sizes`, dropping size-1 dims and merging neighbours that every
    /// operand walks contiguously. The last `reduced` dims are merged only among themselves.
    pub fn coalesce(sizes: &[usize], strides: &[Strides], reduced: usize) -> IterSpace {
        let n_ops = strides.len();
        let boundary = sizes.len() - reduced;
        let mut out_sizes: Dims = SmallVec::new();
        let mut out_strides: Vec<Strides> = vec![SmallVec::new(); n_ops];
        let mut out_reduced = 0;
        let mut group_start = 0;
        for (i, &size) in sizes.iter().enumerate() {
            if i == boundary {
                group_start = out_sizes.len();
            }
            if size == 1 {
                continue;
            }
            let is_reduced = i >= boundary;
            let can_merge = out_sizes.len() > group_start
                && (0..n_ops).all(|o| {
                    let last = *out_strides[o].last().unwrap();
                    last == strides[o][i] * size as isize
                });
            if can_merge {
                *out_sizes.last_mut().unwrap() *= size;
                for o in 0..n_ops {
                    *out_strides[o].last_mut().unwrap() = strides[o][i];
                }
            } else {
                out_sizes.push(size);
                for o in 0..n_ops {
                    out_strides[o].push(strides[o][i]);
                }
                if is_reduced {
                    out_reduced += 1;
                }
            }
        }
        if reduced > 0 && out_reduced == 0 {
            // Every reduced dim had size 1: keep one so the kernel still folds the inner dim.
            out_sizes.push(1);
            for s in &mut out_strides {
                s.push(0);
            }
            out_reduced = 1;
        }
        if out_sizes.len() == out_reduced {
            // Keep an outer dim so the kernel always has (outer, inner).
            out_sizes.insert(0, 1);
            for s in &mut out_strides {
                s.insert(0, 0);
            }
        }
        if out_reduced == 0 && out_sizes.len() == 1 {
            out_sizes.insert(0, 1);
            for s in &mut out_strides {
                s.insert(0, 0);
            }
        }
        IterSpace {
            sizes: out_sizes,
            strides: out_strides,
            reduced: out_reduced,
        }
    }

    /// Number of dims after coalescing.
    pub fn rank(&self) -> usize {
        self.sizes.len()
    }

    /// How operand `operand` steps along the innermost dim.
    pub fn inner_kind(&self, operand: usize) -> StrideKind {
        StrideKind::of(*self.strides[operand].last().unwrap())
    }

    /// Number of elements the loop visits.
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::layout::contiguous_strides;
    use smallvec::smallvec;

    #[test]
    fn contiguous_operands_merge_into_one_row() {
        let s = contiguous_strides(&[4, 5, 6]);
        let it = IterSpace::coalesce(&[4, 5, 6], &[s.clone(), s], 0);
        assert_eq!(it.sizes.as_slice(), &[1, 120]);
        assert_eq!(it.inner_kind(0), StrideKind::Contig);
    }

    #[test]
    fn broadcast_row_keeps_two_dims() {
        let a = contiguous_strides(&[4, 6]);
        let b: Strides = smallvec![0, 1];
        let it = IterSpace::coalesce(&[4, 6], &[a, b], 0);
        assert_eq!(it.sizes.as_slice(), &[4, 6]);
        assert_eq!(it.strides[1].as_slice(), &[0, 1]);
    }

    #[test]
    fn reduced_dims_do_not_merge_with_kept_dims() {
        let a = contiguous_strides(&[4, 6]);
        let out: Strides = smallvec![1, 0];
        let it = IterSpace::coalesce(&[4, 6], &[out, a], 1);
        assert_eq!((it.sizes.as_slice(), it.reduced), (&[4usize, 6][..], 1));
    }

    #[test]
    fn full_reduction_gets_a_unit_outer_dim() {
        let a = contiguous_strides(&[3, 5]);
        let out: Strides = smallvec![0, 0];
        let it = IterSpace::coalesce(&[3, 5], &[out, a], 2);
        assert_eq!((it.sizes.as_slice(), it.reduced), (&[1usize, 15][..], 1));
    }
}
