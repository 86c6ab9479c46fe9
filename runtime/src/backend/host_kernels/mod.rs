//! Host implementations of the kernel ops (gather, scatter, scans, sort, random numbers,
//! depthwise and dense convolutions, im2col and col2im, grouped matrix products, the widening
//! half-precision product, the CTC loss, the LSTM and GRU recurrences): loops over host memory, generic over dtype, reading every
//! operand through its layout (strides, offset; an expanded index has stride 0). Both backends run
//! them: the CPU backend directly, the PJRT backend on host bytes (`HostProgram` writes device
//! values back first), so results are the same bits on either and in every mode.

mod conv;
mod ctc;
mod depthwise;
pub(crate) mod elem;
mod gather;
mod grouped_matmul;
mod im2col;
mod random;
mod recurrence;
mod scan;
mod scatter;
mod sort;
mod wide_matmul;

pub use random::philox4x32_10;

use super::{HostProgram, Program, SideBySide};
use crate::error::{Error, Result};
use deferfuse_fusion::ir::{ConvPart, DType, KernelOp};
use deferfuse_fusion::{Binding, TensorRef};
use smallvec::SmallVec;
use std::sync::Arc;

/// The program of a kernel region: nothing to compile, the op's host routine runs as is.
pub fn program(op: &KernelOp) -> Arc<dyn Program> {
    program_on(op, None)
}

/// [`program`], splitting the routines that can (depthwise convolution by channels, grouped
/// products by windows of each group's rows) over `threads`: each output element is computed
/// the same way whichever job it falls in.
pub fn program_on(op: &KernelOp, threads: Option<Arc<dyn SideBySide>>) -> Arc<dyn Program> {
    Arc::new(KernelProgram(op.clone(), threads))
}

struct KernelProgram(KernelOp, Option<Arc<dyn SideBySide>>);

impl HostProgram for KernelProgram {
    unsafe fn run_host(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()> {
        let n_in = binding.n_inputs;
        if binding.operands.len() != n_in + 1 || bases.len() != n_in + 1 {
            return Err(Error::Internal(format!(
                "{}: expected {} operands and one output, got {} operands",
                self.0.name(),
                n_in,
                binding.operands.len()
            )));
        }
        let inputs: SmallVec<[View; 3]> = (0..n_in)
            .map(|j| View::new(&binding.operands[j], bases[j]))
            .collect();
        let first = inputs.first().map(|v| v.dtype);
        let result = self.0.result_dtype(first);
        // Scatter reads its `this` only where it writes it (after copying it into the output):
        // when `this` is the output itself (`index_add_`, `scatter_add_`, embedding's
        // backward into its zeros), the kernel writes in place, with no staging copy.
        let in_place = matches!(self.0, KernelOp::Scatter { .. }).then(|| &binding.operands[0]);
        let mut dst = Dst::new(
            &binding.operands[n_in],
            bases[n_in],
            result,
            &bases[..n_in],
            in_place,
        );
        match &self.0 {
            KernelOp::Gather { dim } => gather::run(*dim, &inputs[0], &inputs[1], &dst.view)?,
            KernelOp::Scatter {
                dim,
                reduce,
                include_self,
                wide,
            } => {
                let src = match inputs.get(2) {
                    Some(v) => scatter::Src::Tensor(v),
                    None => scatter::Src::Scalar(binding.scalars[0]),
                };
                let op = scatter::Scatter {
                    dim: *dim,
                    reduce: *reduce,
                    include_self: *include_self,
                    wide: *wide,
                };
                op.run(&inputs[0], &inputs[1], src, &dst.view)?
            }
            KernelOp::Scan { op, dim, .. } => scan::run(*op, *dim, &inputs[0], &dst.view),
            KernelOp::Sort {
                dim,
                descending,
                limit,
            } => sort::run(*dim, *descending, *limit, &inputs[0], &dst.view),
            KernelOp::Random { dist, .. } => {
                random::run(*dist, binding.scalars[0], binding.scalars[1], &dst.view)
            }
            KernelOp::Depthwise(k) => {
                depthwise::run(k, &inputs[0], &inputs[1], &dst.view, self.1.as_deref())?
            }
            KernelOp::GroupedMatmul(case) => grouped_matmul::run(
                *case,
                (&inputs[0], &inputs[1], &inputs[2]),
                &dst.view,
                self.1.as_deref(),
            )?,
            KernelOp::Ctc(k) => ctc::run(k, &inputs, &dst.view)?,
            KernelOp::Conv(k) if k.part == ConvPart::ColumnsToInput => {
                im2col::columns_to_input(k, &inputs[0], &dst.view, self.1.as_deref())?
            }
            KernelOp::Conv(k) if k.part == ConvPart::InputToColumns => {
                im2col::input_to_columns(k, &inputs[0], &dst.view, self.1.as_deref())?
            }
            KernelOp::Conv(k) => {
                conv::run(k, &inputs[0], &inputs[1], &dst.view, self.1.as_deref())?
            }
            KernelOp::Recurrence(k) => recurrence::run(k, &inputs, &dst.view, self.1.as_deref())?,
            KernelOp::WideMatmul => {
                wide_matmul::run(&inputs[0], &inputs[1], &dst.view, self.1.as_deref())?
            }
        }
        dst.finish();
        Ok(())
    }
}

/// An operand as a kernel reads it. A 0-dim tensor is seen as one element of a 1-dim one, so
/// torch's "dim 0 of a scalar" works without special cases.
pub(crate) struct View {
    pub base: *mut u8,
    pub dtype: DType,
    pub sizes: SmallVec<[usize; 6]>,
    /// In elements.
    pub strides: SmallVec<[isize; 6]>,
    /// In elements.
    pub offset: isize,
}

impl View {
    fn new(t: &TensorRef, base: *mut u8) -> View {
        let l = &t.layout;
        let (sizes, strides) = if l.rank() == 0 {
            (SmallVec::from_slice(&[1]), SmallVec::from_slice(&[0]))
        } else {
            (
                SmallVec::from_slice(&l.sizes),
                SmallVec::from_slice(&l.strides),
            )
        };
        View {
            base,
            dtype: t.dtype,
            sizes,
            strides,
            offset: l.offset as isize,
        }
    }

