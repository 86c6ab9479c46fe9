//! Samples of `[N, C, spatial...]` views copied channels-last into scratch and back: a vector
//! of [`LANES`] neighbouring channels per position, the accumulation type's values (f32 for
//! f32, f16 and bf16; f64 for f64), so the depthwise loops read one tap of [`LANES`] channels
//! with one vector load whatever the operand's layout or dtype.

use super::super::elem::{read_f64, write_f64};
use super::super::View;
use deferfuse_fusion::ir::DType;
use half::{bf16, f16};

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
    // Half-precision elements convert directly, not through f64 (`read_f64`'s `half`
    // conversions from f64 are software loops; a bf16 depthwise layer spent most of its time
    // there): the same values, a NaN made quiet as `read_f64` does.
    #[inline(always)]
    unsafe fn load(dtype: DType, p: *const u8, off: isize) -> f32 {
        match dtype {
            DType::F32 => *(p as *const f32).offset(off),
            DType::BF16 => bf16::from_bits(*(p as *const u16).offset(off)).to_f32(),
            DType::F16 => f16::from_bits(*(p as *const u16).offset(off)).to_f32(),
            _ => read_f64(dtype, p, off) as f32,
        }
    }
    // Rounded once to nearest even, as `write_f64` rounds the same (exactly widened) value.
    #[inline(always)]
    unsafe fn store(self, dtype: DType, p: *mut u8, off: isize) {
        match dtype {
            DType::F32 => *(p as *mut f32).offset(off) = self,
            DType::BF16 => *(p as *mut u16).offset(off) = bf16::from_f32(self).to_bits(),
            DType::F16 => *(p as *mut u16).offset(off) = f16::from_f32(self).to_bits(),
            _ => write_f64(dtype, p, off, self as f64),
        }
    }
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
        if place.scale[2] == 1 && planes.spatial[2] == 1 && avx::ok(v.dtype) {
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
        if planes.spatial[2] == 1 && avx::ok(out.dtype) {
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

/// The copies with AVX: [`LANES`] channels by [`LANES`] positions of a row at a time,
/// transposed in registers (eight row loads, eight vector stores), the way the CPU backend's
/// column gathers run; an element-by-element copy took as long as a 7x7 convolution's taps.
/// Half-precision rows are widened as they are loaded and rounded as they are stored, with
/// [`Acc`]'s conversions for f32: a bf16 MobileNetV2's depthwise layers ran ~10x their f32
/// time element by element (`[8, 96, 32, 32]` stride 2: 2.1 ms against 0.21).
#[cfg(target_arch = "x86_64")]
mod avx {
    use super::{Placement, Planes, Scratch, View, LANES};
    use crate::backend::cpu::columns::avx::transpose8;
    use deferfuse_fusion::ir::DType;
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Whether these copies take `dtype` on this CPU: f32, f16 or bf16, with AVX, AVX2 and
    /// F16C (every x86 core since 2013).
    pub(super) fn ok(dtype: DType) -> bool {
        use std::arch::is_x86_feature_detected as has;
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
            && has!("avx")
            && has!("avx2")
            && has!("f16c")
    }

    /// Eight consecutive `dtype` elements at element `off` of `base`, as f32: exact, a bf16
    /// NaN made quiet (as `half` widens it).
    ///
    /// # Safety
    /// The eight elements lie inside the buffer; [`ok`] holds for `dtype`.
    #[inline(always)]
    unsafe fn load8(dtype: DType, base: *const u8, off: isize) -> __m256 {
        let halves = || _mm_loadu_si128((base as *const u16).offset(off) as *const __m128i);
        match dtype {
            DType::BF16 => {
                let h = _mm256_cvtepu16_epi32(halves());
                let magnitude = _mm256_and_si256(h, _mm256_set1_epi32(0x7fff));
                let nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f80));
                let quiet = _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi32(0x40)));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(quiet))
            }
            DType::F16 => _mm256_cvtph_ps(halves()),
            _ => _mm256_loadu_ps((base as *const f32).offset(off)),
        }
    }

    /// Stores `v` as eight consecutive `dtype` elements at element `off` of `base`, each
    /// rounded to nearest even (a NaN keeps its high payload bits, made quiet), as
    /// `half::bf16::from_f32` and `half::f16::from_f32` round.
    ///
    /// # Safety
    /// As [`load8`].
    #[inline(always)]
    unsafe fn store8(dtype: DType, base: *mut u8, off: isize, v: __m256) {
        let to = (base as *mut u16).offset(off) as *mut __m128i;
        match dtype {
            DType::BF16 => {
                let b = _mm256_castps_si256(v);
                let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
                let bias = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff));
                let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(b, bias));
                let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(0x40));
                let h = _mm256_blendv_epi8(rounded, quiet, nan);
                // Each 32-bit lane holds its 16 bits: pack within the 128-bit halves, then
                // bring the two halves' results together.
                let packed = _mm256_packus_epi32(h, h);
                let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
                _mm_storeu_si128(to, _mm256_castsi256_si128(ordered));
            }
            DType::F16 => _mm_storeu_si128(to, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)),
            _ => _mm256_storeu_ps((base as *mut f32).offset(off), v),
        }
    }

    /// `fill`'s copy for the channels below `full` (a multiple of [`LANES`]) and the first
    /// positions of each row, in whole tiles; returns how many positions of a row it copied.
    /// The view's rows have unit stride and `place` does not scale them.
    ///
    /// # Safety
    /// As `fill`; [`ok`] holds for the view's dtype.
    #[target_feature(enable = "avx,avx2,f16c")]
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
        let (dtype, base) = (v.dtype, v.base as *const u8);
        let (vectors, data) = (s.vectors, s.data.as_mut_ptr() as *mut f32);
        for c0 in (0..full).step_by(LANES) {
            let offs: [isize; LANES] = std::array::from_fn(|q| planes.at(n, c0 + q));
            for i in r[0].clone() {
                for j in r[1].clone() {
                    let row = i as isize * st[0] + j as isize * st[1];
                    for k in (r[2].start..r[2].start + tiled).step_by(LANES) {
                        let rows = offs.map(|o| load8(dtype, base, o + row + k as isize));
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
    /// As `store_sample`; [`ok`] holds for the output's dtype.
    #[target_feature(enable = "avx,avx2,f16c")]
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
        let (dtype, base) = (out.dtype, out.base);
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
                            store8(dtype, base, offs[q] + row + k as isize, t);
                        }
                    }
                }
            }
        }
        tiled
    }

    /// [`load8`] and [`store8`] on plain arrays, for the tests that pin them to [`super::Acc`]'s
    /// element conversions.
    #[cfg(test)]
    pub(super) mod tests_api {
        use super::*;

        #[target_feature(enable = "avx,avx2,f16c")]
        pub(in super::super) unsafe fn load8(
            dtype: DType,
            base: *const u8,
            off: isize,
        ) -> [f32; 8] {
            let mut out = [0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), super::load8(dtype, base, off));
            out
        }

        #[target_feature(enable = "avx,avx2,f16c")]
        pub(in super::super) unsafe fn store8(
            dtype: DType,
            base: *mut u8,
            off: isize,
            v: [f32; 8],
        ) {
            super::store8(dtype, base, off, _mm256_loadu_ps(v.as_ptr()))
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::super::elem::read_f64;
    use super::{avx, Acc};
    use deferfuse_fusion::ir::DType;

    /// Every 16-bit pattern, widened eight at a time by the vector copy, equals the element
    /// conversion's f32 bits (NaNs included: both make them quiet).
    #[test]
    fn the_vector_copy_widens_every_half_value_as_the_element_copy_does() {
        for dtype in [DType::BF16, DType::F16] {
            if !avx::ok(dtype) {
                return;
            }
            let all: Vec<u16> = (0..=u16::MAX).collect();
            for (chunk, at) in all.chunks(8).zip((0..).step_by(8)) {
                let got = unsafe { avx::tests_api::load8(dtype, all.as_ptr() as *const u8, at) };
                for (i, &h) in chunk.iter().enumerate() {
                    let p = all.as_ptr() as *const u8;
                    let want = unsafe { f32::load(dtype, p, at + i as isize) };
                    let via_f64 = unsafe { read_f64(dtype, p, at + i as isize) } as f32;
                    assert_eq!(got[i].to_bits(), want.to_bits(), "{dtype:?} {h:#06x}");
                    assert_eq!(want.to_bits(), via_f64.to_bits(), "{dtype:?} {h:#06x}");
                }
            }
        }
    }

    /// f32 values around every rounding case (ties to even both ways, the largest finite
    /// values that round to infinity, subnormals, zeros of both signs, infinities, quiet and
    /// signalling NaNs with payloads), rounded eight at a time by the vector copy, equal the
    /// element conversion's bits, and for bf16 PyTorch's rounding. (The element conversion
    /// used to go through f64, whose `half` rounding truncates the f64 to 20 bits of mantissa
    /// first: a bf16 subnormal result could round the wrong way, `0x002a8001` to `0x2a` where
    /// PyTorch gives `0x2b`.)
    #[test]
    fn the_vector_copy_rounds_every_value_as_the_element_copy_does() {
        let mut bits: Vec<u32> = Vec::new();
        for hi in (0..=0xffffu32).step_by(7) {
            for lo in [
                0, 1, 0x0fff, 0x1000, 0x1fff, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff,
            ] {
                bits.push(hi << 16 | lo);
            }
        }
        bits.extend([
            0x7f7f_ffff,
            0x7f7f_8000,
            0x477f_f000,
            0x477f_efff,
            0x7fa0_0001,
            0xffc1_2345,
        ]);
        while !bits.len().is_multiple_of(8) {
            bits.push(0);
        }
        for dtype in [DType::BF16, DType::F16] {
            if !avx::ok(dtype) {
                return;
            }
            for chunk in bits.chunks(8) {
                let v: [f32; 8] = std::array::from_fn(|i| f32::from_bits(chunk[i]));
                let (mut got, mut want) = ([0u16; 8], [0u16; 8]);
                unsafe {
                    avx::tests_api::store8(dtype, got.as_mut_ptr() as *mut u8, 0, v);
                    for (i, x) in v.iter().enumerate() {
                        x.store(dtype, want.as_mut_ptr() as *mut u8, i as isize);
                    }
                }
                assert_eq!(got, want, "{dtype:?} {chunk:x?}");
                if dtype == DType::BF16 {
                    // PyTorch's own rounding (c10::BFloat16) for every number.
                    for (&b, &w) in chunk.iter().zip(&want) {
                        let c10 = (b + ((b >> 16) & 1) + 0x7fff) >> 16;
                        assert!(f32::from_bits(b).is_nan() || w as u32 == c10, "{b:#x}");
                    }
                }
            }
        }
    }
}
