//! im2col and col2im: a convolution's columns `[N, C, k..., out...]` gathered from its input
//! (`ConvPart::InputToColumns`) and their gradient added back at the input positions each tap
//! read (`ConvPart::ColumnsToInput`, the last step of a strided convolution's input gradient and
//! so of a transposed convolution's forward).
//!
//! Composed from ops, col2im was K strided read-modify-write adds, one per kernel tap, each over
//! the whole padded input with rows of a few elements (a VAE's 4x4 stride-2 transposed
//! convolution, `[64, 64, 7, 7]` -> `[64, 32, 14, 14]`, spent 2.4 ms in them), and im2col a
//! padded copy of the input plus a window copy walked the same way. Here each `(n, c)` plane
//! goes through a zero-padded plane that stays in L1: summed tap by tap and cropped out
//! (col2im), or copied in and read tap by tap (im2col).
//!
//! col2im sums each element's taps in the kernel's row-major tap order from +0.0, the order of
//! the strided adds it replaces, so the results are their bits (the zero's sign included), on
//! any thread count; im2col only copies, so it takes 16-bit floats too, as bit patterns.

use super::{jobs, View};
use crate::backend::SideBySide;
use crate::error::{Error, Result};
use deferfuse_fusion::ir::{Conv, DType};
use std::cell::RefCell;

/// Fewest column values worth splitting the planes over threads.
const SERIAL_BELOW: usize = 1 << 16;

thread_local! {
    /// The padded plane, kept between calls.
    static PLANE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// im2col's padded plane of 16-bit floats (bf16, f16), kept between calls.
    static PLANE16: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// An element a padded plane holds: f32, or a 16-bit float's bits (im2col only copies).
trait PlaneElem: Copy + Default + 'static {
    /// Runs `f` with this thread's plane of this element type.
    fn with_plane<R>(f: impl FnOnce(&mut Vec<Self>) -> R) -> R;
}

impl PlaneElem for f32 {
    fn with_plane<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
        PLANE.with(|cell| f(&mut cell.borrow_mut()))
    }
}

impl PlaneElem for u16 {
    fn with_plane<R>(f: impl FnOnce(&mut Vec<u16>) -> R) -> R {
        PLANE16.with(|cell| f(&mut cell.borrow_mut()))
    }
}

/// The geometry with every spatial dim count brought to 3 (leading dims of size 1), so one
/// loop nest serves 1-D, 2-D and 3-D.
struct Geometry {
    kernel: [usize; 3],
    out: [usize; 3],
    input: [usize; 3],
    padding: [usize; 3],
    stride: [usize; 3],
    dilation: [usize; 3],
    /// The padded plane's sizes: `input + 2 * padding`, what the windows cover.
    padded: [usize; 3],
    /// The columns' strides over `[k..., out...]` (3 + 3 of them, 0 for the added dims).
    col_strides: [isize; 6],
    /// The input's strides over its spatial dims.
    in_strides: [isize; 3],
}

impl Geometry {
    /// The geometry of columns `cols` `[N, C, k..., out...]` of input `input` `[N, C, in...]`.
    fn new(k: &Conv, cols: &View, input: &View) -> Geometry {
        let d = k.padding.len();
        let lead = 3 - d;
        let mut g = Geometry {
            kernel: [1; 3],
            out: [1; 3],
            input: [1; 3],
            padding: [0; 3],
            stride: [1; 3],
            dilation: [1; 3],
            padded: [1; 3],
            col_strides: [0; 6],
            in_strides: [0; 3],
        };
        for i in 0..d {
            let j = lead + i;
            g.kernel[j] = cols.sizes[2 + i];
            g.out[j] = cols.sizes[2 + d + i];
            g.input[j] = input.sizes[2 + i];
            g.padding[j] = k.padding[i];
            g.stride[j] = k.stride[i];
            g.dilation[j] = k.dilation[i];
            g.padded[j] = g.input[j] + 2 * g.padding[j];
            g.col_strides[j] = cols.strides[2 + i];
            g.col_strides[3 + j] = cols.strides[2 + d + i];
            g.in_strides[j] = input.strides[2 + i];
        }
        g
    }

    fn plane(&self) -> usize {
        self.padded.iter().product()
    }

