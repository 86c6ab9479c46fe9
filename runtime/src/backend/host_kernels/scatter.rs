//! Functional scatter (`scatter`, `scatter_add`, `scatter_reduce`): a copy of self with src's
//! values combined into it at the index's positions along one dim. Values are combined in
//! row-major order of the index, each step rounded to the dtype as torch's CPU kernels do, so
//! the result is deterministic (with `assign`, the last duplicate wins).

use super::elem::{
    float_step, read_f64, read_i64, round_to, with_index_reader, wrap_to, write_f64, write_i64,
};
use super::gather::{check_indices, rows_of_one_index};
use super::{copy_view, for_each_row, View};
use crate::error::Result;
use deferfuse_fusion::ir::{DType, ScatterReduce};

/// Where the scattered values come from.
pub(super) enum Src<'a> {
    Tensor(&'a View),
    /// One value for every position, as the binding's scalar bits (`Scalar::bits_for` in the
    /// result's dtype).
    Scalar(u64),
}

/// The op's attributes.
pub(super) struct Scatter {
    pub dim: usize,
    pub reduce: ScatterReduce,
    pub include_self: bool,
    /// float16/bfloat16 sums, means and products accumulate in float32 (`KernelOp::Scatter`).
    pub wide: bool,
}

/// The arithmetic of one element type family: floats as f64, integers and bool as i64.
trait Num: Copy {
    /// # Safety
    /// `p` holds a `dt` element at `off`.
    unsafe fn read(dt: DType, p: *const u8, off: isize) -> Self;
    /// # Safety
    /// `p` has room for a `dt` element at `off`.
    unsafe fn write(self, dt: DType, p: *mut u8, off: isize);
    /// A scalar operand's value, as stored into `dt`.
    fn scalar(dt: DType, bits: u64) -> Self;
    fn combine(dt: DType, r: ScatterReduce, old: Self, new: Self) -> Self;
    /// What an element that receives values starts from without `include_self`.
    fn identity(dt: DType, r: ScatterReduce) -> Self;
    /// `mean`'s division by how many values met at an element.
    fn div_count(dt: DType, v: Self, n: i64) -> Self;
    /// The value as an f64 (floats) and back: a wide accumulator holds them (integers never
    /// accumulate wide).
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

impl Num for f64 {
    unsafe fn read(dt: DType, p: *const u8, off: isize) -> f64 {
        read_f64(dt, p, off)
    }
    unsafe fn write(self, dt: DType, p: *mut u8, off: isize) {
        write_f64(dt, p, off, self)
    }
    fn scalar(dt: DType, bits: u64) -> f64 {
        round_to(dt, f64::from_bits(bits))
    }
    #[inline]
    fn combine(dt: DType, r: ScatterReduce, a: f64, b: f64) -> f64 {
        match r {
            ScatterReduce::Assign => b,
            ScatterReduce::Sum | ScatterReduce::Mean => float_step(dt, a, b, |x, y| x + y),
            ScatterReduce::Prod => float_step(dt, a, b, |x, y| x * y),
            _ if a.is_nan() || b.is_nan() => f64::NAN,
            ScatterReduce::Amax => a.max(b),
            ScatterReduce::Amin => a.min(b),
        }
    }
    fn identity(_: DType, r: ScatterReduce) -> f64 {
        match r {
            ScatterReduce::Prod => 1.0,
            ScatterReduce::Amax => f64::NEG_INFINITY,
            ScatterReduce::Amin => f64::INFINITY,
            _ => 0.0,
        }
    }
    fn div_count(dt: DType, v: f64, n: i64) -> f64 {
        // The count rounded to the dtype first, as CPU divides a half sum by a half count
        // (2127 is 2128 in float16).
        float_step(dt, v, round_to(dt, n as f64), |x, y| x / y)
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
}

impl Num for i64 {
    unsafe fn read(dt: DType, p: *const u8, off: isize) -> i64 {
        read_i64(dt, p, off)
    }
    unsafe fn write(self, dt: DType, p: *mut u8, off: isize) {
        write_i64(dt, p, off, self)
    }
    fn scalar(dt: DType, bits: u64) -> i64 {
        wrap_to(dt, bits as i64)
    }
    fn combine(dt: DType, r: ScatterReduce, a: i64, b: i64) -> i64 {
        wrap_to(
            dt,
            match r {
                ScatterReduce::Assign => b,
                ScatterReduce::Sum | ScatterReduce::Mean => a.wrapping_add(b),
                ScatterReduce::Prod => a.wrapping_mul(b),
                ScatterReduce::Amax => a.max(b),
                ScatterReduce::Amin => a.min(b),
            },
        )
    }
    fn identity(dt: DType, r: ScatterReduce) -> i64 {
        let (lo, hi) = match dt {
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            DType::U8 => (0, 255),
            DType::Bool => (0, 1),
            _ => (i64::MIN, i64::MAX),
        };
        match r {
            ScatterReduce::Prod => 1,
            ScatterReduce::Amax => lo,
            ScatterReduce::Amin => hi,
            _ => 0,
        }
    }
    fn div_count(dt: DType, v: i64, n: i64) -> i64 {
        wrap_to(dt, v.div_euclid(n))
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> i64 {
        v as i64
    }
}

/// A wide scatter's float32 running values, by the element's dense index.
struct Wide {
    acc: Vec<f64>,
    seen: Vec<bool>,
    /// Each element reached: its dense index and its offset in the output.
    touched: Vec<(usize, isize)>,
}

impl Wide {
    fn new(n: usize) -> Wide {
        Wide {
            acc: vec![0.0; n],
            seen: vec![false; n],
            touched: Vec::new(),
        }
    }

