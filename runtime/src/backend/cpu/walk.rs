//! The dims a loop kernel does not walk itself: a kernel call covers the last two dims of its
//! iteration space (rows of a row length), and the host steps through the others, one call
//! per index.
//!
//! Convolutions' window copies and their gradients' window adds are rank 4-6 with rows of
//! 8-32 elements, so a call covers a few hundred elements and the host's step between calls
//! counts: computing each index's offsets afresh (a division and a remainder per dim) was ~4%
//! of resnet18's training step. [`Walk`] steps them as an odometer instead.

use super::OperandList;
use deferfuse_fusion::IterSpace;
use smallvec::SmallVec;

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
