//! Views: new handles over the same buffer with another layout. They cost nothing until
//! something reads them; only `reshape` of a non-viewable layout copies (like PyTorch).

use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::record::Input;
use crate::runtime::{Runtime, Tensor};
use deferfuse_fusion::ir::layout::{checked_numel, fmt_dims, wrap_dim};
use deferfuse_fusion::ir::{Dims, Layout, Op, OpError};
use smallvec::SmallVec;

/// A view op with PyTorch's argument conventions (negative dims count from the end).
#[derive(Clone, Debug, PartialEq)]
pub enum View {
    /// `reshape`/`view`; one size may be -1.
    Reshape(Vec<i64>),
    /// `permute(dims)`: reorders the dims.
    Permute(Vec<i64>),
    /// `transpose(dim0, dim1)`: swaps two dims.
    Transpose(i64, i64),
    /// `expand`; -1 keeps a size; new leading dims are allowed.
    Expand(Vec<i64>),
    /// `x[.., start:end:step, ..]`; bounds are clamped like Python slicing; step > 0.
    Slice {
        /// The dim sliced.
        dim: i64,
        /// The first index taken (negative counts from the end).
        start: i64,
        /// One past the last index taken (negative counts from the end).
        end: i64,
        /// The distance between taken indices.
        step: i64,
    },
    /// `squeeze()` (all size-1 dims) or `squeeze(dim)`.
    Squeeze(Option<i64>),
    /// `unsqueeze(dim)`: inserts a size-1 dim.
    Unsqueeze(i64),
    /// `x.select(dim, index)`: drops `dim`.
    Select {
        /// The dim dropped.
        dim: i64,
        /// The index kept along it (negative counts from the end).
        index: i64,
    },
    /// `as_strided(sizes, strides, offset)`: checked against the buffer.
    AsStrided {
        /// The view's sizes.
        sizes: Vec<usize>,
        /// The view's strides, in elements.
        strides: Vec<isize>,
        /// Where the view's first element is, in elements from the buffer's start.
        offset: usize,
    },
}

impl View {
    fn name(&self) -> &'static str {
        match self {
            View::Reshape(_) => "reshape",
            View::Permute(_) => "permute",
            View::Transpose(..) => "transpose",
            View::Expand(_) => "expand",
            View::Slice { .. } => "slice",
            View::Squeeze(_) => "squeeze",
            View::Unsqueeze(_) => "unsqueeze",
            View::Select { .. } => "select",
            View::AsStrided { .. } => "as_strided",
        }
    }
}

fn infer_reshape(op: &str, numel: usize, sizes: &[i64]) -> Result<Dims> {
    let mut out: Dims = SmallVec::new();
    let mut infer_at = None;
    let mut known = 1usize;
    for (i, &s) in sizes.iter().enumerate() {
        if s == -1 && infer_at.is_none() {
            infer_at = Some(i);
            out.push(1);
        } else if s < 0 {
            return Err(OpError::new(
                op,
                "shape",
                "sizes >= 0 and at most one -1",
                format!("{sizes:?}"),
            )
            .into());
        } else {
            known = known.checked_mul(s as usize).ok_or_else(|| {
                OpError::new(
                    op,
                    "shape",
                    "an element count that fits",
                    format!("{sizes:?}"),
                )
            })?;
            out.push(s as usize);
        }
    }
    let bad = || {
        OpError::new(
            op,
            "shape",
            format!("sizes with {numel} elements"),
            format!("{sizes:?}"),
        )
        .into()
    };
    match infer_at {
        Some(i) => {
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(bad());
            }
            out[i] = numel / known;
        }
        None if known != numel => return Err(bad()),
        None => {}
    }
    Ok(out)
}

