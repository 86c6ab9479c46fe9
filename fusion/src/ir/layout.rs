//! Sizes, strides and offsets: a view is a [`Layout`] over a buffer, so view ops only do index
//! math here and never touch data.

use super::error::{OpError, OpResult};
use smallvec::SmallVec;
use std::fmt;

/// Tensor sizes. Six inline dims cover every real model without a heap allocation.
pub type Dims = SmallVec<[usize; 6]>;
/// Element strides; signed so that later work (flip) can use negative strides.
pub type Strides = SmallVec<[isize; 6]>;

/// Formats sizes the way PyTorch prints them, `[2, 3]`, for error messages.
pub fn fmt_dims(d: &[usize]) -> String {
    format!("{d:?}")
}

/// Number of elements of `sizes`, or `None` if it overflows (a user-facing error, not a panic).
pub fn checked_numel(sizes: &[usize]) -> Option<usize> {
    sizes.iter().try_fold(1usize, |acc, &s| acc.checked_mul(s))
}

/// A copy of `s` as inline dims. The common case (at most 6 dims) fills the inline array
/// element by element: `SmallVec::from_slice` calls `memcpy` for a few words, and recording
/// one op copies half a dozen sizes and strides (~85 instructions each that way, ~25 this).
#[inline]
pub(crate) fn dims_from<T: Copy + Default>(s: &[T]) -> SmallVec<[T; 6]> {
    if s.len() > 6 {
        return SmallVec::from_slice(s);
    }
    let buf: [T; 6] = std::array::from_fn(|i| s.get(i).copied().unwrap_or_default());
    SmallVec::from_buf_and_len(buf, s.len())
}

/// Row-major strides of a contiguous tensor.
#[inline]
pub fn contiguous_strides(sizes: &[usize]) -> Strides {
    if sizes.len() <= 6 {
        let mut buf = [1isize; 6];
        let mut acc = 1isize;
        for i in (0..sizes.len()).rev() {
            buf[i] = acc;
            acc *= sizes[i].max(1) as isize;
        }
        return SmallVec::from_buf_and_len(buf, sizes.len());
    }
    let mut strides: Strides = SmallVec::from_elem(1, sizes.len());
    let mut acc = 1isize;
    for i in (0..sizes.len()).rev() {
        strides[i] = acc;
        acc *= sizes[i].max(1) as isize;
    }
    strides
}

/// Normalises a possibly negative dim (`-1` is the last) against `rank`.
pub fn wrap_dim(op: &str, dim: i64, rank: usize) -> OpResult<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(OpError::new(
            op,
            "dim",
            format!("a dim in [{}, {}]", -r, r - 1),
            dim.to_string(),
        )
        .hint("dims count from 0; negative dims count from the end"));
    }
    Ok(d as usize)
}

/// How a tensor's elements sit in its buffer.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Size of each dim.
    pub sizes: Dims,
    /// Step between neighbours of each dim, in elements (0 for broadcast dims).
    pub strides: Strides,
    /// Offset of element `[0, 0, ...]` in elements (not bytes).
    pub offset: usize,
}

impl Clone for Layout {
    /// Copies the dims with [`dims_from`]: the derived clone goes through `SmallVec`'s
    /// element-by-element `extend`, and recording an op clones a few layouts (~700
    /// instructions per op that way).
    #[inline]
    fn clone(&self) -> Layout {
        Layout {
            sizes: dims_from(&self.sizes),
            strides: dims_from(&self.strides),
            offset: self.offset,
        }
    }
}

impl Layout {
    /// A fresh, dense, row-major layout.
    #[inline]
    pub fn contiguous(sizes: &[usize]) -> Layout {
        Layout {
            sizes: dims_from(sizes),
            strides: contiguous_strides(sizes),
            offset: 0,
        }
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.sizes.len()
    }

