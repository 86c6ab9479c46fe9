//! The dims a loop kernel does not walk itself: a kernel call covers the last two dims of its
//! iteration space (rows of a row length), and the host steps through the others, one call
//! per index.
//!
//! Convolutions' window copies and their gradients' window adds are rank 4-6 with rows of
//! 8-32 elements, so a call covers a few hundred elements and the host's step between calls
//! counts: computing each index's offsets afresh (a division and a remainder per dim) was ~4%
//! of resnet18's training step. [`Walk`] steps them as an odometer instead. Where a call would
//! still cover few elements (rows of 2-4 windows of a small map: ~25 ns of host step per call
//! for 4-16 elements), [`with_longer_rows`] gives the kernel a longer dim as its rows: resnet18's
//! layer 3 and 4 window copies 439 -> 152 and 762 -> 208 us walked naturally.

use super::OperandList;
use deferfuse_fusion::IterSpace;
use smallvec::SmallVec;

/// Fewest elements a kernel call should cover before [`with_longer_rows`] picks another row
/// dim: below it the host's step between calls (~25 ns) outweighs the call's work.
const MIN_CALL_ELEMS: usize = 256;

/// An elementwise space whose kernel calls would cover fewer than [`MIN_CALL_ELEMS`] elements,
/// with its longest walked dim moved next to the inner one to be the kernel's rows (the other
/// dims keep their order), or None when no dim is longer than the rows already are. An
/// elementwise loop may visit its elements in any order; a reduction's rows may not move.
pub(super) fn with_longer_rows(iter: &IterSpace) -> Option<IterSpace> {
    let r = iter.rank();
    if iter.reduced != 0 || r < 3 || iter.sizes[r - 2] * iter.sizes[r - 1] >= MIN_CALL_ELEMS {
        return None;
    }
    let longest = (0..r - 2).max_by_key(|&d| (iter.sizes[d], d))?;
    if iter.sizes[longest] <= iter.sizes[r - 2] {
        return None;
    }
    let order: SmallVec<[usize; 8]> = (0..r - 1)
        .filter(|&d| d != longest)
        .chain([longest, r - 1])
        .collect();
    Some(IterSpace {
        sizes: order.iter().map(|&d| iter.sizes[d]).collect(),
        strides: iter
            .strides
            .iter()
            .map(|s| order.iter().map(|&d| s[d]).collect())
            .collect(),
        reduced: 0,
    })
}

/// Per operand, the byte offset of index `o` of the dims a kernel does not walk (all but the
/// last two of `iter`); `elem` are the operands' element sizes.
pub(super) fn walked_offsets(iter: &IterSpace, elem: &[isize], mut o: usize) -> OperandList<isize> {
    let mut offsets: OperandList<isize> = SmallVec::from_elem(0, elem.len());
    for k in (0..iter.rank() - 2).rev() {
        let i = (o % iter.sizes[k]) as isize;
        o /= iter.sizes[k];
        for (j, off) in offsets.iter_mut().enumerate() {
            *off += i * iter.strides[j][k] * elem[j];
        }
    }
    offsets
}

/// An index of the walked dims (all but the last two of an iteration space) with its
/// operands' byte offsets, stepped in row-major order.
pub(super) struct Walk<'a> {
    iter: &'a IterSpace,
    elem: &'a [isize],
    index: SmallVec<[usize; 8]>,
    /// Per operand, the byte offset of the current index.
    pub(super) offsets: OperandList<isize>,
}

impl<'a> Walk<'a> {
    /// At walked index `o` (row-major over the walked dims).
    pub(super) fn at(iter: &'a IterSpace, elem: &'a [isize], o: usize) -> Walk<'a> {
        let walked = iter.rank() - 2;
        let mut index: SmallVec<[usize; 8]> = SmallVec::from_elem(0, walked);
        let mut rest = o;
        for k in (0..walked).rev() {
            index[k] = rest % iter.sizes[k];
            rest /= iter.sizes[k];
        }
        Walk {
            iter,
            elem,
            index,
            offsets: walked_offsets(iter, elem, o),
        }
    }

    /// Steps to the next index: the last walked dim advances, carrying into the ones before
    /// it as it wraps. Past the last index it wraps to the first.
    pub(super) fn step(&mut self) {
        for k in (0..self.index.len()).rev() {
            let (iter, elem) = (self.iter, self.elem);
            self.index[k] += 1;
            let wrapped = self.index[k] == iter.sizes[k];
            let by = if wrapped {
                1 - iter.sizes[k] as isize
            } else {
                1
            };
            for (j, off) in self.offsets.iter_mut().enumerate() {
                *off += by * iter.strides[j][k] * elem[j];
            }
            if !wrapped {
                return;
            }
            self.index[k] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(sizes: &[usize], reduced: usize) -> IterSpace {
        let strides: SmallVec<[isize; 8]> = (0..sizes.len())
            .map(|d| sizes[d + 1..].iter().product::<usize>() as isize)
            .collect();
        IterSpace {
            sizes: sizes.iter().copied().collect(),
            strides: vec![
                strides.iter().copied().collect(),
                strides.iter().map(|s| -s).collect(),
            ],
            reduced,
        }
    }

    #[test]
    fn short_rows_take_the_longest_walked_dim_as_rows() {
        let longer = with_longer_rows(&space(&[8, 128, 3, 3, 4, 4], 0)).unwrap();
        assert_eq!(longer.sizes.as_slice(), &[8, 3, 3, 4, 128, 4]);
        let s = &space(&[8, 128, 3, 3, 4, 4], 0).strides;
        for (op, strides) in longer.strides.iter().enumerate() {
            let want: Vec<isize> = [0, 2, 3, 4, 1, 5].iter().map(|&d| s[op][d]).collect();
            assert_eq!(strides.as_slice(), want.as_slice(), "operand {op}");
        }
    }

    #[test]
    fn long_rows_reductions_and_no_longer_dim_keep_the_space() {
        assert!(
            with_longer_rows(&space(&[8, 64, 16, 16], 0)).is_none(),
            "256 a call"
        );
        assert!(
            with_longer_rows(&space(&[64, 4, 4], 1)).is_none(),
            "a reduction"
        );
        assert!(
            with_longer_rows(&space(&[3, 9, 4], 0)).is_none(),
            "no longer dim"
        );
        assert!(
            with_longer_rows(&space(&[4, 4], 0)).is_none(),
            "nothing walked"
        );
    }

    #[test]
    fn stepping_visits_the_offsets_of_every_index_in_order() {
        // Two operands over [3, 2, 4, 5] (the last two dims are the kernel's), one of them
        // broadcast along dim 1 and reversed along dim 0.
        let iter = IterSpace {
            sizes: [3, 2, 4, 5].into_iter().collect(),
            strides: vec![
                [40, 20, 5, 1].into_iter().collect(),
                [-7, 0, 5, 1].into_iter().collect(),
            ],
            reduced: 0,
        };
        let elem = [4isize, 2];
        let mut walk = Walk::at(&iter, &elem, 0);
        for o in 0..6 {
            assert_eq!(walk.offsets, walked_offsets(&iter, &elem, o), "index {o}");
            walk.step();
        }
        assert_eq!(
            walk.offsets,
            walked_offsets(&iter, &elem, 0),
            "wraps to the first"
        );
        let mut walk = Walk::at(&iter, &elem, 3);
        walk.step();
        assert_eq!(
            walk.offsets,
            walked_offsets(&iter, &elem, 4),
            "from the middle"
        );
    }
}
