//! Loops over operands strided along their rows (reductions over leading dims, transposes),
//! run on gathered rows.
//!
//! A row kernel folds each row along the innermost dim of its iteration space. For a
//! reduction over leading dims (a bias gradient `g.sum(0)`, layernorm's weight gradient
//! `(g * xhat).sum((0, 1))`) that dim is the slow one in memory: consecutive elements of a row
//! lie a whole tensor row apart and are loaded one lane at a time, each from another cache line
//! (`sum(0)` of a 1024x128 f32 tensor took 265 us against 20 us in PyTorch). Neighbouring rows
//! of the kernel, though, are neighbours in memory. So for such regions the backend compiles a
//! second kernel that takes those inputs as contiguous rows, and at run time copies a block of
//! rows at a time into scratch, where one pass reads whole cache lines, before calling it.
//!
//! Element outputs the region writes along the way (RMSNorm's and layernorm's backward write
//! the input gradient in the same loop as the weight gradient) are strided the same way: the
//! variant writes them as contiguous rows into scratch too, and each block is scattered back
//! (the gather's transpose) after the kernel ran on it. Before, one such output kept the whole
//! region on the strided kernel: `(a * b).sum((0, 1))` with `a * b + c` kept ran 4.5x slower
//! than the two apart, and Llama's RMSNorm backward regions were ~8% of its training step.
//!
//! Elementwise loops take the same variant (session 41): a transposing copy
//! (`x.t().contiguous()`, `permute(0, 2, 3, 1).contiguous()` to channels-last) reads its input
//! strided along the output's rows exactly as such a reduction does, one lane and one cache line
//! at a time. Gathered, a 1024x512 f32 transpose went 1,303 -> 213 us (PyTorch's CPU eager 293),
//! `[8, 64, 32, 32]` NCHW -> NHWC 1,504 -> 364 us (CPU eager 1,483).
//!
//! The kernel computes the same instructions in the same order on the same values, so results
//! are bit for bit those of the strided kernel; only the loads and stores differ.

use super::column_sums::PureSums;
use super::walk::walked_offsets;
use super::{LoopProgram, OperandList};
use crate::error::Result;
use deferfuse_fusion::region::LoopRegion;
use deferfuse_fusion::{Binding, IterSpace, StrideKind};
use smallvec::SmallVec;

/// Bytes of each source row a block gathers at most: 512 bytes (128 f32 rows) read side by
/// side are 8 whole cache lines, a run the hardware prefetcher follows; with one line per row
/// (16 rows) the gather stalled on every line.
const BLOCK_SPAN_BYTES: usize = 512;

/// Scratch a block's gathered rows may fill, per input: they stay in L2 until the kernel reads
/// them back. Long rows get fewer rows per block, down to one cache line's worth.
const BLOCK_SCRATCH_BYTES: usize = 512 << 10;

/// Rows shorter than this stay on the strided kernel: a short row's loads stay in L1 anyway.
const MIN_ROW_LEN: usize = 64;

/// Elements of padding after each gathered row: rows whose byte length is a multiple of 4 KiB
/// (1024 f32) would all map to the same L1 sets, and the gather's 16 write streams would evict
/// each other (the first version ran 4x slower than the strided kernel).
const ROW_PAD: usize = 16;

/// Gathered bytes per input per block above which the strided kernel runs instead (bounds
/// the scratch a call allocates).
const MAX_SCRATCH_BYTES: usize = 8 << 20;

/// Scratch a thread keeps between calls. Fresh scratch per call came from `mmap` (it is larger
/// than malloc's threshold): its page faults and zeroing cost more than the kernel (a 16x64x128
/// layernorm-style backward spent 10x its arithmetic in the kernel's page-fault path).
const KEEP_SCRATCH_BYTES: usize = 4 << 20;

