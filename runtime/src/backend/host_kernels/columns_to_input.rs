//! col2im (`ConvPart::ColumnsToInput`): the gradient of a convolution's columns `[N, C, k...,
//! out...]` added back at the input positions each tap read, the last step of a strided
//! convolution's input gradient and so of a transposed convolution's forward.
//!
//! Composed from ops it was K strided read-modify-write adds, one per kernel tap, each over the
//! whole padded input with rows of a few elements (a VAE's 4x4 stride-2 transposed
//! convolution, `[64, 64, 7, 7]` -> `[64, 32, 14, 14]`, spent 2.4 ms in them). Here each `(n,
//! c)` plane is summed in a zeroed padded plane that stays in L1, every tap in turn, and the
//! plane is then cropped into the output: one write per input element.
//!
//! Each element sums its taps in the kernel's row-major tap order from +0.0, the order of the
//! strided adds this replaces, so the results are their bits (the zero's sign included), on
//! any thread count.

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
    /// The output's strides over its spatial dims.
    out_strides: [isize; 3],
}

impl Geometry {
    fn new(k: &Conv, cols: &View, out: &View) -> Geometry {
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
            out_strides: [0; 3],
        };
        for i in 0..d {
            let j = lead + i;
            g.kernel[j] = cols.sizes[2 + i];
            g.out[j] = cols.sizes[2 + d + i];
            g.input[j] = out.sizes[2 + i];
            g.padding[j] = k.padding[i];
            g.stride[j] = k.stride[i];
            g.dilation[j] = k.dilation[i];
            g.padded[j] = g.input[j] + 2 * g.padding[j];
            g.col_strides[j] = cols.strides[2 + i];
            g.col_strides[3 + j] = cols.strides[2 + d + i];
            g.out_strides[j] = out.strides[2 + i];
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
        // Within one (t0, t1) the taps along the last dim go innermost: an element of a row
        // takes at most one value from each (o0, o1), so each element still sums its taps in
        // row-major tap order.
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
                            if s2 == 1 && cs2 == 1 {
                                for o2 in 0..n2 {
                                    *dst.add(o2) += *a.add(o2);
                                }
                            } else if paired && t2 + 1 < self.kernel[2] {
                                // Taps t2 and t2 + 1 at stride 2 fill the even and the odd
                                // elements of one run: one pass over contiguous elements
                                // (each takes one of the two, so the order is unchanged).
                                let b = a.offset(cs[2]);
                                for o2 in 0..n2 {
                                    *dst.add(2 * o2) += *a.add(o2);
                                    *dst.add(2 * o2 + 1) += *b.add(o2);
                                }
                                t2 += 1;
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

    /// Copies the plane's unpadded part to the output (`out` at its `(n, c)` element).
    ///
    /// # Safety
    /// `out` is valid for the input's sizes at the geometry's output strides.
    unsafe fn crop(&self, plane: &[f32], out: *mut f32) {
        let (p1, p2) = (self.padded[1], self.padded[2]);
        let [q0, q1, q2] = self.padding;
        let os = &self.out_strides;
        for i0 in 0..self.input[0] {
            for i1 in 0..self.input[1] {
                let from = ((i0 + q0) * p1 + i1 + q1) * p2 + q2;
                let row = &plane[from..from + self.input[2]];
                let to = out.offset(i0 as isize * os[0] + i1 as isize * os[1]);
                if os[2] == 1 {
                    std::ptr::copy_nonoverlapping(row.as_ptr(), to, row.len());
                } else {
                    for (e, &v) in row.iter().enumerate() {
                        *to.offset(e as isize * os[2]) = v;
                    }
                }
            }
        }
    }
}

/// `out = col2im(cols)` (see `ConvPart::ColumnsToInput`), the planes split over `threads`
/// when there is work enough.
///
/// # Safety
/// Both views lie inside their buffers and are float32; `out` does not overlap `cols`.
pub(super) unsafe fn run(
    k: &Conv,
    cols: &View,
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    if cols.dtype != DType::F32 || out.dtype != DType::F32 {
        return Err(Error::Internal(format!(
            "conv: float32 columns expected, got {} -> {}",
            cols.dtype, out.dtype
        )));
    }
    if out.numel() == 0 {
        return Ok(());
    }
    let g = Geometry::new(k, cols, out);
    let (n, c) = (out.sizes[0], out.sizes[1]);
    let planes = n * c;
    let (cols_base, out_base) = (cols.base as *const f32, out.base as *mut f32);
    // Ranges of planes: a job per plane would be a scheduling step per few hundred values.
    let chunks = match threads {
        Some(t) if cols.numel() >= SERIAL_BELOW => (t.threads() * 4).min(planes),
        _ => 1,
    };
    let per = planes.div_ceil(chunks);
    // Planes in the columns' memory order: a product that folded the batch into its columns
    // leaves the samples of a channel adjacent ([C, k..., N, out...]), so walking channel by
    // channel there read each tap's few hundred bytes a whole channel apart (3.3 ms for the
    // VAE's columns above, against 1.6 walking the samples within a channel).
    let samples_inner = cols.strides[0].unsigned_abs() < cols.strides[1].unsigned_abs();
    let job = |j: usize| {
        PLANE.with(|cell| {
            let mut plane = cell.borrow_mut();
            plane.resize(g.plane(), 0.0);
            for p in j * per..((j + 1) * per).min(planes) {
                let (s, ch) = if samples_inner {
                    (p % n, p / n)
                } else {
                    (p / c, p % c)
                };
                // SAFETY: the caller's contract; each plane writes only its own output plane.
                unsafe {
                    let from = cols_base.offset(
                        cols.offset + s as isize * cols.strides[0] + ch as isize * cols.strides[1],
                    );
                    g.sum_plane(from, &mut plane);
                    let to = out_base.offset(
                        out.offset + s as isize * out.strides[0] + ch as isize * out.strides[1],
                    );
                    g.crop(&plane, to);
                }
            }
            Ok(())
        })
    };
    jobs(threads.filter(|_| chunks > 1), chunks, &job)
}
