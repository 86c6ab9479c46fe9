//! Samples of `[N, C, spatial...]` views copied channels-last into scratch and back: a vector
//! of [`LANES`] neighbouring channels per position, the accumulation type's values (f32 for
//! f32, f16 and bf16; f64 for f64), so the depthwise loops read one tap of [`LANES`] channels
//! with one vector load whatever the operand's layout or dtype.

use super::super::elem::{read_f64, write_f64};
use super::super::View;
use deferfuse_fusion::ir::DType;

/// Channels per vector: one 256-bit vector of f32.
pub(super) const LANES: usize = 8;

/// The accumulation type: f32 or f64.
pub(super) trait Acc: Copy + Default + 'static {
    /// The dtype whose elements are this type.
    const NATIVE: DType;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// `self * a + b` rounded once (an FMA instruction where the CPU has one, else libm's
    /// `fma`: the same bits either way).
    fn mul_add(self, a: Self, b: Self) -> Self;
    fn is_finite(self) -> bool;

    /// Element `off` of a `dtype` buffer.
    ///
    /// # Safety
    /// As [`read_f64`].
    #[inline(always)]
    unsafe fn load(dtype: DType, p: *const u8, off: isize) -> Self {
        if dtype == Self::NATIVE {
            *(p as *const Self).offset(off)
        } else {
            Self::from_f64(read_f64(dtype, p, off))
        }
    }

    /// Stores the value into element `off` of a `dtype` buffer, rounding it to `dtype`.
    ///
    /// # Safety
    /// As [`write_f64`].
    #[inline(always)]
    unsafe fn store(self, dtype: DType, p: *mut u8, off: isize) {
        if dtype == Self::NATIVE {
            *(p as *mut Self).offset(off) = self;
        } else {
            write_f64(dtype, p, off, self.to_f64());
        }
    }
}

impl Acc for f32 {
    const NATIVE: DType = DType::F32;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        // Exact: every value read is an f32, f16 or bf16.
        v as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        f32::mul_add(self, a, b)
    }
    #[inline(always)]
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
}

impl Acc for f64 {
    const NATIVE: DType = DType::F64;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        f64::mul_add(self, a, b)
    }
    #[inline(always)]
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
}

/// One vector: [`LANES`] channels, aligned to its size for f32 (so no f32 vector load straddles
/// two cache lines; an f64 vector is two loads, each inside one line).
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
pub(super) struct Vector<T>(pub(super) [T; LANES]);

// `Scratch::lanes` reads vectors as their values back to back: no padding between them.
const _: () = assert!(std::mem::size_of::<Vector<f32>>() == 4 * LANES);
const _: () = assert!(std::mem::size_of::<Vector<f64>>() == 8 * LANES);

impl<T> std::ops::Deref for Vector<T> {
    type Target = [T; LANES];
    fn deref(&self) -> &[T; LANES] {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Vector<T> {
    fn deref_mut(&mut self) -> &mut [T; LANES] {
        &mut self.0
    }
}

/// A channels-last scratch `[d0, d1, d2, vectors]` of vectors, zeroed when made.
pub(super) struct Scratch<T> {
    pub(super) dims: [usize; 3],
    pub(super) vectors: usize,
    pub(super) data: Vec<Vector<T>>,
}

impl<T: Acc> Scratch<T> {
    pub(super) fn new(dims: [usize; 3], channels: usize) -> Scratch<T> {
        let vectors = channels.div_ceil(LANES);
        Scratch {
            dims,
            vectors,
            data: vec![Vector::default(); dims.iter().product::<usize>() * vectors],
        }
    }

    /// The scratch as one slice of values, channel `c` of vector index `v` at `v * LANES + c`.
    pub(super) fn lanes(&self) -> &[T] {
        // SAFETY: `Vector<T>` is `repr(C)` around `[T; LANES]`, its size a multiple of it.
        unsafe {
            std::slice::from_raw_parts(self.data.as_ptr() as *const T, self.data.len() * LANES)
        }
    }

    /// As [`Scratch::lanes`], writable.
    pub(super) fn lanes_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `lanes`.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.data.as_mut_ptr() as *mut T,
                self.data.len() * LANES,
            )
        }
    }

    /// The vector index of position `z`'s first channel vector.
    pub(super) fn at(&self, z: [usize; 3]) -> usize {
        ((z[0] * self.dims[1] + z[1]) * self.dims[2] + z[2]) * self.vectors
    }
}

/// A `[N, C, spatial...]` view's element offsets, its strides read once (reading them per
/// channel from the view cost more than EfficientNet's 1x1 convolutions themselves).
#[derive(Clone, Copy)]
pub(super) struct Planes {
    offset: isize,
    sample: isize,
    channel: isize,
    /// The spatial strides, as three.
    pub(super) spatial: [isize; 3],
}

