//! Depthwise convolution (`KernelOp::Depthwise`): the forward and both gradients, vectorized
//! over channels.
//!
//! Each sample is first copied channels-last into a zero-padded scratch of the accumulation
//! type (f32 for f32, f16 and bf16; f64 for f64), channels rounded up to [`LANES`]: the same
//! tap of [`LANES`] neighbouring channels is then one vector load, whatever the spatial size
//! (EfficientNet's last stages are 1x1 and 2x2 with a thousand channels, ConvNeXt's 16x16 with
//! 48), the operand's layout or dtype, and the inner loops need no bounds checks. An output
//! vector is a sum over the taps in row-major tap order, `acc = fma(x, w, acc)` from zero (one
//! rounding per tap; libm's `fma` where the CPU has no FMA unit, so every CPU gives the same
//! bits), computed for [`UNITS`] output positions at once: independent sums, so the FMAs'
//! latency overlaps.
//!
//! The input gradient is the same loop over the gradient spread onto the input's grid (with a
//! stride above 1 the positions between stay zero) with the taps flipped. The weight gradient
//! of a channel and tap is one sum over the samples and output positions, in that order, of
//! the gradient times the tap's shifted input, [`TAP_GROUP`] taps at a time.

use super::elem::{read_f64, write_f64};
use super::View;
use deferfuse_fusion::ir::{DType, Depthwise, DepthwisePart};

/// Channels per vector: one 256-bit vector of f32.
const LANES: usize = 8;

/// Output positions whose sums are computed side by side.
const UNITS: usize = 8;

/// Taps whose weight-gradient sums run side by side, sharing each load of the gradient.
const TAP_GROUP: usize = 8;

/// The accumulation type: f32 or f64.
trait Acc:
    Copy + Default + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> + 'static
{
    /// The dtype whose elements are this type.
    const NATIVE: DType;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// `self * a + b` rounded once (an FMA instruction where the CPU has one, else libm's
    /// `fma`: the same bits either way).
    fn mul_add(self, a: Self, b: Self) -> Self;

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
}

/// One vector: [`LANES`] channels.
type Vector<T> = [T; LANES];

/// The geometry over exactly three spatial dims (missing leading dims have size 1, one tap).
struct Geometry {
    kernel: [usize; 3],
    stride: [usize; 3],
    padding: [usize; 3],
    dilation: [usize; 3],
    /// The convolution's input and output spatial sizes.
    input: [usize; 3],
    output: [usize; 3],
}

/// `v` (1 to 3 values) right-aligned into three, the rest `fill`.
fn three(v: &[usize], fill: usize) -> [usize; 3] {
    let mut out = [fill; 3];
    out[3 - v.len()..].copy_from_slice(v);
    out
}

/// A channels-last scratch `[d0, d1, d2, vectors]` of vectors, zeroed when made.
struct Scratch<T> {
    dims: [usize; 3],
    vectors: usize,
    data: Vec<Vector<T>>,
}

impl<T: Acc> Scratch<T> {
    fn new(dims: [usize; 3], channels: usize) -> Scratch<T> {
        let vectors = channels.div_ceil(LANES);
        Scratch {
            dims,
            vectors,
            data: vec![[T::default(); LANES]; dims.iter().product::<usize>() * vectors],
        }
    }

    /// The vector index of position `z`'s first channel vector.
    fn at(&self, z: [usize; 3]) -> usize {
        ((z[0] * self.dims[1] + z[1]) * self.dims[2] + z[2]) * self.vectors
    }
}

/// A `[N, C, spatial...]` view: element offset of `(n, c)` and the spatial strides as three.
fn plane_of(v: &View, n: usize, c: usize) -> (isize, [isize; 3]) {
    let d = v.sizes.len() - 2;
    let mut strides = [0isize; 3];
    strides[3 - d..].copy_from_slice(&v.strides[2..]);
    let off = v.offset + n as isize * v.strides[0] + c as isize * v.strides[1];
    (off, strides)
}

