//! Reference views: a layout (sizes, strides, offset) over a flat storage, with PyTorch's view
//! ops written out independently, plus gather/scatter to read and write through a view.

use super::{contiguous_strides, indices, RefTensor};

/// Where a view's elements sit in its storage.
#[derive(Clone, Debug, PartialEq)]
pub struct RefLayout {
    pub sizes: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

fn wrap(d: i64, rank: usize) -> usize {
    let r = rank.max(1) as i64;
    let w = if d < 0 { d + r } else { d };
    assert!((0..r).contains(&w), "dim {d} out of range for rank {rank}");
    w as usize
}

impl RefLayout {
    pub fn contiguous(sizes: &[usize]) -> RefLayout {
        RefLayout {
            sizes: sizes.to_vec(),
            strides: contiguous_strides(sizes),
            offset: 0,
        }
    }

    pub fn rank(&self) -> usize {
        self.sizes.len()
    }

    /// Storage position of every element, in row-major order of the view.
    pub fn positions(&self) -> Vec<usize> {
        indices(&self.sizes)
            .into_iter()
            .map(|i| {
                self.offset
                    + i.iter()
                        .zip(&self.strides)
                        .map(|(a, b)| a * b)
                        .sum::<usize>()
            })
            .collect()
    }

    pub fn is_contiguous(&self) -> bool {
        self.strides == contiguous_strides(&self.sizes) || self.sizes.iter().product::<usize>() <= 1
    }

    pub fn permute(&self, dims: &[usize]) -> RefLayout {
        RefLayout {
            sizes: dims.iter().map(|&d| self.sizes[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        }
    }

    pub fn transpose(&self, a: i64, b: i64) -> RefLayout {
        let mut d: Vec<usize> = (0..self.rank()).collect();
        if self.rank() > 0 {
            d.swap(wrap(a, self.rank()), wrap(b, self.rank()));
        }
        self.permute(&d)
    }

    /// Python slicing `[start:end:step]` along `dim` (bounds clamped, step > 0).
    pub fn slice(&self, dim: i64, start: i64, end: i64, step: i64) -> RefLayout {
        let d = wrap(dim, self.rank());
        let n = self.sizes[d] as i64;
        let clamp = |x: i64| if x < 0 { (x + n).max(0) } else { x.min(n) };
        let (s, e) = (clamp(start), clamp(end));
        let len = if e > s { (e - s + step - 1) / step } else { 0 };
        let mut l = self.clone();
        l.offset += s as usize * self.strides[d];
        l.sizes[d] = len as usize;
        l.strides[d] *= step as usize;
        l
    }

    pub fn select(&self, dim: i64, index: i64) -> RefLayout {
        let d = wrap(dim, self.rank());
        let n = self.sizes[d] as i64;
        let i = if index < 0 { index + n } else { index };
        let mut l = self.clone();
        l.offset += i as usize * self.strides[d];
        l.sizes.remove(d);
        l.strides.remove(d);
        l
    }

    /// `expand`: new leading dims and size-1 dims repeat (stride 0).
    pub fn expand(&self, sizes: &[usize]) -> RefLayout {
        let lead = sizes.len() - self.rank();
        let mut strides = vec![0usize; sizes.len()];
        for i in 0..self.rank() {
            strides[lead + i] = if self.sizes[i] == 1 && sizes[lead + i] != 1 {
                0
            } else {
                self.strides[i]
            };
        }
        RefLayout {
            sizes: sizes.to_vec(),
            strides,
            offset: self.offset,
        }
    }

    pub fn unsqueeze(&self, dim: usize) -> RefLayout {
        let mut l = self.clone();
        l.sizes.insert(dim, 1);
        l.strides.insert(dim, 1);
        l
    }

    /// `squeeze(dim)` (or all size-1 dims with `None`).
    pub fn squeeze(&self, dim: Option<i64>) -> RefLayout {
        let only = dim.map(|d| wrap(d, self.rank()));
        let mut l = RefLayout {
            sizes: vec![],
            strides: vec![],
            offset: self.offset,
        };
        for i in 0..self.rank() {
            let drop = self.sizes[i] == 1 && only.is_none_or(|o| o == i);
            if !drop {
                l.sizes.push(self.sizes[i]);
                l.strides.push(self.strides[i]);
            }
        }
        l
    }

    /// Reads the view's elements from `storage`.
    pub fn gather(&self, storage: &RefTensor) -> RefTensor {
        RefTensor {
            dtype: storage.dtype,
            sizes: self.sizes.clone(),
            data: self
                .positions()
                .into_iter()
                .map(|p| storage.data[p])
                .collect(),
        }
    }

    /// Writes `values` (already of the storage's dtype, in the view's shape) through the view.
    pub fn scatter(&self, storage: &mut RefTensor, values: &RefTensor) {
        assert_eq!(values.sizes, self.sizes);
        assert_eq!(values.dtype, storage.dtype);
        for (p, &v) in self.positions().into_iter().zip(&values.data) {
            storage.data[p] = v;
        }
    }
}

/// A view of a dense tensor's values (`f` maps its contiguous layout to the view's).
pub fn view(t: &RefTensor, f: impl FnOnce(&RefLayout) -> RefLayout) -> RefTensor {
    f(&RefLayout::contiguous(&t.sizes)).gather(t)
}

/// `reshape`: the same values in row-major order under new sizes.
pub fn reshape(t: &RefTensor, sizes: &[usize]) -> RefTensor {
    assert_eq!(super::numel(sizes), t.numel());
    RefTensor {
        dtype: t.dtype,
        sizes: sizes.to_vec(),
        data: t.data.clone(),
    }
}