    /// Element `k`'s running value, `first()` (its value in the output) the first time.
    fn start(&mut self, k: usize, target: isize, first: impl FnOnce() -> f64) -> f64 {
        if !self.seen[k] {
            self.seen[k] = true;
            self.acc[k] = first();
            self.touched.push((k, target));
        }
        self.acc[k]
    }
}

impl Scatter {
    fn name(&self) -> &'static str {
        match self.reduce {
            ScatterReduce::Assign => "scatter",
            _ => "scatter_reduce",
        }
    }

    /// `out` = self with `src` scattered into it. Every index is checked before anything is
    /// written.
    pub fn run(&self, this: &View, index: &View, src: Src, out: &View) -> Result<()> {
        check_indices(self.name(), index, self.dim, this.sizes[self.dim])?;
        copy_view(this, out);
        if let Src::Tensor(src) = src {
            if self.combine_rows(index, src, out) {
                return Ok(());
            }
        }
        if out.dtype.is_float() {
            self.apply::<f64>(index, src, out);
        } else {
            self.apply::<i64>(index, src, out);
        }
        Ok(())
    }

    fn apply<T: Num>(&self, index: &View, src: Src, out: &View) {
        let (dim, dt, r) = (self.dim, out.dtype, self.reduce);
        let fresh = !self.include_self && r != ScatterReduce::Assign;
        let sums = matches!(
            r,
            ScatterReduce::Sum | ScatterReduce::Mean | ScatterReduce::Prod
        );
        // float32 running values of the elements the index reaches, each rounded into the
        // output once at the end; zeroed lazily (calloc), so their cost follows the index, not
        // the output's size.
        let mut wide = (self.wide && sums && matches!(dt, DType::F16 | DType::BF16))
            .then(|| Wide::new(out.numel()));
        let mut counts =
            (r == ScatterReduce::Mean).then(|| vec![self.include_self as i64; out.numel()]);
        // The counts as a dense view of the output's shape: the same offsets math finds them.
        let count_view = View::dense(std::ptr::null_mut(), DType::I64, &out.sizes);
        let src_view = match &src {
            Src::Tensor(v) => *v,
            Src::Scalar(_) => index, // never read: a placeholder that keeps the offsets aligned
        };
        let scalar = match src {
            Src::Scalar(bits) => Some(T::scalar(dt, bits)),
            Src::Tensor(_) => None,
        };
        let last = index.sizes.len() - 1;
        let n = index.sizes[last];
        let views = [index, out, src_view, &count_view];
        // Each element's target: its own position with the index value along `dim`.
        let mut visit = |pass: Pass| {
            for_each_row(&index.sizes, last, &views, |idx, o| {
                for j in 0..n {
                    let at = |v: &View, k: usize| o[k] + j as isize * v.strides[last];
                    // SAFETY: every view lies inside its buffer; indices were checked.
                    let v = unsafe { read_i64(index.dtype, index.base, at(index, 0)) } as isize;
                    let own = if dim == last { j } else { idx[dim] } as isize;
                    let target = at(out, 1) + (v - own) * out.strides[dim];
                    let count_at = at(&count_view, 3) + (v - own) * count_view.strides[dim];
                    match pass {
                        Pass::Reset => unsafe { T::identity(dt, r).write(dt, out.base, target) },
                        Pass::Combine => {
                            let new = match scalar {
                                Some(s) => s,
                                None => unsafe { T::read(dt, src_view.base, at(src_view, 2)) },
                            };
                            if let Some(w) = wide.as_mut() {
                                let k = count_at as usize;
                                // SAFETY: as above.
                                let old = w.start(k, target, || unsafe {
                                    T::read(dt, out.base, target).to_f64()
                                });
                                let sum = T::combine(DType::F32, r, T::from_f64(old), new);
                                w.acc[k] = sum.to_f64();
                            } else {
                                unsafe {
                                    let old = T::read(dt, out.base, target);
                                    T::combine(dt, r, old, new).write(dt, out.base, target);
                                }
                            }
                            if let Some(c) = counts.as_mut() {
                                c[count_at as usize] += 1;
                            }
                        }
                    }
                }
            });
        };
        if fresh {
            visit(Pass::Reset);
        }
        visit(Pass::Combine);
        if let Some(w) = wide {
            for &(k, target) in &w.touched {
                // SAFETY: the output view lies inside its buffer.
                unsafe { T::from_f64(w.acc[k]).write(dt, out.base, target) };
            }
        }
        if let Some(c) = counts {
            let last_out = out.sizes.len() - 1;
            let views = [out, &count_view];
            for_each_row(&out.sizes, last_out, &views, |_, o| {
                for j in 0..out.sizes[last_out] as isize {
                    let k = (o[1] + j) as usize;
                    if c[k] > 1 {
                        let at = o[0] + j * out.strides[last_out];
                        // SAFETY: the output view lies inside its buffer.
                        unsafe {
                            let v = T::read(dt, out.base, at);
                            T::div_count(dt, v, c[k]).write(dt, out.base, at);
                        }
                    }
                }
            });
        }
    }
}

impl Scatter {
    /// Sum, assign (f32/f64/i64) or take the max or min (f32/f64) in native arithmetic, which
    /// gives the element walk's bits (a float sum is one f32 or f64 operation rounded once,
    /// int64 sums wrap, max and min are the walk's own `combine`), in the index's row-major
    /// order, as the walk does: whole rows when every row takes one index value (see
    /// [`rows_of_one_index`]: embedding's backward, `index_add`), element by element along the
    /// last dim; without `include_self`, the targets first take the reduction's identity, as
    /// in the walk. Returns false, doing nothing, for any other case (products, means).
    fn combine_rows(&self, index: &View, src: &View, out: &View) -> bool {
        let supported = match self.reduce {
            ScatterReduce::Sum | ScatterReduce::Assign => true,
            // scatter_reduce's amax/amin: PyG's max aggregation, embedding_bag's max mode.
            ScatterReduce::Amax | ScatterReduce::Amin => out.dtype.is_float(),
            _ => false,
        };
        if !supported
            || src.dtype != out.dtype
            || !matches!(out.dtype, DType::F32 | DType::F64 | DType::I64)
        {
            return false;
        }
        let last = if self.dim == index.sizes.len() - 1 {
            None
        } else {
            let Some(last) = rows_of_one_index(self.dim, index, &[src, out]) else {
                return false;
            };
            if src.strides[last] != 1 || out.strides[last] != 1 {
                return false;
            }
            Some(last)
        };
        match out.dtype {
            DType::F32 => self.combine_typed::<f32>(last, index, src, out),
            DType::I64 => self.combine_typed::<i64>(last, index, src, out),
            _ => self.combine_typed::<f64>(last, index, src, out),
        }
        true
    }