/// Calls `f(position, element offset)` for every position of `sizes` in row-major order.
fn each_position(sizes: [usize; 3], st: [isize; 3], mut f: impl FnMut([usize; 3], isize)) {
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
struct Placement {
    scale: [usize; 3],
    shift: [isize; 3],
}

impl Placement {
    /// Position `z` to `z + shift`.
    fn shifted(shift: [usize; 3]) -> Placement {
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

    fn apply(&self, i: usize, z: usize) -> usize {
        (z as isize * self.scale[i] as isize + self.shift[i]) as usize
    }
}

/// Copies sample `n` of `v` (spatial `sizes`) into `s` as `place` says.
///
/// # Safety
/// The view's elements lie inside its buffer.
unsafe fn fill<T: Acc>(
    s: &mut Scratch<T>,
    v: &View,
    n: usize,
    sizes: [usize; 3],
    place: Placement,
) {
    let r: [std::ops::Range<usize>; 3] =
        std::array::from_fn(|i| place.range(i, sizes[i], s.dims[i]));
    let step = place.scale[2] * s.vectors;
    for c in 0..v.sizes[1] {
        let (off, st) = plane_of(v, n, c);
        let (vector, lane) = (c / LANES, c % LANES);
        for i in r[0].clone() {
            for j in r[1].clone() {
                let k0 = r[2].start;
                let z = [place.apply(0, i), place.apply(1, j), place.apply(2, k0)];
                let mut at = s.at(z) + vector;
                let mut src = off + i as isize * st[0] + j as isize * st[1] + k0 as isize * st[2];
                for _ in r[2].clone() {
                    s.data[at][lane] = T::load(v.dtype, v.base, src);
                    at += step;
                    src += st[2];
                }
            }
        }
    }
}

/// Copies `s` (spatial `sizes`) into sample `n` of `out`, rounding to its dtype.
///
/// # Safety
/// As [`fill`].
unsafe fn store_sample<T: Acc>(s: &Scratch<T>, out: &View, n: usize, sizes: [usize; 3]) {
    for c in 0..out.sizes[1] {
        let (off, st) = plane_of(out, n, c);
        let (vector, lane) = (c / LANES, c % LANES);
        for i in 0..sizes[0] {
            for j in 0..sizes[1] {
                let mut at = s.at([i, j, 0]) + vector;
                let mut dst = off + i as isize * st[0] + j as isize * st[1];
                for _ in 0..sizes[2] {
                    s.data[at][lane].store(out.dtype, out.base, dst);
                    at += s.vectors;
                    dst += st[2];
                }
            }
        }
    }
}

/// Computes `k` for operands `a`, `b` (see `DepthwisePart`) into `out`, a view of the
/// operand's dtype.
pub(super) fn run(k: &Depthwise, a: &View, b: &View, out: &View) {
    let (input, output) = match k.part {
        DepthwisePart::Forward => (&a.sizes[2..], &out.sizes[2..]),
        DepthwisePart::InputGrad => (&out.sizes[2..], &a.sizes[2..]),
        DepthwisePart::WeightGrad => (&b.sizes[2..], &a.sizes[2..]),
    };
    let g = Geometry {
        kernel: three(&k.kernel, 1),
        stride: three(&k.stride, 1),
        padding: three(&k.padding, 0),
        dilation: three(&k.dilation, 1),
        input: three(input, 1),
        output: three(output, 1),
    };
    // SAFETY: the runtime checked every operand's view against its buffer, and the op's
    // shapes against each other when it was recorded.
    unsafe {
        match out.dtype {
            DType::F64 => run_as::<f64>(k.part, &g, a, b, out),
            _ => run_as::<f32>(k.part, &g, a, b, out),
        }
    }
}

/// Every tap's offset (in vectors) in a scratch of `dims` with `vectors` per position, in
/// row-major tap order (`flip`: reversed).
fn tap_offsets(g: &Geometry, dims: [usize; 3], vectors: usize, flip: bool) -> Vec<usize> {
    let mut offs = Vec::with_capacity(g.kernel.iter().product());
    for i in 0..g.kernel[0] {
        for j in 0..g.kernel[1] {
            for l in 0..g.kernel[2] {
                let z = [i * g.dilation[0], j * g.dilation[1], l * g.dilation[2]];
                offs.push(((z[0] * dims[1] + z[1]) * dims[2] + z[2]) * vectors);
            }
        }
    }
    if flip {
        offs.reverse();
    }
    offs
}

/// The scratch index (in vectors) of the first tap of each output position of `sizes`, read
/// at `stride` from a scratch of `dims` with `vectors` per position.
fn first_taps(
    sizes: [usize; 3],
    stride: [usize; 3],
    dims: [usize; 3],
    vectors: usize,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(sizes.iter().product());
    each_position(sizes, [0; 3], |z, _| {
        let p = [z[0] * stride[0], z[1] * stride[1], z[2] * stride[2]];
        out.push(((p[0] * dims[1] + p[1]) * dims[2] + p[2]) * vectors);
    });
    out
}

unsafe fn run_as<T: Acc>(part: DepthwisePart, g: &Geometry, a: &View, b: &View, out: &View) {
    let (n, c) = (a.sizes[0], a.sizes[1]);
    let padded: [usize; 3] = std::array::from_fn(|i| g.input[i] + 2 * g.padding[i]);
    match part {
        DepthwisePart::Forward | DepthwisePart::InputGrad => {
            let forward = part == DepthwisePart::Forward;
            // The input gradient is a stride-1 convolution of the gradient spread onto the
            // input's grid (gradient position o at o * stride - padding + before, where
            // `before` puts input position 0's last tap at 0) with the taps flipped.
            let before: [usize; 3] = std::array::from_fn(|i| (g.kernel[i] - 1) * g.dilation[i]);
            let (dims, stride, result) = if forward {
                (padded, g.stride, g.output)
            } else {
                (
                    std::array::from_fn(|i| g.input[i] + before[i]),
                    [1; 3],
                    g.input,
                )
            };
            let mut x = Scratch::<T>::new(dims, c);
            let taps = tap_offsets(g, dims, x.vectors, !forward);
            let starts = first_taps(result, stride, dims, x.vectors);
            let w = weights::<T>(b, c, taps.len());
            let mut acc = Scratch::<T>::new(result, c);
            let place = if forward {
                Placement::shifted(g.padding)
            } else {
                Placement {
                    scale: g.stride,
                    shift: std::array::from_fn(|i| before[i] as isize - g.padding[i] as isize),
                }
            };
            let sizes = if forward { g.input } else { g.output };
            for ni in 0..n {
                // Every sample writes the same positions: the others stay zero.
                fill(&mut x, a, ni, sizes, place);
                sum_over_taps(&x.data, &taps, &w, &starts, x.vectors, &mut acc.data);
                store_sample(&acc, out, ni, result);
            }
        }
        DepthwisePart::WeightGrad => {
            let mut x = Scratch::<T>::new(padded, c);
            let taps = tap_offsets(g, padded, x.vectors, false);
            let starts = first_taps(g.output, g.stride, padded, x.vectors);
            let mut grad = Scratch::<T>::new(g.output, c);
            let groups = taps.len().div_ceil(TAP_GROUP);
            let mut sums = vec![[T::default(); LANES]; groups * TAP_GROUP * x.vectors];
            for ni in 0..n {
                fill(&mut x, b, ni, g.input, Placement::shifted(g.padding));
                fill(&mut grad, a, ni, g.output, Placement::shifted([0; 3]));
                tap_dots(&x.data, &grad.data, &taps, &starts, x.vectors, &mut sums);
            }
            for ci in 0..c {
                let (off, _) = plane_of(out, ci, 0);
                for t in 0..taps.len() {
                    let v = sums[t * x.vectors + ci / LANES][ci % LANES];
                    v.store(out.dtype, out.base, off + weight_offset(out, t));
                }
            }
        }
    }
}

/// The element offset of tap `t` (row-major over the kernel dims) in a `[C, 1, k...]` view,
/// relative to its channel's first element.
fn weight_offset(w: &View, mut t: usize) -> isize {
    let mut off = 0isize;
    for i in (2..w.sizes.len()).rev() {
        off += (t % w.sizes[i]) as isize * w.strides[i];
        t /= w.sizes[i];
    }
    off
}

/// The weights `[C, 1, k...]` as `[taps, vectors]` (channels past `c` are zero).
///
/// # Safety
/// The view's elements lie inside its buffer.
unsafe fn weights<T: Acc>(w: &View, c: usize, taps: usize) -> Vec<Vector<T>> {
    let vectors = c.div_ceil(LANES);
    let mut out = vec![[T::default(); LANES]; taps * vectors];
    for ci in 0..c {
        let (off, _) = plane_of(w, ci, 0);
        for t in 0..taps {
            out[t * vectors + ci / LANES][ci % LANES] =
                T::load(w.dtype, w.base, off + weight_offset(w, t));
        }
    }
    out
}

/// `acc[p][v] = sum over taps t of x[starts[p] + taps[t] + v] * w[t][v]` for every output
/// position `p` and channel vector `v`.
fn sum_over_taps<T: Acc>(
    x: &[Vector<T>],
    taps: &[usize],
    w: &[Vector<T>],
    starts: &[usize],
    vectors: usize,
    acc: &mut [Vector<T>],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { sum_over_taps_avx2(x, taps, w, starts, vectors, acc) };
    }
    sum_over_taps_portable(x, taps, w, starts, vectors, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_over_taps_avx2<T: Acc>(
    x: &[Vector<T>],
    taps: &[usize],
    w: &[Vector<T>],
    starts: &[usize],
    vectors: usize,
    acc: &mut [Vector<T>],
) {
    sum_over_taps_portable(x, taps, w, starts, vectors, acc)
}

#[inline(always)]
fn sum_over_taps_portable<T: Acc>(
    x: &[Vector<T>],
    taps: &[usize],
    w: &[Vector<T>],
    starts: &[usize],
    vectors: usize,
    acc: &mut [Vector<T>],
) {
    let reach = starts.iter().max().copied().unwrap_or(0) + taps.iter().max().copied().unwrap_or(0);
    assert!(reach + vectors <= x.len() && w.len() == taps.len() * vectors);
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    // Raw pointers: the eight positions' bases and the weight's stay in registers across the
    // taps (indexing reloaded each base from memory per tap and unit).
    let mut blocks = starts.chunks_exact(UNITS);
    let mut p0 = 0;
    for block in blocks.by_ref() {
        for v in 0..vectors {
            // SAFETY: every read is below `reach + vectors`, checked above.
            unsafe {
                let bases: [*const Vector<T>; UNITS] =
                    std::array::from_fn(|u| xp.add(block[u] + v));
                let mut sums = [[T::default(); LANES]; UNITS];
                let mut wt = wp.add(v);
                for &tap in taps {
                    let wv = *wt;
                    wt = wt.add(vectors);
                    for (sum, base) in sums.iter_mut().zip(&bases) {
                        let xv = &*base.add(tap);
                        for l in 0..LANES {
                            sum[l] = xv[l].mul_add(wv[l], sum[l]);
                        }
                    }
                }
                for (u, sum) in sums.iter().enumerate() {
                    acc[(p0 + u) * vectors + v] = *sum;
                }
            }
        }
        p0 += UNITS;
    }
    for (u, &s) in blocks.remainder().iter().enumerate() {
        for v in 0..vectors {
            let mut sum = [T::default(); LANES];
            for (t, &tap) in taps.iter().enumerate() {
                let wv = w[t * vectors + v];
                // SAFETY: as above.
                let xv = unsafe { x.get_unchecked(s + tap + v) };
                for l in 0..LANES {
                    sum[l] = xv[l].mul_add(wv[l], sum[l]);
                }
            }
            acc[(p0 + u) * vectors + v] = sum;
        }
    }
}

/// `sums[t][v] += grad[p][v] * x[starts[p] + taps[t] + v]` over the output positions `p` in
/// order, for every tap `t` and channel vector `v` (`sums` has a multiple of [`TAP_GROUP`]
/// taps).
fn tap_dots<T: Acc>(
    x: &[Vector<T>],
    grad: &[Vector<T>],
    taps: &[usize],
    starts: &[usize],
    vectors: usize,
    sums: &mut [Vector<T>],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { tap_dots_avx2(x, grad, taps, starts, vectors, sums) };
    }
    tap_dots_portable(x, grad, taps, starts, vectors, sums)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tap_dots_avx2<T: Acc>(
    x: &[Vector<T>],
    grad: &[Vector<T>],
    taps: &[usize],
    starts: &[usize],
    vectors: usize,
    sums: &mut [Vector<T>],
) {
    tap_dots_portable(x, grad, taps, starts, vectors, sums)
}

#[inline(always)]
fn tap_dots_portable<T: Acc>(
    x: &[Vector<T>],
    grad: &[Vector<T>],
    taps: &[usize],
    starts: &[usize],
    vectors: usize,
    sums: &mut [Vector<T>],
) {
    let reach = starts.iter().max().copied().unwrap_or(0) + taps.iter().max().copied().unwrap_or(0);
    assert!(reach + vectors <= x.len() && grad.len() >= starts.len() * vectors);
    for (gi, group) in taps.chunks(TAP_GROUP).enumerate() {
        // A short last group repeats its last tap; its extra sums are never read.
        let offs: [usize; TAP_GROUP] = std::array::from_fn(|i| group[i.min(group.len() - 1)]);
        for v in 0..vectors {
            let at = |i: usize| (gi * TAP_GROUP + i) * vectors + v;
            let mut acc: [Vector<T>; TAP_GROUP] = std::array::from_fn(|i| sums[at(i)]);
            for (p, &s) in starts.iter().enumerate() {
                let gv = grad[p * vectors + v];
                for (t, &off) in offs.iter().enumerate() {
                    // SAFETY: below `reach + vectors`, checked above.
                    let xv = unsafe { x.get_unchecked(s + off + v) };
                    for l in 0..LANES {
                        acc[t][l] = gv[l].mul_add(xv[l], acc[t][l]);
                    }
                }
            }
            for (i, a) in acc.iter().enumerate() {
                sums[at(i)] = *a;
            }
        }
    }
}