    /// Number of elements (1 for a 0-dim tensor).
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    /// True when the elements are dense and row-major from `offset`.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1isize;
        for i in (0..self.rank()).rev() {
            if self.sizes[i] != 1 && self.strides[i] != expected {
                return false;
            }
            expected *= self.sizes[i] as isize;
        }
        true
    }

    /// One past the highest element index this layout touches (0 for an empty tensor); used to
    /// check a view stays inside its buffer. Saturates at `usize::MAX`: `as_strided` takes
    /// sizes, strides and offset from the caller, and a sum that wrapped could pass the bounds
    /// check (or, with overflow checks on, panic).
    pub fn extent(&self) -> usize {
        if self.sizes.contains(&0) {
            return 0;
        }
        self.sizes
            .iter()
            .zip(&self.strides)
            .filter(|&(_, &st)| st > 0)
            .try_fold(self.offset, |hi, (&s, &st)| {
                (s - 1)
                    .checked_mul(st as usize)
                    .and_then(|d| hi.checked_add(d))
            })
            .and_then(|hi| hi.checked_add(1))
            .unwrap_or(usize::MAX)
    }

    /// True when two distinct indices can name the same element (an expanded view); writing
    /// through such a view is rejected like PyTorch does.
    pub fn has_overlap(&self) -> bool {
        self.sizes
            .iter()
            .zip(&self.strides)
            .any(|(&s, &st)| s > 1 && st == 0)
    }

    /// `view`/`reshape` without copying, or `None` when the strides make that impossible (the
    /// caller then copies to a contiguous buffer first, like `reshape` does).
    pub fn reshape(&self, new: &[usize]) -> Option<Layout> {
        if self.is_contiguous() {
            let mut l = Layout::contiguous(new);
            l.offset = self.offset;
            return Some(l);
        }
        // General case (PyTorch's computeStride): match groups of old dims that are contiguous
        // with each other against groups of new dims with the same element count.
        let old: Vec<(usize, isize)> = self
            .sizes
            .iter()
            .copied()
            .zip(self.strides.iter().copied())
            .filter(|&(s, _)| s != 1)
            .collect();
        let mut strides: Strides = SmallVec::from_elem(0, new.len());
        let mut oi = 0usize;
        let mut ni = 0usize;
        while ni < new.len() {
            if new[ni] == 1 {
                strides[ni] = 1;
                ni += 1;
                continue;
            }
            if oi >= old.len() {
                return None;
            }
            // Take a chunk of old dims that are mutually contiguous.
            let start = oi;
            let mut chunk = old[oi].0;
            while oi + 1 < old.len() && old[oi].1 == old[oi + 1].1 * old[oi + 1].0 as isize {
                oi += 1;
                chunk *= old[oi].0;
            }
            let inner_stride = old[oi].1;
            oi += 1;
            let _ = start;
            // New dims must tile this chunk exactly.
            let mut prod = 1usize;
            let first_new = ni;
            while ni < new.len() && prod < chunk {
                prod *= new[ni];
                ni += 1;
            }
            if prod != chunk {
                return None;
            }
            let mut st = inner_stride;
            for k in (first_new..ni).rev() {
                strides[k] = st;
                st *= new[k] as isize;
            }
        }
        if oi != old.len() {
            return None;
        }
        Some(Layout {
            sizes: SmallVec::from_slice(new),
            strides,
            offset: self.offset,
        })
    }

    /// Reorders dims; `dims` must already be a validated permutation.
    pub fn permute(&self, dims: &[usize]) -> Layout {
        Layout {
            sizes: dims.iter().map(|&d| self.sizes[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        }
    }

    /// Broadcasts to `sizes` (which must be a valid broadcast target): new leading dims and
    /// size-1 dims get stride 0.
    pub fn expand(&self, sizes: &[usize]) -> Layout {
        let lead = sizes.len() - self.rank();
        let mut strides: Strides = SmallVec::from_elem(0, sizes.len());
        for i in 0..self.rank() {
            strides[lead + i] = if self.sizes[i] == 1 && sizes[lead + i] != 1 {
                0
            } else {
                self.strides[i]
            };
        }
        Layout {
            sizes: SmallVec::from_slice(sizes),
            strides,
            offset: self.offset,
        }
    }

    /// `x[.., start:end:step, ..]` along `dim` (bounds already clamped by the caller).
    pub fn slice(&self, dim: usize, start: usize, len: usize, step: usize) -> Layout {
        let mut l = self.clone();
        l.offset = (self.offset as isize + start as isize * self.strides[dim]) as usize;
        l.sizes[dim] = len;
        l.strides[dim] *= step as isize;
        l
    }

    /// `x.select(dim, index)`: drops `dim`.
    pub fn select(&self, dim: usize, index: usize) -> Layout {
        let mut l = self.clone();
        l.offset = (self.offset as isize + index as isize * self.strides[dim]) as usize;
        l.sizes.remove(dim);
        l.strides.remove(dim);
        l
    }

    /// Inserts a size-1 dim at `dim` (0..=rank).
    pub fn unsqueeze(&self, dim: usize) -> Layout {
        let mut l = self.clone();
        let st = if dim < self.rank() {
            self.strides[dim] * self.sizes[dim] as isize
        } else {
            1
        };
        l.sizes.insert(dim, 1);
        l.strides.insert(dim, st);
        l
    }

    /// Removes the given size-1 dims.
    pub fn squeeze(&self, dims: &[usize]) -> Layout {
        let mut l = Layout {
            sizes: SmallVec::new(),
            strides: SmallVec::new(),
            offset: self.offset,
        };
        for i in 0..self.rank() {
            if !(dims.contains(&i) && self.sizes[i] == 1) {
                l.sizes.push(self.sizes[i]);
                l.strides.push(self.strides[i]);
            }
        }
        l
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.sizes.as_slice())?;
        if !self.is_contiguous() || self.offset != 0 {
            write!(f, "/s{:?}+{}", self.strides.as_slice(), self.offset)?;
        }
        Ok(())
    }
}