thread_local! {
    /// This thread's scratch, reused by every call (see [`KEEP_SCRATCH_BYTES`]).
    static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `words` words of scratch: this thread's kept scratch when it is free (not
/// already in use further up the stack), else a new one. The contents are unspecified: callers
/// write every element before they read it.
fn with_scratch<R>(words: usize, f: impl FnOnce(&mut [u64]) -> R) -> R {
    let mut buf = SCRATCH
        .with(|s| s.try_borrow_mut().map(|mut v| std::mem::take(&mut *v)))
        .unwrap_or_default();
    if buf.len() < words {
        buf.resize(words, 0);
    }
    let r = f(&mut buf[..words]);
    if buf.capacity() * 8 <= KEEP_SCRATCH_BYTES {
        SCRATCH.with(|s| {
            if let Ok(mut v) = s.try_borrow_mut() {
                *v = buf;
            }
        });
    }
    r
}

/// Rows per block for rows of `n` elements of `size` bytes (see [`BLOCK_SPAN_BYTES`]).
fn block_rows(n: usize, size: usize) -> usize {
    let line = 64 / size;
    let by_scratch = BLOCK_SCRATCH_BYTES / (n * size).max(1);
    by_scratch.clamp(line, BLOCK_SPAN_BYTES / size)
}

/// Which operands a column variant takes as contiguous rows in scratch.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Transposed {
    /// Inputs (operand indices) gathered into scratch before each block.
    pub(super) gathered: Vec<usize>,
    /// Element outputs (operand indices: they follow the inputs) written to scratch and
    /// scattered back after each block.
    pub(super) scattered: Vec<usize>,
}

impl Transposed {
    fn all(&self) -> impl Iterator<Item = usize> + '_ {
        self.gathered.iter().chain(&self.scattered).copied()
    }
}

/// A loop's variant for operands strided along its rows, and which operands those are.
pub(super) struct ColumnKernel {
    pub(super) program: LoopProgram,
    ops: Transposed,
    /// Set when the region only sums gathered inputs: then they are summed in place
    /// (`column_sums`), nothing gathered.
    pure: Option<PureSums>,
}

/// The region a loop's column variant compiles, with the operands it takes through scratch:
/// `None` unless some input is strided along its rows (with or without reductions).
pub(super) fn variant(region: &LoopRegion) -> Option<(LoopRegion, Transposed)> {
    let strided = |o: &deferfuse_fusion::region::LoopOperand| o.inner == StrideKind::Strided;
    let gathered: Vec<usize> = (region.inputs.iter().enumerate())
        .filter(|(_, o)| strided(o))
        .map(|(j, _)| j)
        .collect();
    if gathered.is_empty() {
        return None;
    }
    let n_in = region.inputs.len();
    let scattered: Vec<usize> = (region.outputs.iter().enumerate())
        .filter(|(_, (_, o))| strided(o))
        .map(|(j, _)| n_in + j)
        .collect();
    let mut v = region.clone();
    for &j in &gathered {
        v.inputs[j].inner = StrideKind::Contig;
    }
    for &j in &scattered {
        v.outputs[j - n_in].1.inner = StrideKind::Contig;
    }
    Some((
        v,
        Transposed {
            gathered,
            scattered,
        },
    ))
}

impl ColumnKernel {
    /// The column variant `program` of `region` (the row kernel's region), taking `ops`
    /// through scratch.
    pub(super) fn new(program: LoopProgram, region: &LoopRegion, ops: Transposed) -> ColumnKernel {
        let pure = PureSums::of(region, &ops.gathered);
        ColumnKernel { program, ops, pure }
    }

    /// Whether a call over `iter` gains from this variant: every operand taken through
    /// scratch steps one element from row to row (its rows' elements are side by side in
    /// memory), and, to gather, rows long enough and a block's scratch bounded. Sums read in
    /// place (`pure`) use no scratch and gain at any row length.
    pub(super) fn applies(&self, iter: &IterSpace, elem: &[isize]) -> bool {
        let r = iter.rank();
        if r < 2 || iter.sizes[r - 2] < 2 {
            return false;
        }
        let n = iter.sizes[r - 1];
        let gathers =
            |size: usize| n >= MIN_ROW_LEN && block_rows(n, size) * n * size <= MAX_SCRATCH_BYTES;
        self.ops.all().all(|j| {
            iter.strides[j][r - 2] == 1 && (self.pure.is_some() || gathers(elem[j] as usize))
        })
    }