    /// Sums one plane's columns (`cols` at its `(n, c)` element) into `plane`, zeroed here.
    ///
    /// # Safety
    /// `cols` is valid for the geometry's columns at their strides; `plane` holds the padded
    /// plane (every window lies inside it: the op's shape check).
    unsafe fn sum_plane(&self, cols: *const f32, plane: &mut [f32]) {
        plane.fill(0.0);
        let (p1, p2) = (self.padded[1], self.padded[2]);
        let cs = &self.col_strides;
        let (n2, s2, d2, cs2) = (self.out[2], self.stride[2], self.dilation[2], cs[5]);
        // Stride 2, neighbouring taps and contiguous columns: the transposed convolutions'
        // usual upsampling (4x4 stride 2), taken two taps at a time.
        let paired = s2 == 2 && d2 == 1 && cs2 == 1;
        let plane = plane.as_mut_ptr();
        // Within one (t0, t1) the taps along the last dim go innermost: for fixed (t0, t1)
        // each (o0, o1) adds into a row of its own, so an element's values from that (t0, t1)
        // all arrive in one (o0, o1), tap t2 after tap t2, and each element still sums its
        // taps in row-major tap order.
        for t0 in 0..self.kernel[0] {
            for t1 in 0..self.kernel[1] {
                let tap = cols.offset(t0 as isize * cs[0] + t1 as isize * cs[1]);
                for o0 in 0..self.out[0] {
                    let r0 = (o0 * self.stride[0] + t0 * self.dilation[0]) * p1;
                    for o1 in 0..self.out[1] {
                        let row =
                            plane.add((r0 + o1 * self.stride[1] + t1 * self.dilation[1]) * p2);
                        let src = tap.offset(o0 as isize * cs[3] + o1 as isize * cs[4]);
                        let mut t2 = 0;
                        while t2 < self.kernel[2] {
                            let dst = row.add(t2 * d2);
                            let a = src.offset(t2 as isize * cs[2]);
                            // Slices where the steps allow: the compiler vectorizes what it
                            // knows does not alias (through the pointers each add was a
                            // scalar load, add and store).
                            let run = |len: usize| std::slice::from_raw_parts_mut(dst, len);
                            let taps = |p: *const f32| std::slice::from_raw_parts(p, n2);
                            if s2 == 1 && cs2 == 1 {
                                for (d, v) in run(n2).iter_mut().zip(taps(a)) {
                                    *d += *v;
                                }
                            } else if paired && t2 + 1 < self.kernel[2] {
                                // Taps t2 and t2 + 1 at stride 2 fill the even and the odd
                                // elements of one run: one pass over contiguous elements
                                // (each takes one of the two, so the order is unchanged).
                                let b = a.offset(cs[2]);
                                for (d, (x, y)) in run(2 * n2)
                                    .chunks_exact_mut(2)
                                    .zip(taps(a).iter().zip(taps(b)))
                                {
                                    d[0] += *x;
                                    d[1] += *y;
                                }
                                t2 += 1;
                            } else if s2 == 2 && cs2 == 1 && n2 > 0 {
                                for (d, v) in run(2 * n2 - 1).iter_mut().step_by(2).zip(taps(a)) {
                                    *d += *v;
                                }
                            } else {
                                for o2 in 0..n2 {
                                    *dst.add(o2 * s2) += *a.offset(o2 as isize * cs2);
                                }
                            }
                            t2 += 1;
                        }
                    }
                }
            }
        }
    }

    /// Calls `f(plane_start, input_offset)` for every row of the input's last dim: where the
    /// row starts in the padded plane, and its offset in an input plane at the input's strides.
    fn input_rows(&self, mut f: impl FnMut(usize, isize)) {
        let (p1, p2) = (self.padded[1], self.padded[2]);
        let [q0, q1, q2] = self.padding;
        let xs = &self.in_strides;
        for i0 in 0..self.input[0] {
            for i1 in 0..self.input[1] {
                f(
                    ((i0 + q0) * p1 + i1 + q1) * p2 + q2,
                    i0 as isize * xs[0] + i1 as isize * xs[1],
                );
            }
        }
    }

    /// Copies one input plane (`x` at its `(n, c)` element) into `plane`'s unpadded part, the
    /// padding zeroed: [`Self::crop`]'s mirror.
    ///
    /// # Safety
    /// `x` is valid for the input's sizes at the geometry's input strides.
    unsafe fn fill<T: PlaneElem>(&self, x: *const T, plane: &mut [T]) {
        if self.padding != [0; 3] {
            plane.fill(T::default());
        }
        let (n, step) = (self.input[2], self.in_strides[2]);
        self.input_rows(|at, from| {
            let row = &mut plane[at..at + n];
            // SAFETY: the caller's contract.
            unsafe {
                let from = x.offset(from);
                if step == 1 {
                    row.copy_from_slice(std::slice::from_raw_parts(from, n));
                } else {
                    for (e, v) in row.iter_mut().enumerate() {
                        *v = *from.offset(e as isize * step);
                    }
                }
            }
        });
    }

