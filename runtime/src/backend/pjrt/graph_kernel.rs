//! Gather and scatter inside a whole-program module, so a training step's loss check,
//! embedding lookups and their backward do not cut its program in three (each used to run as
//! a host routine between two programs, with a download and an upload).
//!
//! Both become one XLA gather or scatter over the flat array of the indexed operand, at flat
//! positions computed from the index (`flat_positions`). A bad index cannot raise inside XLA,
//! so each part also computes its bounds check (`Check`): whether any index is outside its dim,
//! and the first bad value in the order the host routine checks them (rows along `dim`, the
//! other dims outermost, row-major). The module returns the checks as one extra i64 result;
//! the program reads it after the launch, and the outputs computed from a bad index carry the
//! host routine's error to their next use, so none of their values reaches the host
//! (`graph_program`).
//!
//! Depthwise convolutions are lowered by `graph_depthwise`; they read no index and have no
//! check.

use super::graph_depthwise;
use super::hlo::{Elem, Func, Ty, Val};
use deferfuse_fusion::ir::{DType, KernelOp, ScatterReduce};
use deferfuse_fusion::plan::KernelsInRegion;

/// The kernel ops this backend lowers into whole programs. Sum, amax and amin give the host
/// routine's values whatever order XLA combines duplicates in (sums up to rounding, which the
/// suites' cross-mode tolerance covers); assign (the last duplicate wins), prod and mean stay
/// host routines. Depthwise convolutions give the host routine's values up to the order of
/// their sums.
pub const LOWERED: KernelsInRegion = KernelsInRegion {
    gather: true,
    scatter: &[ScatterReduce::Sum, ScatterReduce::Amax, ScatterReduce::Amin],
    depthwise: true,
};

/// A part's bounds check: the op and dim it names in its error, and the size indices must be
/// below.
#[derive(Clone, Debug)]
pub struct Check {
    pub op: &'static str,
    pub dim: usize,
    pub size: usize,
    /// In a bucketed module, `k` when the dim's size is `k * batch` (the error names the
    /// launch's valid size, not the padded one); else 0.
    pub per_batch: usize,
}

impl Check {
    /// The size the error names at a launch of batch `n`.
    pub fn size_at(&self, n: usize) -> usize {
        match self.per_batch {
            0 => self.size,
            k => k * n,
        }
    }
}

/// The valid part of a kernel part's operands in a bucketed module (`graph_bucket`): padded
/// index elements are left out of the bounds check, gather nothing, and scatter nothing.
pub struct Valid {
    /// For each dim of the index tensor, its valid size (an i64 scalar) when it is padded.
    pub idx: Vec<Option<Val>>,
    /// The batch coefficient and valid size of the indexed operand's indexed dim, when it is
    /// padded: an index must be below the valid size.
    pub size: Option<(usize, Val)>,
}

/// Which dim of its operand kernel `k` indexes (a depthwise convolution's: its batch dim, the
/// one a bucketed module pads).
pub fn indexed_dim(k: &KernelOp) -> usize {
    match k {
        KernelOp::Gather { dim } | KernelOp::Scatter { dim, .. } => *dim,
        KernelOp::Depthwise(_) => 0,
        other => unreachable!("{} is not in LOWERED", other.name()),
    }
}

/// Whether each element of index `idx` is a valid one: every padded dim's position below its
/// valid size. `None` when nothing is padded.
fn valid_mask(f: &mut Func, idx: &Val, valid: Option<&Valid>) -> Option<Val> {
    let mut keep: Option<Val> = None;
    for (d, n) in valid?.idx.iter().enumerate() {
        let Some(n) = n else { continue };
        let ty = Ty::new(Elem::I64, &idx.ty.dims);
        let i = f.iota(d, ty.clone());
        let nb = f.broadcast(n, &ty.dims, &[]);
        let inside = f.compare("LT", &i, &nb);
        keep = Some(match keep {
            None => inside,
            Some(k) => f.ew("and", &[&k, &inside]),
        });
    }
    keep
}

/// Two i64s per check in the module's check result: 1 when an index is bad, and the first bad
/// value.
pub const CHECK_WORDS: usize = 2;

/// A lowered kernel part: its result and the bounds check its values depend on.
pub struct Lowered {
    pub result: Val,
    /// The check, and its `[bad, first bad value]` (an i64 `[2]`); `None` for a part that
    /// reads no index (a depthwise convolution).
    pub check: Option<(Check, Val)>,
}