    /// Runs the region: a region of pure sums in place (`column_sums`); otherwise, per block
    /// of rows (see [`block_rows`]), gathers each gathered input's
    /// rows into scratch, calls the variant on them, then scatters the element outputs it
    /// wrote to scratch back to their places. `starts` are the operands' first
    /// elements, `strides` the strided kernel's (outer, inner) byte strides per operand.
    ///
    /// # Safety
    /// As [`crate::backend::HostProgram::run_host`]: the binding's buffers are live and as large
    /// as it says.
    pub(super) unsafe fn run(
        &self,
        binding: &Binding,
        iter: &IterSpace,
        starts: &[usize],
        strides: &[i64],
        elem: &[isize],
    ) -> Result<()> {
        let p = &self.program;
        let r = iter.rank();
        let (n_outer, n_inner) = (iter.sizes[r - 2], iter.sizes[r - 1]);
        let walked: usize = iter.sizes[..r - 2].iter().product();
        if let Some(sums) = &self.pure {
            // Whole vectors of columns per chunk; a column's sum is the same on any thread.
            return p.pool.for_chunks(walked * n_outer, n_inner, 16, &|c| {
                let mut u = c.start;
                while u < c.end {
                    let (o, row) = (u / n_outer, u % n_outer);
                    let rows = (n_outer - row).min(c.end - u);
                    let outer = walked_offsets(iter, elem, o);
                    let from: OperandList<*mut u8> = (starts.iter().enumerate())
                        .map(|(j, &s)| {
                            let at = outer[j] + row as isize * strides[2 * j] as isize;
                            (s as *mut u8).offset(at)
                        })
                        .collect();
                    sums.run(&from, strides, rows, n_inner);
                    u += rows;
                }
                Ok(())
            });
        }
        let pitch = n_inner + ROW_PAD;
        let mut vstrides: SmallVec<[i64; 16]> = SmallVec::from_slice(&strides[..2 * elem.len()]);
        for j in self.ops.all() {
            vstrides[2 * j] = pitch as i64 * elem[j] as i64;
            vstrides[2 * j + 1] = elem[j] as i64;
        }
        for d in &p.stash {
            vstrides.push(0);
            vstrides.push(d.size() as i64);
        }
        let widest = self.ops.all().map(|j| elem[j] as usize).max().unwrap_or(4);
        let block = block_rows(n_inner, widest);
        p.pool.for_chunks(walked * n_outer, n_inner, block, &|c| {
            // One scratch area per operand taken through scratch (the gathered inputs, then
            // the scattered outputs), reused by every block of this chunk.
            let words: SmallVec<[usize; 4]> = (self.ops.all())
                .map(|j| (block * pitch * elem[j] as usize).div_ceil(8))
                .collect();
            with_scratch(words.iter().sum(), |all| {
                let mut rest = all;
                let mut scratch: SmallVec<[&mut [u64]; 4]> = words
                    .iter()
                    .map(|&w| {
                        let (area, tail) = std::mem::take(&mut rest).split_at_mut(w);
                        rest = tail;
                        area
                    })
                    .collect();
                let n_gathered = self.ops.gathered.len();
                let mut u = c.start;
                while u < c.end {
                    let (o, row) = (u / n_outer, u % n_outer);
                    let rows = (n_outer - row).min(c.end - u).min(block);
                    let mut ptrs: OperandList<*mut u8> = SmallVec::with_capacity(starts.len());
                    let outer = walked_offsets(iter, elem, o);
                    for (j, &s) in starts.iter().enumerate() {
                        let at = outer[j] + row as isize * strides[2 * j] as isize;
                        ptrs.push((s as *mut u8).offset(at));
                    }
                    for (g, &j) in self.ops.gathered.iter().enumerate() {
                        let dst = scratch[g].as_mut_ptr() as *mut u8;
                        let step = strides[2 * j + 1] as isize;
                        gather_rows(ptrs[j], step, elem[j] as usize, rows, n_inner, pitch, dst);
                        ptrs[j] = dst;
                    }
                    let homes: SmallVec<[*mut u8; 4]> =
                        self.ops.scattered.iter().map(|&j| ptrs[j]).collect();
                    for (s, &j) in self.ops.scattered.iter().enumerate() {
                        ptrs[j] = scratch[n_gathered + s].as_mut_ptr() as *mut u8;
                    }
                    p.call(&mut ptrs, &vstrides, &binding.scalars, rows, n_inner);
                    for (s, &j) in self.ops.scattered.iter().enumerate() {
                        let src = scratch[n_gathered + s].as_ptr() as *const u8;
                        let step = strides[2 * j + 1] as isize;
                        scatter_rows(src, pitch, elem[j] as usize, rows, n_inner, step, homes[s]);
                    }
                    u += rows;
                }
                Ok(())
            })
        })
    }
}

