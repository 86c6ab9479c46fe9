//! Sums over leading dims read in place: the bias gradients of every linear layer (`g.sum(0)`)
//! and layernorm's weight and bias gradients once their products are formed, computed with the
//! columns side by side in 16-lane vectors instead of gathered into rows first (`columns`).
//!
//! The gather copies every element into scratch and the row kernel reads it back: on a Xeon
//! core a `[1024, 128]` bias gradient took ~60 us in BERT's training step that way, where
//! PyTorch takes ~10. Here each source row is read once, in order, into 16 columns' sums.
//!
//! Bits: each column's sum is the row kernel's (`sweep::reduce_sweep`) operation for operation:
//! the elements folded 8 at a time into two groups of four running sums (element `i` into sum
//! `i % 8`, from +0), each group added into a running total (from -0) and started again after
//! every [`SUM_BLOCK`] elements when more follow, one more group of four into the first, each
//! group's total and sums added, the two groups added pairwise, their four lanes as
//! `(l0 + l1) + (l2 + l3)`, then the remaining elements one by one; a mean divides by the
//! row's length. The same additions in the same order and operand order, with
//! the lanes now running across columns instead of along a row, so every result equals the row
//! kernel's (`column_sums_match_the_row_kernels_order` pins it against a scalar emulation; the
//! planner tables and the op suites pin the row kernel against the reference).

use super::half_gemm::f32_to_bf16;
use super::sweep::SUM_BLOCK;
use deferfuse_fusion::ir::{DType, ReduceOp};
use deferfuse_fusion::region::{InstrKind, LoopRegion};

/// [`SUM_BLOCK`] as a count of elements.
const BLOCK: usize = SUM_BLOCK as usize;

/// A column variant's region whose reductions are all sums or means of one float32 or bfloat16
/// input as it is loaded, with no element outputs: what this module computes in place.
#[derive(Debug, PartialEq)]
pub(super) struct PureSums {
    /// Per stored reduction: the input operand summed, the output operand, whether a mean.
    sums: Vec<(usize, usize, bool)>,
    /// The inputs' and outputs' dtype: bfloat16 values are summed as the row kernel sums them,
    /// in float32 from their exact float32 values, and the result rounded once (an autocast
    /// Linear's bias gradient, which gathered ran ~4x slower than a float32 one read in place).
    bf16: bool,
}

impl PureSums {
    /// The region's sums when it is nothing else (see the type doc), each of an input the
    /// column variant gathers (one strided along the rows: `gathered`), on a core with
    /// AVX-512F.
    pub(super) fn of(region: &LoopRegion, gathered: &[usize]) -> Option<PureSums> {
        if !region.outputs.is_empty() || region.reduces.is_empty() || !avx512() {
            return None;
        }
        let n_in = region.inputs.len();
        let (mut sums, mut bf16) = (Vec::new(), false);
        for r in &region.reduces {
            let mean = match r.op {
                ReduceOp::Sum => false,
                ReduceOp::Mean => true,
                _ => return None,
            };
            let instr = &region.body[r.value as usize];
            let InstrKind::Load(j) = instr.kind else {
                return None;
            };
            let out = r.output.as_ref()?;
            let input = region.inputs[j as usize];
            if !gathered.contains(&(j as usize)) {
                return None;
            }
            let d = instr.dtype;
            if !matches!(d, DType::F32 | DType::BF16) || input.dtype != d || out.dtype != d {
                return None;
            }
            if sums.is_empty() {
                bf16 = d == DType::BF16;
            } else if bf16 != (d == DType::BF16) {
                return None;
            }
            sums.push((j as usize, n_in + sums.len(), mean));
        }
        Some(PureSums { sums, bf16 })
    }

    /// Sums `n_inner` elements, `strides[2 * j + 1]` bytes apart, for each of `n_outer`
    /// neighbouring columns (one float apart) starting at `from[j]`, into the outputs at
    /// `from[out]` (`strides[2 * out]` bytes apart), for every sum of the region.
    ///
    /// # Safety
    /// The addresses are those the row kernel would read and write for the same rows; the core
    /// has AVX-512F (checked by [`PureSums::of`]).
    pub(super) unsafe fn run(
        &self,
        from: &[*mut u8],
        strides: &[i64],
        n_outer: usize,
        n_inner: usize,
    ) {
        for &(j, out, mean) in &self.sums {
            let (src, step) = (from[j] as *const u8, strides[2 * j + 1] as isize);
            let (dst, dst_step) = (from[out], strides[2 * out] as isize);
            #[cfg(target_arch = "x86_64")]
            if self.bf16 {
                avx512::columns::<Bf16>(src, step, n_outer, n_inner, dst, dst_step, mean);
            } else {
                avx512::columns::<f32>(src, step, n_outer, n_inner, dst, dst_step, mean);
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("no pure sums without AVX-512 ({src:?} {step} {dst:?} {dst_step} {mean})");
        }
    }
}

fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// An element type the sums read and write: float32 as it is, bfloat16 widened exactly as the
/// row kernel loads it (its bits shifted into a float32's high half) and rounded once at the
/// store as the row kernel stores it (to nearest, ties to even).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
trait Elem {
    /// Bytes per element.
    const SIZE: usize;
    /// The float32 value at `p`.
    unsafe fn read(p: *const u8) -> f32;
    /// `v` stored at `p` in this type.
    unsafe fn write(p: *mut u8, v: f32);
    /// 16 neighbouring elements at `p` as float32.
    #[cfg(target_arch = "x86_64")]
    unsafe fn read16(p: *const u8) -> std::arch::x86_64::__m512;
}

impl Elem for f32 {
    const SIZE: usize = 4;
    unsafe fn read(p: *const u8) -> f32 {
        p.cast::<f32>().read_unaligned()
    }
    unsafe fn write(p: *mut u8, v: f32) {
        p.cast::<f32>().write_unaligned(v)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn read16(p: *const u8) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p.cast())
    }
}