/// The host routines see a 0-dim tensor as one element of a 1-dim one (see
/// `host_kernels::View`); so does this lowering.
fn at_least_1d(f: &mut Func, v: &Val) -> Val {
    if v.ty.dims.is_empty() {
        f.reshape(v, &[1])
    } else {
        v.clone()
    }
}

/// Row-major strides of `sizes`.
fn row_major_strides(sizes: &[usize]) -> Vec<usize> {
    let mut st = vec![1; sizes.len()];
    for k in (0..sizes.len().saturating_sub(1)).rev() {
        st[k] = st[k + 1] * sizes[k + 1];
    }
    st
}

/// The flat position in an array of `of` (row-major) of every element of an index of `sizes`:
/// its own coordinates, with `idx` (clamped in range; a bad index fails the launch anyway) in
/// dim `dim`.
fn flat_positions(f: &mut Func, idx: &Val, dim: usize, of: &[usize]) -> Val {
    let ty = idx.ty.clone();
    let st = row_major_strides(of);
    let mut acc = f.iconst(0, ty.clone());
    for (k, &s) in st.iter().enumerate() {
        let coord = if k == dim {
            let lo = f.iconst(0, ty.clone());
            let hi = f.iconst(of[dim] as i64 - 1, ty.clone());
            f.op("clamp", &[&lo, idx, &hi], "", ty.clone())
        } else {
            f.iota(k, ty.clone())
        };
        let s = f.iconst(s as i64, ty.clone());
        let term = f.ew("multiply", &[&coord, &s]);
        acc = f.ew("add", &[&acc, &term]);
    }
    acc
}

/// `[bad, first bad value]` of `idx` (i64) against `size` along `dim` (the valid size
/// from `valid` when that dim is padded), "first" in the host routine's order; padded index
/// elements (`keep` false) are never bad.
fn bounds_flag(
    f: &mut Func,
    idx: &Val,
    dim: usize,
    size: usize,
    valid: Option<&Valid>,
    keep: Option<&Val>,
) -> Val {
    let ty = idx.ty.clone();
    let zero = f.iconst(0, ty.clone());
    let n = match valid.and_then(|v| v.size.as_ref()) {
        Some((_, n)) => f.broadcast(n, &ty.dims, &[]),
        None => f.iconst(size as i64, ty.clone()),
    };
    let low = f.compare("LT", idx, &zero);
    let high = f.compare("GE", idx, &n);
    let mut bad = f.ew("or", &[&low, &high]);
    if let Some(k) = keep {
        bad = f.ew("and", &[&bad, k]);
    }
    // The host routine walks rows along `dim`, the other dims outermost in row-major order.
    let dims = &ty.dims;
    let mut order: Vec<usize> = (0..dims.len()).filter(|&k| k != dim).collect();
    order.push(dim);
    let mut weight = 1usize;
    let mut key = f.iconst(0, ty.clone());
    for &k in order.iter().rev() {
        let i = f.iota(k, ty.clone());
        let w = f.iconst(weight as i64, ty.clone());
        let t = f.ew("multiply", &[&i, &w]);
        key = f.ew("add", &[&key, &t]);
        weight *= dims[k];
    }
    let none = f.iconst(i64::MAX, ty.clone());
    let masked = f.select(&bad, &key, &none);
    let all: Vec<usize> = (0..dims.len()).collect();
    let init_max = f.iconst(i64::MAX, Ty::new(Elem::I64, &[]));
    let first = f.reduce(&[&masked], &[&init_max], &all, |f, a| {
        vec![f.ew("minimum", &[&a[0], &a[1]])]
    });
    let first = first[0].clone();
    let first_b = f.broadcast(&first, dims, &[]);
    let is_first = f.compare("EQ", &masked, &first_b);
    let picked = f.select(&is_first, idx, &zero);
    let init_zero = f.iconst(0, Ty::new(Elem::I64, &[]));
    let value = f.reduce(&[&picked], &[&init_zero], &all, |f, a| {
        vec![f.ew("add", &[&a[0], &a[1]])]
    });
    let none0 = f.iconst(i64::MAX, Ty::new(Elem::I64, &[]));
    let any = f.compare("NE", &first, &none0);
    let any = f.convert(&any, Elem::I64);
    let any = f.reshape(&any, &[1]);
    let value = f.reshape(&value[0], &[1]);
    f.op(
        "concatenate",
        &[&any, &value],
        "dimension = 0 : i64",
        Ty::new(Elem::I64, &[CHECK_WORDS]),
    )
}