impl Planes {
    pub(super) fn of(v: &View) -> Planes {
        let d = v.sizes.len() - 2;
        let mut spatial = [0isize; 3];
        spatial[3 - d..].copy_from_slice(&v.strides[2..]);
        Planes {
            offset: v.offset,
            sample: v.strides[0],
            channel: v.strides[1],
            spatial,
        }
    }

    /// The element offset of `(n, c)`'s first element.
    #[inline(always)]
    pub(super) fn at(&self, n: usize, c: usize) -> isize {
        self.offset + n as isize * self.sample + c as isize * self.channel
    }
}

/// Calls `f(position, element offset)` for every position of `sizes` in row-major order.
pub(super) fn each_position(
    sizes: [usize; 3],
    st: [isize; 3],
    mut f: impl FnMut([usize; 3], isize),
) {
    for i in 0..sizes[0] {
        for j in 0..sizes[1] {
            for k in 0..sizes[2] {
                f(
                    [i, j, k],
                    i as isize * st[0] + j as isize * st[1] + k as isize * st[2],
                );
            }
        }
    }
}

/// Where a view's positions go in a scratch: position `z` to `z * scale + shift` in each dim;
/// those that land outside the scratch are left out.
#[derive(Clone, Copy)]
pub(super) struct Placement {
    pub(super) scale: [usize; 3],
    pub(super) shift: [isize; 3],
}

impl Placement {
    /// Position `z` to `z + shift`.
    pub(super) fn shifted(shift: [usize; 3]) -> Placement {
        Placement {
            scale: [1; 3],
            shift: shift.map(|v| v as isize),
        }
    }

    /// The positions `z < size` of dim `i` that land in `0..dim`.
    fn range(&self, i: usize, size: usize, dim: usize) -> std::ops::Range<usize> {
        let (m, a) = (self.scale[i] as isize, self.shift[i]);
        let lo = if a >= 0 { 0 } else { (-a + m - 1) / m } as usize;
        let last = dim as isize - 1 - a;
        let hi = if last < 0 {
            0
        } else {
            (last / m + 1).min(size as isize) as usize
        };
        lo.min(hi)..hi
    }

    pub(super) fn apply(&self, i: usize, z: usize) -> usize {
        (z as isize * self.scale[i] as isize + self.shift[i]) as usize
    }
}

/// Copies sample `n` of `v` (spatial `sizes`) into `s` as `place` says.
///
/// # Safety
/// The view's elements lie inside its buffer.
pub(super) unsafe fn fill<T: Acc>(
    s: &mut Scratch<T>,
    v: &View,
    n: usize,
    sizes: [usize; 3],
    place: Placement,
) {
    let r: [std::ops::Range<usize>; 3] =
        std::array::from_fn(|i| place.range(i, sizes[i], s.dims[i]));
    let full = v.sizes[1] / LANES * LANES;
    let planes = Planes::of(v);
    // Positions at the start of each row already copied for channels below `full`.
    let mut tiled = 0;
    #[cfg(target_arch = "x86_64")]
    if let Some(s32) = (s as &mut dyn std::any::Any).downcast_mut::<Scratch<f32>>() {
        if v.dtype == DType::F32 && place.scale[2] == 1 && planes.spatial[2] == 1 && avx::ok() {
            tiled = avx::fill(s32, v, &planes, n, &r, place, full);
        }
    }
    // The rest position by position, its channels in the inner loop: one contiguous run of the
    // scratch, and of the view too when a channel's plane is one element (1x1 convolutions).
    let (st, channels) = (planes.spatial, v.sizes[1]);
    for i in r[0].clone() {
        for j in r[1].clone() {
            for k in r[2].clone() {
                let first = if k - r[2].start < tiled { full } else { 0 };
                let z = [place.apply(0, i), place.apply(1, j), place.apply(2, k)];
                let at = s.at(z) * LANES;
                let src =
                    planes.at(n, 0) + i as isize * st[0] + j as isize * st[1] + k as isize * st[2];
                let dst = &mut s.lanes_mut()[at..at + channels];
                for (c, d) in dst.iter_mut().enumerate().skip(first) {
                    *d = T::load(v.dtype, v.base, src + c as isize * planes.channel);
                }
            }
        }
    }
}