    /// Writes one plane's columns (`cols` at its `(n, c)` element) from the padded `plane`:
    /// [`Self::sum_plane`]'s mirror.
    ///
    /// # Safety
    /// `cols` is valid for the geometry's columns at their strides and overlaps no other
    /// plane's.
    unsafe fn gather_plane<T: PlaneElem>(&self, plane: &[T], cols: *mut T) {
        let (p1, p2) = (self.padded[1], self.padded[2]);
        let cs = &self.col_strides;
        let (n2, s2, d2, cs2) = (self.out[2], self.stride[2], self.dilation[2], cs[5]);
        let plane = plane.as_ptr();
        for t0 in 0..self.kernel[0] {
            for t1 in 0..self.kernel[1] {
                for t2 in 0..self.kernel[2] {
                    let tap = cols
                        .offset(t0 as isize * cs[0] + t1 as isize * cs[1] + t2 as isize * cs[2]);
                    for o0 in 0..self.out[0] {
                        let r0 = (o0 * self.stride[0] + t0 * self.dilation[0]) * p1;
                        for o1 in 0..self.out[1] {
                            let r1 = (r0 + o1 * self.stride[1] + t1 * self.dilation[1]) * p2;
                            let src = plane.add(r1 + t2 * d2);
                            let dst = tap.offset(o0 as isize * cs[3] + o1 as isize * cs[4]);
                            if s2 == 1 && cs2 == 1 {
                                // Not copy_nonoverlapping: a memcpy call per row of a few
                                // values cost more than the values.
                                for o2 in 0..n2 {
                                    *dst.add(o2) = *src.add(o2);
                                }
                            } else if s2 == 2 && cs2 == 1 && n2 > 0 {
                                // Every other element, at a stride the compiler knows: it
                                // gathers them with vector shuffles (an audio encoder's
                                // stride-2 columns).
                                every_other(
                                    std::slice::from_raw_parts_mut(dst, n2),
                                    std::slice::from_raw_parts(src, 2 * n2 - 1),
                                );
                            } else {
                                for o2 in 0..n2 {
                                    *dst.offset(o2 as isize * cs2) = *src.add(o2 * s2);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Copies the plane's unpadded part to the input-shaped result (`out` at its `(n, c)`
    /// element): [`Self::fill`]'s mirror.
    ///
    /// # Safety
    /// `out` is valid for the input's sizes at the geometry's input strides.
    unsafe fn crop(&self, plane: &[f32], out: *mut f32) {
        let (n, step) = (self.input[2], self.in_strides[2]);
        self.input_rows(|at, to| {
            let row = &plane[at..at + n];
            // SAFETY: the caller's contract.
            unsafe {
                let to = out.offset(to);
                if step == 1 {
                    std::ptr::copy_nonoverlapping(row.as_ptr(), to, n);
                } else {
                    for (e, &v) in row.iter().enumerate() {
                        *to.offset(e as isize * step) = v;
                    }
                }
            }
        });
    }
}

/// `to[i] = from[2 * i]` for every `i`, in fixed-size groups the compiler turns into vector
/// shuffles (element by element, a stride-2 bfloat16 im2col ran ~1 element a cycle).
#[inline(always)]
fn every_other<T: Copy>(to: &mut [T], from: &[T]) {
    const G: usize = 16;
    let whole = (to.len() / G).min(from.len() / (2 * G));
    for (d, s) in to[..whole * G]
        .chunks_exact_mut(G)
        .zip(from.chunks_exact(2 * G))
    {
        for i in 0..G {
            d[i] = s[2 * i];
        }
    }
    for i in whole * G..to.len() {
        to[i] = from[2 * i];
    }
}

/// Calls `f(n, c, plane)` for every `(n, c)` plane of the columns `cols`, in ranges of planes
/// split over `threads` when there is work enough, each with its thread's padded plane.
///
/// Planes go in the columns' memory order: a product that folded the batch into its columns
/// leaves the samples of a channel adjacent (`[C, k..., N, out...]`), and walking channel by
/// channel there read each tap's few hundred bytes a whole channel apart (col2im of the VAE's
/// columns above: 3.3 ms, against 1.6 walking the samples within a channel).
fn for_each_plane<T: PlaneElem>(
    g: &Geometry,
    cols: &View,
    threads: Option<&dyn SideBySide>,
    f: &dyn Fn(usize, usize, &mut [T]),
) -> Result<()> {
    let (n, c) = (cols.sizes[0], cols.sizes[1]);
    let planes = n * c;
    // Ranges of planes: a job per plane would be a scheduling step per few hundred values.
    let chunks = match threads {
        Some(t) if cols.numel() >= SERIAL_BELOW => (t.threads() * 4).min(planes),
        _ => 1,
    };
    let per = planes.div_ceil(chunks.max(1));
    let samples_inner = cols.strides[0].unsigned_abs() < cols.strides[1].unsigned_abs();
    let job = |j: usize| {
        T::with_plane(|plane| {
            plane.resize(g.plane(), T::default());
            for p in j * per..((j + 1) * per).min(planes) {
                let (s, ch) = if samples_inner {
                    (p % n, p / n)
                } else {
                    (p / c, p % c)
                };
                f(s, ch, plane);
            }
            Ok(())
        })
    };
    jobs(threads.filter(|_| chunks > 1), chunks, &job)
}

/// The element of `v` at `(n, c, 0...)`.
fn plane_offset(v: &View, n: usize, c: usize) -> isize {
    v.offset + n as isize * v.strides[0] + c as isize * v.strides[1]
}

/// Fails unless every view is float32.
fn float32_only(views: &[&View]) -> Result<()> {
    match views.iter().find(|v| v.dtype != DType::F32) {
        Some(v) => Err(Error::Internal(format!(
            "conv: float32 operands expected, got {}",
            v.dtype
        ))),
        None => Ok(()),
    }
}

/// `out = col2im(cols)` (see `ConvPart::ColumnsToInput`).
///
/// # Safety
/// Both views lie inside their buffers; `out` does not overlap `cols`.
pub(super) unsafe fn columns_to_input(
    k: &Conv,
    cols: &View,
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    float32_only(&[cols, out])?;
    if out.numel() == 0 {
        return Ok(());
    }
    let g = Geometry::new(k, cols, out);
    let plane = |s: usize, ch: usize, plane: &mut [f32]| {
        // SAFETY: the caller's contract; each plane writes only its own output plane.
        unsafe {
            let from = (cols.base as *const f32).offset(plane_offset(cols, s, ch));
            g.sum_plane(from, plane);
            g.crop(
                plane,
                (out.base as *mut f32).offset(plane_offset(out, s, ch)),
            );
        }
    };
    for_each_plane(&g, cols, threads, &plane)
}

/// `out = im2col(x)` (see `ConvPart::InputToColumns`): `out` is `[C, k..., N, out...]`, of x's
/// dtype (float32, bfloat16 or float16).
///
/// # Safety
/// Both views lie inside their buffers; `out` does not overlap `x`.
pub(super) unsafe fn input_to_columns(
    k: &Conv,
    x: &View,
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    match (x.dtype, out.dtype) {
        (DType::F32, DType::F32) => copy_columns::<f32>(k, x, out, threads),
        (DType::BF16, DType::BF16) | (DType::F16, DType::F16) => {
            copy_columns::<u16>(k, x, out, threads)
        }
        (a, b) => Err(Error::Internal(format!(
            "im2col: float32, bfloat16 or float16 input and columns of its dtype expected, \
             got {a} and {b}"
        ))),
    }
}

/// [`input_to_columns`] over elements of type `T`, the dtype's size.
///
/// # Safety
/// As [`input_to_columns`], and `T` is as wide as the views' dtype.
unsafe fn copy_columns<T: PlaneElem>(
    k: &Conv,
    x: &View,
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    if out.numel() == 0 {
        return Ok(());
    }
    // The columns as [N, C, k..., out...]: dims C, k..., N, out... permuted.
    let d = k.padding.len();
    let mut cols = View {
        base: out.base,
        dtype: out.dtype,
        sizes: Default::default(),
        strides: Default::default(),
        offset: out.offset,
    };
    for from in [1 + d, 0]
        .into_iter()
        .chain(1..1 + d)
        .chain(2 + d..2 + 2 * d)
    {
        cols.sizes.push(out.sizes[from]);
        cols.strides.push(out.strides[from]);
    }
    let g = Geometry::new(k, &cols, x);
    let plane = |s: usize, ch: usize, plane: &mut [T]| {
        // SAFETY: the caller's contract; each plane writes only its own columns.
        unsafe {
            g.fill((x.base as *const T).offset(plane_offset(x, s, ch)), plane);
            g.gather_plane(
                plane,
                (cols.base as *mut T).offset(plane_offset(&cols, s, ch)),
            );
        }
    };
    for_each_plane(&g, &cols, threads, &plane)
}