/// The value an element that receives scattered values starts from without `include_self`.
fn identity(f: &mut Func, r: ScatterReduce, dtype: DType, ty: Ty) -> Val {
    let e = ty.elem;
    match (r, e.is_float()) {
        (ScatterReduce::Amax, true) => f.fconst(f64::NEG_INFINITY, ty),
        (ScatterReduce::Amin, true) => f.fconst(f64::INFINITY, ty),
        (ScatterReduce::Amax, false) => f.iconst(int_range(dtype).0, ty),
        (ScatterReduce::Amin, false) => f.iconst(int_range(dtype).1, ty),
        _ => f.fconst(0.0, ty),
    }
}

fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    }
}

/// Lowers kernel `k` on its operand values (each at its tensor's sizes, in its compute
/// element; `scalar` is a scatter's value when it has no src tensor) into a result of
/// `out_dtype`'s compute element. In a bucketed module, `valid` says which index elements
/// are padding.
pub fn lower(
    f: &mut Func,
    k: &KernelOp,
    inputs: &[Val],
    scalar: Option<&Val>,
    out_dtype: DType,
    valid: Option<&Valid>,
) -> Lowered {
    let check = |size: usize| Check {
        op: k.name(),
        dim: indexed_dim(k),
        size,
        per_batch: valid.and_then(|v| v.size.as_ref()).map_or(0, |s| s.0),
    };
    match k {
        KernelOp::Gather { dim } => {
            let src = at_least_1d(f, &inputs[0]);
            let idx = at_least_1d(f, &inputs[1]);
            let idx = f.convert(&idx, Elem::I64);
            let size = src.ty.dims[*dim];
            let keep = valid_mask(f, &idx, valid);
            let flag = bounds_flag(f, &idx, *dim, size, valid, keep.as_ref());
            let pos = flat_positions(f, &idx, *dim, &src.ty.dims);
            let n: usize = src.ty.dims.iter().product();
            let flat = f.reshape(&src, &[n]);
            let mut out = f.gather_1d(&flat, &pos);
            if let Some(keep) = &keep {
                // Padded rows gather nothing: the result's padding stays zero.
                let zero = f.fconst(0.0, out.ty.clone());
                out = f.select(keep, &out, &zero);
            }
            let out = f.reshape(&out, &inputs[1].ty.dims);
            Lowered {
                result: out,
                check: Some((check(size), flag)),
            }
        }
        KernelOp::Scatter {
            dim,
            reduce,
            include_self,
            ..
        } => {
            let this = at_least_1d(f, &inputs[0]);
            let idx = at_least_1d(f, &inputs[1]);
            let idx = f.convert(&idx, Elem::I64);
            let size = this.ty.dims[*dim];
            let keep = valid_mask(f, &idx, valid);
            let flag = bounds_flag(f, &idx, *dim, size, valid, keep.as_ref());
            let mut pos = flat_positions(f, &idx, *dim, &this.ty.dims);
            let n: usize = this.ty.dims.iter().product();
            if let Some(keep) = &keep {
                // Padded index elements scatter nothing: XLA skips an update whose position is
                // out of bounds.
                let past = f.iconst(n as i64, pos.ty.clone());
                pos = f.select(keep, &pos, &past);
            }
            let upd = match inputs.get(2) {
                Some(src) => {
                    let src = at_least_1d(f, src);
                    f.take(&src, &idx.ty.dims)
                }
                None => {
                    let s = scalar.expect("a scatter without a src tensor has a value");
                    f.broadcast(s, &idx.ty.dims, &[])
                }
            };
            let mut flat = f.reshape(&this, &[n]);
            if !include_self {
                // Every element that receives values starts from them alone.
                let start = identity(f, *reduce, out_dtype, upd.ty.clone());
                flat = f.scatter_1d(&flat, &pos, &start, None);
            }
            let combine = match reduce {
                ScatterReduce::Sum => "add",
                ScatterReduce::Amax => "maximum",
                ScatterReduce::Amin => "minimum",
                other => unreachable!("scatter reduce={other:?} is not in LOWERED"),
            };
            let out = f.scatter_1d(&flat, &pos, &upd, Some(combine));
            let out = f.reshape(&out, &inputs[0].ty.dims);
            Lowered {
                result: out,
                check: Some((check(size), flag)),
            }
        }
        KernelOp::Depthwise(d) => Lowered {
            result: graph_depthwise::lower(f, d, inputs),
            check: None,
        },
        other => unreachable!("{} is not in LOWERED", other.name()),
    }
}