    /// A dense row-major view of `sizes` over `base`.
    fn dense(base: *mut u8, dtype: DType, sizes: &[usize]) -> View {
        let mut strides: SmallVec<[isize; 6]> = SmallVec::from_elem(1, sizes.len());
        for d in (0..sizes.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * sizes[d + 1].max(1) as isize;
        }
        View {
            base,
            dtype,
            sizes: SmallVec::from_slice(sizes),
            strides,
            offset: 0,
        }
    }

    /// Whether the dims from `first` on hold their elements row-major and adjacent (dims of
    /// size 1 may have any stride); `is_dense_from(0)`: the whole view is one dense run.
    pub fn is_dense_from(&self, first: usize) -> bool {
        let mut want = 1isize;
        for d in (first..self.sizes.len()).rev() {
            if self.sizes[d] != 1 && self.strides[d] != want {
                return false;
            }
            want *= self.sizes[d] as isize;
        }
        true
    }

    /// This view with dim `dim` narrowed to `r`: the part of an operand one thread's share of
    /// a kernel reads or writes (a range of channels).
    pub fn narrowed(&self, dim: usize, r: std::ops::Range<usize>) -> View {
        let mut sizes = self.sizes.clone();
        sizes[dim] = r.len();
        View {
            base: self.base,
            dtype: self.dtype,
            sizes,
            strides: self.strides.clone(),
            offset: self.offset + r.start as isize * self.strides[dim],
        }
    }

    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
}

/// Calls `f(index, offsets)` for each row along `dim` of a `sizes` iteration space (every
/// index of the other dims, in row-major order; `index[dim]` is 0), with each view's element
/// offset of the row's first element. Views may be larger than `sizes`; their own strides
/// place the row.
pub(crate) fn for_each_row(
    sizes: &[usize],
    dim: usize,
    views: &[&View],
    mut f: impl FnMut(&[usize], &[isize]),
) {
    if sizes.iter().enumerate().any(|(d, &s)| d != dim && s == 0) {
        return;
    }
    let rank = sizes.len();
    let mut idx: SmallVec<[usize; 6]> = SmallVec::from_elem(0, rank);
    let mut offs: SmallVec<[isize; 4]> = views.iter().map(|v| v.offset).collect();
    loop {
        f(&idx, &offs);
        // Odometer over every dim but `dim`, keeping the offsets in step.
        let mut d = rank;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            if d == dim {
                continue;
            }
            idx[d] += 1;
            for (o, v) in offs.iter_mut().zip(views) {
                *o += v.strides[d];
            }
            if idx[d] < sizes[d] {
                break;
            }
            for (o, v) in offs.iter_mut().zip(views) {
                *o -= v.strides[d] * sizes[d] as isize;
            }
            idx[d] = 0;
        }
    }
}