/// Copies `rows` rows of `n` elements of `size` bytes, row `b`'s element `k` at
/// `src + b * size + k * step` (bytes), to `dst` as rows `pitch` elements apart:
/// `dst[b * pitch + k]`. Reading element `k` of every row at once walks each source cache
/// line once.
///
/// # Safety
/// The source elements are readable and `dst` holds `rows * pitch` elements.
unsafe fn gather_rows(
    src: *const u8,
    step: isize,
    size: usize,
    rows: usize,
    n: usize,
    pitch: usize,
    dst: *mut u8,
) {
    unsafe fn typed<T: Copy>(
        src: *const u8,
        step: isize,
        rows: usize,
        n: usize,
        pitch: usize,
        dst: *mut T,
    ) {
        // Tiles of TILE x TILE elements: a tile's source lines stay in L1 while each
        // destination row gets a whole run of TILE elements (a line for f32), so every
        // destination line is filled at once instead of one element per pass. Destination
        // rows outermost, as in `gather_rows_f32` (which says why).
        const TILE: usize = 16;
        for b0 in (0..rows).step_by(TILE) {
            let b1 = (b0 + TILE).min(rows);
            for k0 in (0..n).step_by(TILE) {
                let k1 = (k0 + TILE).min(n);
                for b in b0..b1 {
                    let d = dst.add(b * pitch);
                    for k in k0..k1 {
                        let s = src.offset(k as isize * step) as *const T;
                        *d.add(k) = s.add(b).read_unaligned();
                    }
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if size == 4 && std::arch::is_x86_feature_detected!("avx") {
        return avx::gather_rows_f32(src, step, rows, n, pitch, dst as *mut f32);
    }
    match size {
        1 => typed::<u8>(src, step, rows, n, pitch, dst),
        2 => typed::<u16>(src, step, rows, n, pitch, dst as *mut u16),
        4 => typed::<u32>(src, step, rows, n, pitch, dst as *mut u32),
        _ => typed::<u64>(src, step, rows, n, pitch, dst as *mut u64),
    }
}

/// The inverse of [`gather_rows`]: `rows` rows of `n` elements, `pitch` elements apart at
/// `src`, to row `b`'s element `k` at `dst + b * size + k * step` (bytes). Written element `k`
/// of every row at once, each destination cache line is filled in one pass.
///
/// # Safety
/// `src` holds `rows * pitch` elements and the destination elements are writable.
unsafe fn scatter_rows(
    src: *const u8,
    pitch: usize,
    size: usize,
    rows: usize,
    n: usize,
    step: isize,
    dst: *mut u8,
) {
    unsafe fn typed<T: Copy>(
        src: *const T,
        pitch: usize,
        rows: usize,
        n: usize,
        step: isize,
        dst: *mut u8,
    ) {
        // The gather's tiles, read and written the other way round (scratch rows outermost).
        const TILE: usize = 16;
        for b0 in (0..rows).step_by(TILE) {
            let b1 = (b0 + TILE).min(rows);
            for k0 in (0..n).step_by(TILE) {
                let k1 = (k0 + TILE).min(n);
                for k in k0..k1 {
                    let d = dst.offset(k as isize * step) as *mut T;
                    for b in b0..b1 {
                        d.add(b).write_unaligned(*src.add(b * pitch + k));
                    }
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if size == 4 && std::arch::is_x86_feature_detected!("avx") {
        return avx::scatter_rows_f32(src as *const f32, pitch, rows, n, step, dst);
    }
    match size {
        1 => typed::<u8>(src, pitch, rows, n, step, dst),
        2 => typed::<u16>(src as *const u16, pitch, rows, n, step, dst),
        4 => typed::<u32>(src as *const u32, pitch, rows, n, step, dst),
        _ => typed::<u64>(src as *const u64, pitch, rows, n, step, dst),
    }
}

/// The f32 gather with AVX: 8x8 tiles transposed in registers (eight row loads, eight row
/// stores), the way f32 leading-dim reductions (every bias and layernorm gradient) run.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx {
    use std::arch::x86_64::*;

    /// As `gather_rows` for 4-byte elements (bit copies: any f32 or i32 value).
    ///
    /// # Safety
    /// As `gather_rows`; the CPU has AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn gather_rows_f32(
        src: *const u8,
        step: isize,
        rows: usize,
        n: usize,
        pitch: usize,
        dst: *mut f32,
    ) {
        let at = |k: usize, b: usize| (src.offset(k as isize * step) as *const f32).add(b);
        let (full_rows, full_n) = (rows / 8 * 8, n / 8 * 8);
        // Tiles of destination rows outermost, each filled along its whole length before the
        // next. The destination's rows are `pitch` elements apart, over a page each for rows
        // of 1024 elements: sweeping all of them for every 8 source rows (the other order)
        // missed the TLB on nearly every store: in BERT's training step on a Xeon core each
        // bias gradient (`sum(0)` of a 1024x128 f32 tensor) took 210 us, 80 us this way
        // (PyTorch: ~10 us). A tile now writes 8 pages while the source is read down its
        // rows, a page per 8 of them.
        for b in (0..full_rows).step_by(8) {
            for k in (0..full_n).step_by(8) {
                let r = [0, 1, 2, 3, 4, 5, 6, 7].map(|i| _mm256_loadu_ps(at(k + i, b)));
                let out = transpose8(r);
                for (i, v) in out.into_iter().enumerate() {
                    _mm256_storeu_ps(dst.add((b + i) * pitch + k), v);
                }
            }
        }
        // The edges: rows past the last tile of 8, and elements past the last tile of 8.
        for b in 0..rows {
            let from = if b < full_rows { full_n } else { 0 };
            for k in from..n {
                *dst.add(b * pitch + k) = at(k, b).read_unaligned();
            }
        }
    }

    /// As `scatter_rows` for 4-byte elements, with the same 8x8 register transposes.
    ///
    /// # Safety
    /// As `scatter_rows`; the CPU has AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn scatter_rows_f32(
        src: *const f32,
        pitch: usize,
        rows: usize,
        n: usize,
        step: isize,
        dst: *mut u8,
    ) {
        let at = |k: usize, b: usize| (dst.offset(k as isize * step) as *mut f32).add(b);
        let (full_rows, full_n) = (rows / 8 * 8, n / 8 * 8);
        // Scratch rows outermost, as in the gather.
        for b in (0..full_rows).step_by(8) {
            for k in (0..full_n).step_by(8) {
                let r =
                    [0, 1, 2, 3, 4, 5, 6, 7].map(|i| _mm256_loadu_ps(src.add((b + i) * pitch + k)));
                let out = transpose8(r);
                for (i, v) in out.into_iter().enumerate() {
                    _mm256_storeu_ps(at(k + i, b), v);
                }
            }
        }
        for b in 0..rows {
            let from = if b < full_rows { full_n } else { 0 };
            for k in from..n {
                at(k, b).write_unaligned(*src.add(b * pitch + k));
            }
        }
    }

    /// Rows `r[k]` (8 lanes each) to columns: lane `b` of every row, in row order. Also the
    /// small GEMM's in-register transpose of B (`small_gemm.rs`).
    #[inline]
    #[target_feature(enable = "avx")]
    pub(crate) unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_rows_are_the_columns_of_a_row_major_matrix() {
        // A 3x4 row-major matrix: the kernel's rows are its 4 columns (3 elements each).
        let m: Vec<u32> = (0..12).collect();
        let mut out = vec![0u32; 16];
        unsafe {
            gather_rows(
                m.as_ptr() as *const u8,
                16,
                4,
                4,
                3,
                4,
                out.as_mut_ptr() as *mut u8,
            )
        };
        assert_eq!(out, vec![0, 4, 8, 0, 1, 5, 9, 0, 2, 6, 10, 0, 3, 7, 11, 0]);
    }

    #[test]
    fn scattering_gathered_rows_restores_the_matrix_for_every_element_size() {
        // 19 x 21 with rows padded to 24: full 8x8 tiles and both edges, and the AVX f32 path.
        let (n, rows, pitch) = (19usize, 21usize, 24usize);
        fn round_trip<T: Copy + PartialEq + std::fmt::Debug + Default>(
            m: &[T],
            n: usize,
            rows: usize,
            pitch: usize,
        ) {
            let size = std::mem::size_of::<T>();
            let mut scratch = vec![T::default(); rows * pitch];
            let mut back = vec![T::default(); m.len()];
            let step = (size * rows) as isize;
            unsafe {
                gather_rows(
                    m.as_ptr() as *const u8,
                    step,
                    size,
                    rows,
                    n,
                    pitch,
                    scratch.as_mut_ptr() as *mut u8,
                );
                scatter_rows(
                    scratch.as_ptr() as *const u8,
                    pitch,
                    size,
                    rows,
                    n,
                    step,
                    back.as_mut_ptr() as *mut u8,
                );
            }
            assert_eq!(back, m);
        }
        round_trip(
            &(0..n * rows).map(|i| i as f32).collect::<Vec<_>>(),
            n,
            rows,
            pitch,
        );
        round_trip(
            &(0..n * rows).map(|i| i as f64).collect::<Vec<_>>(),
            n,
            rows,
            pitch,
        );
        round_trip(
            &(0..n * rows).map(|i| i as u16).collect::<Vec<_>>(),
            n,
            rows,
            pitch,
        );
        round_trip(
            &(0..n * rows).map(|i| i as u8).collect::<Vec<_>>(),
            n,
            rows,
            pitch,
        );
    }

    #[test]
    fn gathered_f32_rows_are_the_columns_whatever_the_tile_edges() {
        // 19 x 21: full 8x8 tiles plus both edges; rows padded to a pitch of 24.
        let (n, rows, pitch) = (19, 21, 24);
        let m: Vec<f32> = (0..n * rows).map(|i| i as f32).collect();
        let mut out = vec![-1f32; rows * pitch];
        let (src, dst) = (m.as_ptr() as *const u8, out.as_mut_ptr() as *mut u8);
        unsafe { gather_rows(src, 4 * rows as isize, 4, rows, n, pitch, dst) };
        for b in 0..rows {
            for k in 0..n {
                assert_eq!(out[b * pitch + k], m[k * rows + b], "row {b} element {k}");
            }
        }
    }
}