/// PyTorch broadcasting of two shapes, or an error naming the op and the operand.
pub fn broadcast_shapes(op: &str, a: &[usize], b: &[usize], operand: &str) -> OpResult<Dims> {
    if a == b || a.is_empty() {
        return Ok(dims_from(b));
    }
    if b.is_empty() {
        return Ok(dims_from(a));
    }
    let rank = a.len().max(b.len());
    let mut out: Dims = dims_from(&[1; 6][..rank.min(6)]);
    out.resize(rank, 1);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(OpError::new(
                op,
                operand,
                format!("a shape broadcastable with {}", fmt_dims(a)),
                fmt_dims(b),
            )
            .hint(format!(
                "dim {i} has size {da} vs {db}; sizes must match or be 1"
            )));
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extent_saturates_instead_of_wrapping() {
        let l = |sizes: &[usize], strides: &[isize], offset: usize| Layout {
            sizes: SmallVec::from_slice(sizes),
            strides: SmallVec::from_slice(strides),
            offset,
        };
        // 4 * 2^62 wraps to 0 in isize: the view would look like it fits in one element.
        assert_eq!(l(&[5], &[1 << 62], 0).extent(), usize::MAX);
        assert_eq!(l(&[2], &[1], usize::MAX).extent(), usize::MAX);
        assert_eq!(
            l(&[2], &[1], isize::MAX as usize).extent(),
            isize::MAX as usize + 2
        );
        assert_eq!(l(&[2, 2], &[1 << 62, 1 << 62], 0).extent(), (1 << 63) + 1);
        assert_eq!(l(&[3, 3], &[1 << 62, 1 << 62], 0).extent(), usize::MAX);
        assert_eq!(l(&[2, 3], &[3, 1], 1).extent(), 7);
        assert_eq!(l(&[0, 3], &[1 << 62, 1], 9).extent(), 0);
    }

    #[test]
    fn transpose_then_reshape_needs_a_copy() {
        let l = Layout::contiguous(&[2, 3]).permute(&[1, 0]);
        assert!(!l.is_contiguous());
        assert!(l.reshape(&[6]).is_none());
    }

    #[test]
    fn reshape_splits_a_strided_dim_without_copy() {
        // Every other column of a [4, 8]: the 4 row-chunks stay separate dims.
        let l = Layout::contiguous(&[4, 8]).slice(1, 0, 4, 2);
        let r = l.reshape(&[4, 2, 2]).expect("viewable");
        assert_eq!(r.strides.as_slice(), &[8, 4, 2]);
    }

    #[test]
    fn expand_gives_zero_strides() {
        let l = Layout::contiguous(&[3, 1]).expand(&[2, 3, 4]);
        assert_eq!(l.strides.as_slice(), &[0, 1, 0]);
        assert!(l.has_overlap());
    }

    #[test]
    fn broadcast_reports_the_bad_dim() {
        let e = broadcast_shapes("add", &[2, 3], &[4], "other").unwrap_err();
        assert!(e.to_string().contains("add: other"), "{e}");
    }
}