/// bfloat16, as its bits.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Bf16;

impl Elem for Bf16 {
    const SIZE: usize = 2;
    unsafe fn read(p: *const u8) -> f32 {
        f32::from_bits((p.cast::<u16>().read_unaligned() as u32) << 16)
    }
    unsafe fn write(p: *mut u8, v: f32) {
        p.cast::<u16>().write_unaligned(f32_to_bf16(v))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn read16(p: *const u8) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
    }
}

/// One column's sum of `n` elements in the row kernel's order (see the module doc): the
/// specification the vector code follows, and the edge columns' own code.
///
/// # Safety
/// `x` is readable at `n` elements `step` bytes apart.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
unsafe fn column<E: Elem>(x: *const u8, step: isize, n: usize, mean: bool) -> f32 {
    let at = |i: usize| E::read(x.offset(i as isize * step));
    let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
    let (mut ta, mut tb) = ([-0f32; 4], [-0f32; 4]);
    let mut i = 0;
    while i + 8 <= n {
        for l in 0..4 {
            a[l] += at(i + l);
            b[l] += at(i + 4 + l);
        }
        i += 8;
        if i % BLOCK == 0 && i < n {
            for l in 0..4 {
                ta[l] += a[l];
                tb[l] += b[l];
            }
            (a, b) = ([0f32; 4], [0f32; 4]);
        }
    }
    if i + 4 <= n {
        for (l, s) in a.iter_mut().enumerate() {
            *s += at(i + l);
        }
        i += 4;
    }
    let s: [f32; 4] = std::array::from_fn(|l| (ta[l] + a[l]) + (tb[l] + b[l]));
    let mut total = (s[0] + s[1]) + (s[2] + s[3]);
    while i < n {
        total += at(i);
        i += 1;
    }
    if mean {
        total / n as f32
    } else {
        total
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::column`] for `cols` neighbouring columns, 16 at a time; the last `cols % 16`
    /// one by one.
    ///
    /// # Safety
    /// As [`super::PureSums::run`], for one sum.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn columns<E: super::Elem>(
        src: *const u8,
        step: isize,
        cols: usize,
        n: usize,
        dst: *mut u8,
        dst_step: isize,
        mean: bool,
    ) {
        let row = |i: usize, c: usize| src.offset(i as isize * step).add(c * E::SIZE);
        let store = |c: usize, v: f32| E::write(dst.offset(c as isize * dst_step), v);
        let whole = cols / 16 * 16;
        for c in (0..whole).step_by(16) {
            let load = |i: usize| E::read16(row(i, c));
            let zero = _mm512_setzero_ps();
            let minus_zero = _mm512_set1_ps(-0.0);
            let (mut a, mut b) = ([zero; 4], [zero; 4]);
            let (mut ta, mut tb) = ([minus_zero; 4], [minus_zero; 4]);
            let mut i = 0;
            while i + 8 <= n {
                for l in 0..4 {
                    a[l] = _mm512_add_ps(a[l], load(i + l));
                    b[l] = _mm512_add_ps(b[l], load(i + 4 + l));
                }
                i += 8;
                if i % super::BLOCK == 0 && i < n {
                    for l in 0..4 {
                        ta[l] = _mm512_add_ps(ta[l], a[l]);
                        tb[l] = _mm512_add_ps(tb[l], b[l]);
                    }
                    (a, b) = ([zero; 4], [zero; 4]);
                }
            }
            if i + 4 <= n {
                for (l, s) in a.iter_mut().enumerate() {
                    *s = _mm512_add_ps(*s, load(i + l));
                }
                i += 4;
            }
            let s: [__m512; 4] = std::array::from_fn(|l| {
                _mm512_add_ps(_mm512_add_ps(ta[l], a[l]), _mm512_add_ps(tb[l], b[l]))
            });
            let mut total = _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]));
            while i < n {
                total = _mm512_add_ps(total, load(i));
                i += 1;
            }
            if mean {
                total = _mm512_div_ps(total, _mm512_set1_ps(n as f32));
            }
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), total);
            for (l, &v) in lanes.iter().enumerate() {
                store(c + l, v);
            }
        }
        for c in whole..cols {
            store(c, super::column::<E>(src.add(c * E::SIZE), step, n, mean));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values whose sums round differently in other orders: magnitudes over 2^30, signs and
    /// small parts mixed (a fixed xorshift).
    fn values(len: usize) -> Vec<f32> {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let m = (s >> 40) as f32 / (1u64 << 24) as f32;
                let e = ((s >> 8) % 31) as i32 - 5;
                if s & 1 == 0 {
                    m * 2f32.powi(e)
                } else {
                    -m * 2f32.powi(e)
                }
            })
            .collect()
    }

    /// The row kernel's order written out for one row (`sweep::reduce_sweep`), element by
    /// element, independent of [`column`]'s loops.
    fn row_kernel_order(x: &[f32]) -> f32 {
        let n = x.len();
        let (mut lanes, mut totals) = ([0f32; 8], [-0f32; 8]);
        let whole8 = n / 8 * 8;
        for (i, &v) in x[..whole8].iter().enumerate() {
            lanes[i % 8] += v;
            // A whole block summed and more to come: into the totals (`SUM_BLOCK`).
            if (i + 1) % BLOCK == 0 && i + 1 < n {
                for l in 0..8 {
                    totals[l] += lanes[l];
                    lanes[l] = 0.0;
                }
            }
        }
        let mut i = whole8;
        if i + 4 <= n {
            for l in 0..4 {
                lanes[l] += x[i + l];
            }
            i += 4;
        }
        let s: Vec<f32> = (0..4)
            .map(|l| (totals[l] + lanes[l]) + (totals[4 + l] + lanes[4 + l]))
            .collect();
        let mut t = (s[0] + s[1]) + (s[2] + s[3]);
        for &v in &x[i..] {
            t += v;
        }
        t
    }

    #[test]
    fn column_sums_match_the_row_kernels_order() {
        if !avx512() {
            return;
        }
        // Columns: two vectors and an edge of 3; rows: every remainder of 8 and of 4.
        let cols = 35;
        for n in [
            1, 3, 4, 5, 8, 11, 12, 13, 64, 1023, 1024, 1028, 1031, 2048, 3077,
        ] {
            let m = values(n * cols);
            let mut out = vec![f32::NAN; cols];
            let mut means = vec![f32::NAN; cols];
            unsafe {
                let src = m.as_ptr() as *const u8;
                let step = 4 * cols as isize;
                avx512::columns::<f32>(src, step, cols, n, out.as_mut_ptr().cast(), 4, false);
                avx512::columns::<f32>(src, step, cols, n, means.as_mut_ptr().cast(), 4, true);
            }
            for c in 0..cols {
                let col: Vec<f32> = (0..n).map(|i| m[i * cols + c]).collect();
                let want = row_kernel_order(&col);
                assert_eq!(out[c].to_bits(), want.to_bits(), "n {n} column {c}");
                let want_mean = want / n as f32;
                assert_eq!(
                    means[c].to_bits(),
                    want_mean.to_bits(),
                    "mean, n {n} column {c}"
                );
            }
        }
    }

    #[test]
    fn bf16_column_sums_are_the_row_kernels_float32_sums_rounded_once() {
        if !avx512() {
            return;
        }
        let cols = 35;
        for n in [1, 5, 12, 13, 1023, 1028, 3077] {
            let m: Vec<u16> = values(n * cols).iter().map(|&v| f32_to_bf16(v)).collect();
            let (mut out, mut means) = (vec![0u16; cols], vec![0u16; cols]);
            unsafe {
                let src = m.as_ptr() as *const u8;
                let step = 2 * cols as isize;
                avx512::columns::<Bf16>(src, step, cols, n, out.as_mut_ptr().cast(), 2, false);
                avx512::columns::<Bf16>(src, step, cols, n, means.as_mut_ptr().cast(), 2, true);
            }
            for c in 0..cols {
                let col: Vec<f32> = (0..n)
                    .map(|i| f32::from_bits((m[i * cols + c] as u32) << 16))
                    .collect();
                let want = row_kernel_order(&col);
                assert_eq!(out[c], f32_to_bf16(want), "n {n} column {c}");
                assert_eq!(
                    means[c],
                    f32_to_bf16(want / n as f32),
                    "mean, n {n} column {c}"
                );
            }
        }
    }

    #[test]
    fn a_sequential_sum_is_not_the_row_kernels_order() {
        // The check above can tell orders apart on these values.
        let x = values(1023);
        let sequential = x.iter().fold(0f32, |t, &v| t + v);
        assert_ne!(sequential.to_bits(), row_kernel_order(&x).to_bits());
    }
}