/// Copies `from` into `to` (same shape and dtype) through both layouts: a whole row at a time
/// where both rows are contiguous. A `to` that is `from` itself (scatter's `this` written in
/// place, see `Dst::new`) already holds the values.
pub(crate) fn copy_view(from: &View, to: &View) {
    if from.base == to.base && from.offset == to.offset && from.strides == to.strides {
        return;
    }
    let last = to.sizes.len() - 1;
    let n = to.sizes[last] as isize;
    let es = to.dtype.size();
    let rows = from.strides[last] == 1 && to.strides[last] == 1;
    for_each_row(&to.sizes, last, &[from, to], |_, o| {
        if rows {
            // SAFETY: as below, a whole contiguous row at once.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    from.base.offset(o[0] * es as isize),
                    to.base.offset(o[1] * es as isize),
                    n as usize * es,
                )
            };
            return;
        }
        for j in 0..n {
            // SAFETY: both views lie inside their buffers; they are distinct buffers (a kernel's
            // output is staged when it shares one with an input other than as itself).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    from.base
                        .offset((o[0] + j * from.strides[last]) * es as isize),
                    to.base.offset((o[1] + j * to.strides[last]) * es as isize),
                    es,
                )
            };
        }
    });
}

/// Where a kernel writes its result: the output view itself when it has the result's dtype and
/// shares no buffer with an input, else a dense scratch tensor of the result's dtype that
/// [`Dst::finish`] copies (converting) into the output, so a kernel never reads what it
/// already overwrote (`x.scatter_(..)`, `argsort(x, out=x)`).
struct Dst {
    view: View,
    /// The real output when `view` is scratch, and the scratch's storage (u64 for alignment).
    staged: Option<(View, Vec<u64>)>,
}

impl Dst {
    /// `same_ok`: input 0, when the kernel may take it as the output itself (it must then be
    /// exactly the output: same layout and dtype).
    fn new(
        out: &TensorRef,
        base: *mut u8,
        result: DType,
        inputs: &[*mut u8],
        same_ok: Option<&TensorRef>,
    ) -> Dst {
        let real = View::new(out, base);
        let is_out = |t: &TensorRef| t.layout == out.layout && t.dtype == out.dtype;
        let aliased = inputs
            .iter()
            .enumerate()
            .any(|(j, &b)| b == base && !(j == 0 && same_ok.is_some_and(is_out)));
        if out.dtype == result && !aliased {
            return Dst {
                view: real,
                staged: None,
            };
        }
        let bytes = real.numel() * result.size();
        let mut scratch = vec![0u64; bytes.div_ceil(8)];
        let view = View::dense(scratch.as_mut_ptr() as *mut u8, result, &real.sizes);
        Dst {
            view,
            staged: Some((real, scratch)),
        }
    }

    /// Copies a staged result into the output.
    fn finish(&mut self) {
        let Some((real, _scratch)) = &self.staged else {
            return;
        };
        let rank = real.sizes.len();
        let last = rank - 1;
        let n = real.sizes[last];
        for_each_row(&real.sizes, last, &[&self.view, real], |_, o| {
            for i in 0..n as isize {
                // SAFETY: both views lie inside their buffers (the scratch was sized for it,
                // the output's view was bounds-checked when it was made).
                unsafe {
                    elem::convert(
                        self.view.dtype,
                        self.view.base,
                        o[0] + i * self.view.strides[last],
                        real.dtype,
                        real.base,
                        o[1] + i * real.strides[last],
                    )
                };
            }
        });
    }
}

/// Runs `job(0..n)`, side by side on `threads` when given, else in order on this thread.
/// Each job must read the operands and write only its own part of the output, from its own
/// scratch: nothing orders the jobs.
pub(crate) fn jobs(
    threads: Option<&dyn SideBySide>,
    n: usize,
    job: &dyn Fn(usize) -> Result<()>,
) -> Result<()> {
    match threads {
        Some(threads) => {
            let shared = Shared(job);
            threads.run_all(n, &|j| {
                let Shared(job) = &shared;
                job(j)
            })
        }
        None => (0..n).try_for_each(job),
    }
}

/// The job the threads share.
struct Shared<'a>(&'a dyn Fn(usize) -> Result<()>);

// SAFETY: `jobs`' callers give jobs that read shared operands and write disjoint parts of the
// output (a sample, a range of channels or of rows), each from its own scratch.
unsafe impl Sync for Shared<'_> {}

/// The error of an index value outside its dim.
pub(crate) fn out_of_bounds(op: &str, value: i64, dim: usize, size: usize) -> Error {
    Error::IndexOutOfBounds(format!(
        "{op}: index {value} is out of bounds for dim {dim} with size {size}"
    ))
}
