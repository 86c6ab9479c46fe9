//! How a part's view sits in a whole-program module's flat array of its buffer: read as a
//! slice and reshape when dense, plus a transpose when it is a permuted dense block, a gather
//! by computed indices otherwise; written back as a functional update of the array.

use super::hlo::{Elem, Func, Ty, Val};
use super::stage;
use deferfuse_fusion::TensorRef;

/// How a view's present dims sit in its buffer.
pub enum Walk {
    /// Row-major and dense: a slice of the flat array.
    Dense,
    /// Dense after permuting its dims: walking dims `order` (outermost first) is row-major.
    Permuted(Vec<usize>),
    /// Anything else: element indices are computed.
    Strided,
}

fn row_major(sizes: &[usize], strides: &[isize], order: &[usize]) -> bool {
    let mut step = 1isize;
    for &k in order.iter().rev() {
        if strides[k] != step {
            return false;
        }
        step *= sizes[k] as isize;
    }
    true
}

fn walk_of(sizes: &[usize], strides: &[isize]) -> Walk {
    let natural: Vec<usize> = (0..sizes.len()).collect();
    if row_major(sizes, strides, &natural) {
        return Walk::Dense;
    }
    let mut order = natural;
    order.sort_by_key(|&k| std::cmp::Reverse(strides[k]));
    if row_major(sizes, strides, &order) {
        Walk::Permuted(order)
    } else {
        Walk::Strided
    }
}

/// The flat index of every element of a view: `offset + sum(i_k * strides[k])`.
pub fn indices(f: &mut Func, sizes: &[usize], strides: &[isize], offset: usize) -> Val {
    let ty = Ty::new(Elem::I64, sizes);
    let mut acc = f.iconst(offset as i64, ty.clone());
    for (k, &st) in strides.iter().enumerate() {
        let i = f.iota(k, ty.clone());
        let s = f.iconst(st as i64, ty.clone());
        let d = f.ew("multiply", &[&i, &s]);
        acc = f.ew("add", &[&acc, &d]);
    }
    acc
}

/// A view as a part stages it: its present dims' sizes and strides, and its offset.
pub struct View {
    pub sizes: Vec<usize>,
    pub strides: Vec<isize>,
    pub offset: usize,
    /// It steps along an empty dim: it has no elements (see `stage::walk`), whatever the
    /// sizes of its present dims.
    pub empty: bool,
}

impl View {
    pub fn of(p: &stage::Staging, j: usize, t: &TensorRef) -> View {
        let o = &p.sig.operands[j];
        let dims: Vec<usize> = (0..o.map.len()).filter(|&d| o.present[d]).collect();
        View {
            sizes: dims.iter().map(|&d| p.valid[o.map[d]]).collect(),
            strides: dims.iter().map(|&d| p.strides[j][d]).collect(),
            offset: t.layout.offset,
            empty: o
                .map
                .iter()
                .zip(&p.strides[j])
                .any(|(&d, &st)| p.valid[d] == 0 && st != 0),
        }
    }

    /// Tensor `t`'s view as its layout gives it (a kernel part, which has no staging), less
    /// the dims that do not move through memory (size 1, or broadcast with stride 0); also
    /// the positions of the dims kept.
    pub fn of_layout(t: &TensorRef) -> (View, Vec<usize>) {
        let l = &t.layout;
        let kept: Vec<usize> = (0..l.rank())
            .filter(|&d| l.sizes[d] != 1 && l.strides[d] != 0)
            .collect();
        let view = View {
            sizes: kept.iter().map(|&d| l.sizes[d]).collect(),
            strides: kept.iter().map(|&d| l.strides[d]).collect(),
            offset: l.offset,
            empty: l.numel() == 0,
        };
        (view, kept)
    }

    pub fn numel(&self) -> usize {
        if self.empty {
            0
        } else {
            self.sizes.iter().product()
        }
    }

    /// The view read from the flat array `buf`.
    pub fn read(&self, f: &mut Func, buf: &Val) -> Val {
        let n = self.numel();
        if n == 0 {
            return f.fconst(0.0, Ty::new(buf.ty.elem, &self.sizes));
        }
        let whole = self.offset == 0 && n == buf.ty.dims[0];
        let block = |f: &mut Func| {
            if whole {
                buf.clone()
            } else {
                f.slice(buf, self.offset, self.offset + n)
            }
        };
        match walk_of(&self.sizes, &self.strides) {
            Walk::Dense => {
                let b = block(f);
                f.reshape(&b, &self.sizes)
            }
            Walk::Permuted(order) => {
                let b = block(f);
                let dims: Vec<usize> = order.iter().map(|&k| self.sizes[k]).collect();
                let r = f.reshape(&b, &dims);
                let mut back = vec![0; order.len()];
                for (pos, &k) in order.iter().enumerate() {
                    back[k] = pos;
                }
                f.transpose(&r, &back)
            }
            Walk::Strided => {
                let idx = indices(f, &self.sizes, &self.strides, self.offset);
                f.gather_1d(buf, &idx)
            }
        }
    }

    /// Whether writing the view replaces every element of a buffer of `n` elements.
    pub fn covers(&self, n: usize) -> bool {
        n > 0 && self.offset == 0 && self.numel() == n && !matches!(self.walk(), Walk::Strided)
    }

    pub fn walk(&self) -> Walk {
        walk_of(&self.sizes, &self.strides)
    }

    /// `v` (the view's values) as a dense run of the buffer, in buffer order, when the view is
    /// a dense block.
    pub fn as_run(&self, f: &mut Func, v: &Val) -> Option<Val> {
        let n = self.numel();
        match self.walk() {
            Walk::Dense => Some(f.reshape(v, &[n])),
            Walk::Permuted(order) => {
                let t = f.transpose(v, &order);
                Some(f.reshape(&t, &[n]))
            }
            Walk::Strided => None,
        }
    }

    /// The flat array `old` with the view's elements replaced by `v`.
    pub fn write(&self, f: &mut Func, old: &Val, v: &Val) -> Val {
        if self.numel() == 0 {
            return old.clone();
        }
        match self.as_run(f, v) {
            Some(run) => f.update_slice_1d(old, &run, self.offset),
            None => {
                let idx = indices(f, &self.sizes, &self.strides, self.offset);
                f.scatter_1d(old, &idx, v, None)
            }
        }
    }
}