/// Copies `s` (spatial `sizes`) into sample `n` of `out`, rounding to its dtype.
///
/// # Safety
/// As [`fill`].
pub(super) unsafe fn store_sample<T: Acc>(s: &Scratch<T>, out: &View, n: usize, sizes: [usize; 3]) {
    let full = out.sizes[1] / LANES * LANES;
    let planes = Planes::of(out);
    let mut tiled = 0;
    #[cfg(target_arch = "x86_64")]
    if let Some(s32) = (s as &dyn std::any::Any).downcast_ref::<Scratch<f32>>() {
        if out.dtype == DType::F32 && planes.spatial[2] == 1 && avx::ok() {
            tiled = avx::store(s32, out, &planes, n, sizes, full);
        }
    }
    // The rest position by position, as in `fill`.
    let (st, channels) = (planes.spatial, out.sizes[1]);
    for i in 0..sizes[0] {
        for j in 0..sizes[1] {
            for k in 0..sizes[2] {
                let first = if k < tiled { full } else { 0 };
                let at = s.at([i, j, k]) * LANES;
                let dst =
                    planes.at(n, 0) + i as isize * st[0] + j as isize * st[1] + k as isize * st[2];
                for (c, v) in s.lanes()[at..at + channels].iter().enumerate().skip(first) {
                    v.store(out.dtype, out.base, dst + c as isize * planes.channel);
                }
            }
        }
    }
}

/// The f32 copies with AVX: [`LANES`] channels by [`LANES`] positions of a row at a time,
/// transposed in registers (eight row loads, eight vector stores), the way the CPU backend's
/// column gathers run; an element-by-element copy took as long as a 7x7 convolution's taps.
#[cfg(target_arch = "x86_64")]
mod avx {
    use super::{Placement, Planes, Scratch, View, LANES};
    use crate::backend::cpu::columns::avx::transpose8;
    use std::arch::x86_64::*;
    use std::ops::Range;

    pub(super) fn ok() -> bool {
        std::arch::is_x86_feature_detected!("avx")
    }

    /// `fill`'s copy for the channels below `full` (a multiple of [`LANES`]) and the first
    /// positions of each row, in whole tiles; returns how many positions of a row it copied.
    /// The view's rows have unit stride and `place` does not scale them.
    ///
    /// # Safety
    /// As `fill`; the CPU has AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn fill(
        s: &mut Scratch<f32>,
        v: &View,
        planes: &Planes,
        n: usize,
        r: &[Range<usize>; 3],
        place: Placement,
        full: usize,
    ) -> usize {
        let tiled = r[2].len() / LANES * LANES;
        let st = planes.spatial;
        let base = v.base as *const f32;
        let (vectors, data) = (s.vectors, s.data.as_mut_ptr() as *mut f32);
        for c0 in (0..full).step_by(LANES) {
            let offs: [isize; LANES] = std::array::from_fn(|q| planes.at(n, c0 + q));
            for i in r[0].clone() {
                for j in r[1].clone() {
                    let row = i as isize * st[0] + j as isize * st[1];
                    for k in (r[2].start..r[2].start + tiled).step_by(LANES) {
                        let rows = offs.map(|o| _mm256_loadu_ps(base.offset(o + row + k as isize)));
                        let z = [place.apply(0, i), place.apply(1, j), place.apply(2, k)];
                        let at = s.at(z) + c0 / LANES;
                        for (m, t) in transpose8(rows).into_iter().enumerate() {
                            _mm256_storeu_ps(data.add((at + m * vectors) * LANES), t);
                        }
                    }
                }
            }
        }
        tiled
    }

    /// `store_sample`'s copy for the channels below `full` and the first positions of each
    /// row, in whole tiles; returns how many positions of a row it copied. The output's rows
    /// have unit stride.
    ///
    /// # Safety
    /// As `store_sample`; the CPU has AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn store(
        s: &Scratch<f32>,
        out: &View,
        planes: &Planes,
        n: usize,
        sizes: [usize; 3],
        full: usize,
    ) -> usize {
        let tiled = sizes[2] / LANES * LANES;
        let st = planes.spatial;
        let base = out.base as *mut f32;
        let (vectors, data) = (s.vectors, s.data.as_ptr() as *const f32);
        for c0 in (0..full).step_by(LANES) {
            let offs: [isize; LANES] = std::array::from_fn(|q| planes.at(n, c0 + q));
            for i in 0..sizes[0] {
                for j in 0..sizes[1] {
                    let row = i as isize * st[0] + j as isize * st[1];
                    for k in (0..tiled).step_by(LANES) {
                        let at = s.at([i, j, k]) + c0 / LANES;
                        let vecs: [__m256; LANES] = std::array::from_fn(|m| {
                            _mm256_loadu_ps(data.add((at + m * vectors) * LANES))
                        });
                        for (q, t) in transpose8(vecs).into_iter().enumerate() {
                            _mm256_storeu_ps(base.offset(offs[q] + row + k as isize), t);
                        }
                    }
                }
            }
        }
        tiled
    }
}
