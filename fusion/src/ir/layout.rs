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

    /// True when no element index is in both `self` and `other` (two views of one buffer):
    /// then a loop may write one while it reads or writes the other. Exact for views with the
    /// same sizes and strides (the pieces `cat` and `stack` write, interleaved columns), by
    /// the index ranges otherwise; `false` whenever that cannot be shown.
    pub fn disjoint(&self, other: &Layout) -> bool {
        if self.numel() == 0 || other.numel() == 0 {
            return true;
        }
        let (a, b) = (self.index_range(), other.index_range());
        if a.1 < b.0 || b.1 < a.0 {
            return true;
        }
        if self.sizes != other.sizes || self.strides != other.strides {
            return false;
        }
        // Same steps: they share an element iff the offsets differ by sum(c_k * stride_k)
        // for some |c_k| < size_k. Outermost step first; `reach` bounds what the rest add.
        let mut steps: SmallVec<[(i128, i128); 6]> = self
            .sizes
            .iter()
            .zip(&self.strides)
            .filter(|&(&s, &st)| s > 1 && st != 0)
            .map(|(&s, &st)| ((st as i128).abs(), s as i128 - 1))
            .collect();
        steps.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
        let mut budget = 256;
        !offset_reachable(
            other.offset as i128 - self.offset as i128,
            &steps,
            &mut budget,
        )
    }

    /// The lowest and highest element index the (non-empty) layout touches.
    fn index_range(&self) -> (i128, i128) {
        let mut lo = self.offset as i128;
        let mut hi = lo;
        for (&s, &st) in self.sizes.iter().zip(&self.strides) {
            let d = (s as i128 - 1) * st as i128;
            if d < 0 {
                lo += d;
            } else {
                hi += d;
            }
        }
        (lo, hi)
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

/// True when `delta = sum(c_k * step_k)` for integers `|c_k| <= max_k` over `steps` (pairs
/// `(step_k, max_k)`, largest step first). Each step's coefficient is bounded by what the smaller
/// steps can still add, so nested strides try one or two values per dim; past `budget` tries
/// the answer is `true` (not shown disjoint).
fn offset_reachable(delta: i128, steps: &[(i128, i128)], budget: &mut u32) -> bool {
    let Some((&(step, max), rest)) = steps.split_first() else {
        return delta == 0;
    };
    let reach: i128 = rest.iter().map(|&(st, m)| st * m).sum();
    let lo = (delta - reach).div_euclid(step) + i128::from((delta - reach).rem_euclid(step) != 0);
    let (lo, hi) = (lo.max(-max), (delta + reach).div_euclid(step).min(max));
    for c in lo..=hi {
        if *budget == 0 {
            return true;
        }
        *budget -= 1;
        if offset_reachable(delta - c * step, rest, budget) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strided(sizes: &[usize], strides: &[isize], offset: usize) -> Layout {
        Layout {
            sizes: SmallVec::from_slice(sizes),
            strides: SmallVec::from_slice(strides),
            offset,
        }
    }

    #[test]
    fn the_pieces_of_a_cat_along_any_dim_are_disjoint() {
        let whole = Layout::contiguous(&[16, 512]);
        let piece = |k: usize| whole.slice(1, k * 128, 128, 1);
        assert!(piece(0).disjoint(&piece(1)));
        assert!(piece(3).disjoint(&piece(1)));
        let rows = Layout::contiguous(&[64, 16, 128]);
        assert!(rows.select(0, 5).disjoint(&rows.select(0, 6)));
        assert!(rows.select(0, 63).disjoint(&rows.select(0, 0)));
    }

    #[test]
    fn interleaved_columns_are_disjoint_and_shifted_windows_are_not() {
        let x = Layout::contiguous(&[4, 8]);
        assert!(x.slice(1, 0, 4, 2).disjoint(&x.slice(1, 1, 4, 2)));
        assert!(!x.slice(1, 0, 4, 2).disjoint(&x.slice(1, 2, 3, 2)));
        assert!(!x.slice(1, 0, 4, 1).disjoint(&x.slice(1, 2, 4, 1)));
        assert!(!x.disjoint(&x));
    }

    #[test]
    fn views_that_share_an_element_are_not_disjoint() {
        // Row 1 of a [4, 8] and column 3: element [1, 3].
        let x = Layout::contiguous(&[4, 8]);
        assert!(!x.select(0, 1).disjoint(&x.select(1, 3)));
        // Same steps, offsets 9 apart: [1, 1] of one is [0, 0] of the other.
        assert!(!strided(&[3, 3], &[8, 1], 0).disjoint(&strided(&[3, 3], &[8, 1], 9)));
        // A broadcast read of one element inside a written row.
        assert!(!strided(&[4], &[1], 8).disjoint(&strided(&[4], &[0], 10)));
        assert!(strided(&[4], &[1], 8).disjoint(&strided(&[4], &[0], 12)));
    }

    #[test]
    fn views_with_steps_that_do_not_nest_are_decided_exactly_or_not_claimed() {
        // Steps 3 and 2 over the same sizes: offsets 1 apart meet (3 - 2 = 1).
        let a = strided(&[5, 5], &[3, 2], 0);
        assert!(!a.disjoint(&strided(&[5, 5], &[3, 2], 1)));
        // Even steps never reach an odd offset difference.
        let e = strided(&[5, 5], &[4, 2], 0);
        assert!(e.disjoint(&strided(&[5, 5], &[4, 2], 1)));
        assert!(strided(&[0, 3], &[3, 1], 0).disjoint(&e));
    }

    /// Every element index of `l`.
    fn indices(l: &Layout) -> Vec<i128> {
        let mut out = vec![l.offset as i128];
        for (&s, &st) in l.sizes.iter().zip(&l.strides) {
            out = (0..s as i128)
                .flat_map(|i| out.iter().map(move |&o| o + i * st as i128))
                .collect();
        }
        out
    }

    #[test]
    fn disjoint_agrees_with_the_element_sets_of_small_views() {
        let mut checked = 0;
        for sizes in [[2, 3], [3, 3], [4, 2], [1, 5]] {
            for strides in [[3, 1], [5, 1], [4, 2], [3, 2], [1, 4], [0, 1], [6, 3]] {
                let a = strided(&sizes, &strides, 10);
                let ia = indices(&a);
                for offset in 0..24 {
                    for other_sizes in [sizes, [2, 2]] {
                        let b = strided(&other_sizes, &strides, offset);
                        let meet = indices(&b).iter().any(|i| ia.contains(i));
                        if meet {
                            assert!(!a.disjoint(&b), "{a:?} {b:?} share an element");
                        } else if other_sizes == sizes {
                            assert!(a.disjoint(&b), "{a:?} {b:?}: exact for equal steps");
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 4 * 7 * 24 * 2);
    }

    #[test]
    fn extent_saturates_instead_of_wrapping() {
        let l = strided;
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