impl Runtime {
    /// Makes a view of tensor `h`. `stream` is used only if `reshape` must copy.
    pub fn view(&self, stream: Handle, h: Handle, v: &View) -> Result<Handle> {
        let t = self.tensor(h)?;
        let l = &t.layout;
        let op = v.name();
        let rank = l.rank();
        let layout = match v {
            View::Reshape(sizes) => {
                let new = infer_reshape(op, l.numel(), sizes)?;
                match l.reshape(&new) {
                    Some(nl) => nl,
                    None => {
                        let c = self.op(stream, Op::Copy, &[Input::Tensor(h)], None)?;
                        let r = self.view(stream, c, v);
                        self.release(c)?;
                        return r;
                    }
                }
            }
            View::Permute(dims) => {
                if dims.len() != rank {
                    return Err(OpError::new(
                        op,
                        "dims",
                        format!("{rank} dims"),
                        format!("{dims:?}"),
                    )
                    .into());
                }
                let d: Vec<usize> = dims
                    .iter()
                    .map(|&d| wrap_dim(op, d, rank))
                    .collect::<std::result::Result<_, _>>()?;
                let mut seen = vec![false; rank];
                for &x in &d {
                    if std::mem::replace(&mut seen[x], true) {
                        return Err(OpError::new(
                            op,
                            "dims",
                            "a permutation (each dim once)",
                            format!("{dims:?}"),
                        )
                        .into());
                    }
                }
                l.permute(&d)
            }
            View::Transpose(a, b) => {
                let (a, b) = (wrap_dim(op, *a, rank)?, wrap_dim(op, *b, rank)?);
                let mut d: Vec<usize> = (0..rank).collect();
                if rank > 0 {
                    d.swap(a, b);
                }
                l.permute(&d)
            }
            View::Expand(sizes) => {
                if sizes.len() < rank {
                    return Err(OpError::new(
                        op,
                        "sizes",
                        format!("at least {rank} sizes"),
                        format!("{sizes:?}"),
                    )
                    .into());
                }
                let lead = sizes.len() - rank;
                let mut target: Dims = SmallVec::new();
                for (i, &s) in sizes.iter().enumerate() {
                    let cur = if i >= lead {
                        Some(l.sizes[i - lead])
                    } else {
                        None
                    };
                    let v = match (s, cur) {
                        (-1, Some(c)) => c,
                        (s, _) if s < 0 => {
                            return Err(OpError::new(
                                op,
                                "sizes",
                                "sizes >= 0 (or -1 for existing dims)",
                                format!("{sizes:?}"),
                            )
                            .into())
                        }
                        (s, Some(c)) if c != 1 && c != s as usize => {
                            return Err(OpError::new(
                                op,
                                "sizes",
                                format!("size {c} or any size where the tensor has 1"),
                                format!("{s} at dim {i}"),
                            )
                            .hint(format!("tensor shape is {}", fmt_dims(&l.sizes)))
                            .into())
                        }
                        (s, _) => s as usize,
                    };
                    target.push(v);
                }
                checked_numel(&target).ok_or_else(|| {
                    OpError::new(
                        op,
                        "sizes",
                        "an element count that fits",
                        format!("{sizes:?}"),
                    )
                })?;
                l.expand(&target)
            }
            View::Slice {
                dim,
                start,
                end,
                step,
            } => {
                let d = wrap_dim(op, *dim, rank)?;
                if *step <= 0 {
                    return Err(OpError::new(op, "step", "a step > 0", step.to_string()).into());
                }
                let n = l.sizes[d] as i64;
                let clamp = |x: i64| if x < 0 { (x + n).max(0) } else { x.min(n) };
                let (s, e) = (clamp(*start), clamp(*end));
                let len = if e > s {
                    ((e - s) + step - 1) / step
                } else {
                    0
                };
                l.slice(d, s as usize, len as usize, *step as usize)
            }
            View::Squeeze(None) => l.squeeze(&(0..rank).collect::<Vec<_>>()),
            View::Squeeze(Some(d)) => l.squeeze(&[wrap_dim(op, *d, rank)?]),
            View::Unsqueeze(d) => {
                let r = rank as i64 + 1;
                let dd = if *d < 0 { d + r } else { *d };
                if !(0..r).contains(&dd) {
                    return Err(OpError::new(
                        op,
                        "dim",
                        format!("a dim in [{}, {}]", -r, r - 1),
                        d.to_string(),
                    )
                    .into());
                }
                l.unsqueeze(dd as usize)
            }
            View::Select { dim, index } => {
                if rank == 0 {
                    return Err(OpError::new(
                        op,
                        "input 0",
                        "a tensor with at least 1 dim",
                        "a 0-dim tensor",
                    )
                    .into());
                }
                let d = wrap_dim(op, *dim, rank)?;
                let n = l.sizes[d] as i64;
                let i = if *index < 0 { index + n } else { *index };
                if !(0..n).contains(&i) {
                    return Err(OpError::new(
                        op,
                        "index",
                        format!("an index in [{}, {}]", -n, n - 1),
                        index.to_string(),
                    )
                    .into());
                }
                l.select(d, i as usize)
            }
            View::AsStrided {
                sizes,
                strides,
                offset,
            } => {
                if sizes.len() != strides.len() || strides.iter().any(|&s| s < 0) {
                    return Err(OpError::new(
                        op,
                        "strides",
                        "one stride >= 0 per size",
                        format!("{strides:?}"),
                    )
                    .into());
                }
                checked_numel(sizes).ok_or_else(|| {
                    OpError::new(
                        op,
                        "sizes",
                        "an element count that fits",
                        format!("{sizes:?}"),
                    )
                })?;
                Layout {
                    sizes: SmallVec::from_slice(sizes),
                    strides: SmallVec::from_slice(strides),
                    offset: *offset,
                }
            }
        };
        let need = layout.extent().checked_mul(t.dtype.size());
        if need.is_none_or(|n| n > t.buffer.len) {
            return Err(Error::InvalidArgument(format!(
                "{op}: the view {} would reach past its buffer of {} bytes; check sizes, strides and offset",
                layout, t.buffer.len
            )));
        }
        self.tensors.insert(Tensor { layout, ..t })
    }
}