    /// [`Self::combine_rows`] for element type `T`: the reduction's step as a closure, so each
    /// loop is compiled for its step.
    fn combine_typed<T: RowValue>(
        &self,
        last: Option<usize>,
        index: &View,
        src: &View,
        out: &View,
    ) {
        let r = self.reduce;
        let reset = (!self.include_self && r != ScatterReduce::Assign).then(|| T::identity(r));
        match r {
            ScatterReduce::Assign => self.combine_with(last, index, src, out, reset, |_, b| b),
            ScatterReduce::Sum => self.combine_with(last, index, src, out, reset, T::walk_add),
            // The reduction as a constant in each closure, so its match folds away in the loop
            // (a runtime `r` left a branchy call per element: 3 ns, as slow as the walk).
            ScatterReduce::Amax => self.combine_with(last, index, src, out, reset, |a: T, b| {
                a.walk_extreme(ScatterReduce::Amax, b)
            }),
            _ => self.combine_with(last, index, src, out, reset, |a: T, b| {
                a.walk_extreme(ScatterReduce::Amin, b)
            }),
        }
    }

    fn combine_with<T: RowValue>(
        &self,
        last: Option<usize>,
        index: &View,
        src: &View,
        out: &View,
        reset: Option<T>,
        step: impl Fn(T, T) -> T,
    ) {
        match last {
            None => with_index_reader!(index.dtype, |read| {
                combine_along_last(reset, &step, index, src, out, read)
            }),
            Some(last) => combine_rows(self.dim, last, reset, &step, index, src, out),
        }
    }
}

/// A value of the row paths, combined as the element walk combines it: a sum is one IEEE
/// operation for floats and a wrapping add for int64 (bag sizes and offsets in embedding_bag:
/// 1.6 ms for 81,920 positions through the walk, CPU eager 0.09); max and min go through the
/// walk's f64 `combine` (exact: it picks one operand, or NaN).
trait RowValue: Copy {
    fn walk_add(self, other: Self) -> Self;
    fn walk_extreme(self, r: ScatterReduce, other: Self) -> Self;
    /// What a target starts from without `include_self`.
    fn identity(r: ScatterReduce) -> Self;
}

impl RowValue for f32 {
    fn walk_add(self, other: f32) -> f32 {
        self + other
    }
    #[inline(always)]
    fn walk_extreme(self, r: ScatterReduce, other: f32) -> f32 {
        <f64 as Num>::combine(DType::F32, r, self as f64, other as f64) as f32
    }
    fn identity(r: ScatterReduce) -> f32 {
        <f64 as Num>::identity(DType::F32, r) as f32
    }
}

impl RowValue for f64 {
    fn walk_add(self, other: f64) -> f64 {
        self + other
    }
    #[inline(always)]
    fn walk_extreme(self, r: ScatterReduce, other: f64) -> f64 {
        <f64 as Num>::combine(DType::F64, r, self, other)
    }
    fn identity(r: ScatterReduce) -> f64 {
        <f64 as Num>::identity(DType::F64, r)
    }
}

impl RowValue for i64 {
    fn walk_add(self, other: i64) -> i64 {
        self.wrapping_add(other)
    }
    fn walk_extreme(self, r: ScatterReduce, other: i64) -> i64 {
        <i64 as Num>::combine(DType::I64, r, self, other)
    }
    fn identity(r: ScatterReduce) -> i64 {
        <i64 as Num>::identity(DType::I64, r)
    }
}

/// `out[.., index[.., j]] = step(out[..], src[.., j])` along the last dim (bilinear
/// interpolation's backward along the width, which took 14 ns an element through the generic
/// walk, 20 times the other dims' row path), in the index's row-major order, after `reset`
/// (when given) was written at every target. The index's elements are read by `read` (one
/// load of the index's own type, not a dtype dispatch per element).
fn combine_along_last<T: RowValue>(
    reset: Option<T>,
    step: &impl Fn(T, T) -> T,
    index: &View,
    src: &View,
    out: &View,
    read: impl Fn(*const u8, isize) -> isize,
) {
    let last = index.sizes.len() - 1;
    let n = index.sizes[last] as isize;
    let (is, ss, os) = (index.strides[last], src.strides[last], out.strides[last]);
    let (ib, sb, out_base) = (index.base, src.base as *const T, out.base as *mut T);
    if n == 0 {
        return;
    }
    if let Some(id) = reset {
        for_each_row(&index.sizes, last, &[index, out], |_, o| {
            // In the call's locals, as below.
            let (is, os, ib, out_base) = (is, os, ib, out_base);
            for j in 0..n {
                // SAFETY: as below.
                unsafe { *out_base.offset(o[1] + read(ib, o[0] + j * is) * os) = id };
            }
        });
    }
    for_each_row(&index.sizes, last, &[index, out, src], |_, o| {
        // Pointers and strides copied into the call's locals: read through the closure's
        // captures, every element reloaded them after its store, which might have changed
        // them (grid_sample's backward: 4.9 ns an element).
        let (is, ss, os, ib, sb, out_base) = (is, ss, os, ib, sb, out_base);
        let (iv, ov, sv) = (o[0], o[1], o[2]);
        // The target's running value stays in a register while consecutive values go to it
        // (nearest upsampling's backward sends each run of `scale` values to one element):
        // the same operations in the same order as storing and reloading it each time, without
        // a dependency through memory per element (with the typed index read: 5.1 -> 2.2 ns an
        // element, rows of 64).
        // SAFETY: every view lies inside its buffer and the index was checked, so each target
        // is one of the output row's elements; the output is never the source's buffer (`Dst`
        // stages it when it would be).
        unsafe {
            let target = |j: isize| ov + read(ib, iv + j * is) * os;
            let mut at = target(0);
            let mut value = *out_base.offset(at);
            for j in 0..n {
                let t = target(j);
                if t != at {
                    *out_base.offset(at) = value;
                    at = t;
                    value = *out_base.offset(at);
                }
                value = step(value, *sb.offset(sv + j * ss));
            }
            *out_base.offset(at) = value;
        }
    });
}

/// `out[..index[.., 0].., :] = step(out[..], src[.., :])` row by row (rows are contiguous),
/// after `reset` (when given) filled every target row.
fn combine_rows<T: RowValue>(
    dim: usize,
    last: usize,
    reset: Option<T>,
    step: &impl Fn(T, T) -> T,
    index: &View,
    src: &View,
    out: &View,
) {
    let n = index.sizes[last];
    let os = out.strides[dim];
    // SAFETY: every view lies inside its buffer and the index was checked, so the target row
    // is one of the output's.
    let target_row = |idx: &[usize], o: &[isize]| unsafe {
        let v = read_i64(index.dtype, index.base, o[0]) as isize;
        let to = (out.base as *mut T).offset(o[1] + (v - idx[dim] as isize) * os);
        std::slice::from_raw_parts_mut(to, n)
    };
    if let Some(id) = reset {
        for_each_row(&index.sizes, last, &[index, out], |idx, o| {
            target_row(idx, o).fill(id)
        });
    }
    for_each_row(&index.sizes, last, &[index, out, src], |idx, o| {
        // SAFETY: the source row lies inside its buffer; the output is never the source's
        // buffer (`Dst` stages it when it would be), so the two slices do not overlap.
        let from = unsafe { std::slice::from_raw_parts((src.base as *const T).offset(o[2]), n) };
        for (t, &f) in target_row(idx, o).iter_mut().zip(from) {
            *t = step(*t, f);
        }
    });
}

/// The two walks over the index: set targets to the identity, then combine values into them.
#[derive(Clone, Copy)]
enum Pass {
    Reset,
    Combine,
}
