//! A dense convolution's weight gradient as dot products along the positions, read in place.
//!
//! `dW^T[r, o] += sum_j grad[o, j] * grid[offset(r) + j]` over the wide positions `j` of one
//! sample: row `o` of the gradient laid out over the wide positions and row `r = (c, tap)` of
//! the columns, a run of the padded grid. Both operands are contiguous along the contraction,
//! so each element is a dot product of two runs that lie in memory as they are: no block of
//! columns is copied and nothing is packed. As a GEMM (`block @ grad^T`) the product had as many
//! output columns as the convolution has output channels, often 16: too narrow for the 16-lane
//! tile, and its packing copied every column twice more (a `[4, 32, 64, 64]` input with 16
//! output channels: 1.87 ms against CPU eager's 0.78).
//!
//! The order, the same for every element whatever tile it falls in (so whatever the output
//! channels, the rows, or the threads' split of the rows): lane `l` of a 16-lane sum takes the
//! output positions `j = 16i + l` of each sample in order (the wide positions past a row's
//! output size, whose gradient is zero, are skipped: a zero times an input infinity there
//! would be NaN), samples in order, `acc = fma(g, x, acc)` from +0; the lanes are then added
//! pairwise, halves first (`l + (l + 8)`, then `+ 4`, `+ 2`, `+ 1`), and the sum added to the
//! element's running total. The caller hands over the samples in batches whose size depends on
//! the convolution's shape only (each batch's sum is one such total), so the bits do not
//! depend on the thread count either.
//!
//! Summing a batch of samples in registers, not one, matters on small maps: one 16-lane sum
//! per element and sample was as much work as the products for a `[8, 64, 16, 16]` input (288
//! wide positions). The sixteen sums of a tile are added by one transposing tree
//! ([`lane_sums`]) for the same reason.

use std::arch::x86_64::*;

/// Output channels of one tile: four gradient rows loaded once per position group...
const TILE_OC: usize = 4;
/// ...against four runs of the grid: 16 running sums (four FMA latencies on both FMA ports,
/// and one transposing tree adds them all), with 8 loads per 16 FMAs.
const TILE_ROWS: usize = 4;
/// Running sums of one tile.
const TILE_SUMS: usize = TILE_OC * TILE_ROWS;

/// Whether this core runs [`accumulate`] (it needs AVX-512F).
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// One batch of samples, laid out as [`accumulate`] reads them: float32 values and masks of
/// 16 positions, or ([`accumulate_bf16`]) bfloat16 values (as bits) and masks of 32.
pub(super) struct Batch<'a, T = f32, M = __mmask16> {
    /// How many samples.
    pub samples: usize,
    /// Wide positions per sample: each dot product's length per sample.
    pub len: usize,
    /// The gradients over the wide positions: sample `s`'s row `o` at `grad[s * oc * len + o *
    /// len..]`.
    pub grad: &'a [T],
    /// Output channels.
    pub oc: usize,
    /// The padded grids: sample `s`'s row `r` at `grid[s * grid_len + offsets[r]..]`.
    pub grid: &'a [T],
    /// Floats of one sample's grid.
    pub grid_len: usize,
    /// Where each row `(c, tap)` of the columns starts in a sample's grid.
    pub offsets: &'a [isize],
    /// Which of the wide positions `16 g..16 g + 16` are output positions, one mask per group
    /// `g` of `len.div_ceil(16)` (see [`positions`]): the others (past a row's output size, or
    /// past `len`) are neither loaded nor summed, so an infinity or NaN of the input that only
    /// they would read stays out of every tap's sum, as on CPU.
    pub positions: &'a [M],
}

/// [`Batch::positions`] for `len` wide positions of which `is_output(j)` says which are output
/// positions: one mask of `M`'s bits per group of as many positions ([`accumulate`]'s groups of
/// 16 with `__mmask16`, [`accumulate_bf16`]'s of 32 with `__mmask32`).
pub(super) fn positions<M: TryFrom<u64>>(len: usize, is_output: impl Fn(usize) -> bool) -> Vec<M> {
    let lanes = 8 * std::mem::size_of::<M>();
    (0..len.div_ceil(lanes))
        .map(|g| {
            let bits = (0..lanes)
                .filter(|&l| lanes * g + l < len && is_output(lanes * g + l))
                .fold(0u64, |m, l| m | 1 << l);
            M::try_from(bits).ok().expect("a group's bits fit its mask")
        })
        .collect()
}

/// Whether this core runs [`accumulate_bf16`] (AVX512-BF16's pair dot products).
pub(super) fn bf16_available() -> bool {
    crate::backend::cpu::half_gemm::bf16_products_run()
}

/// `acc[r * oc + o] += sum_s sum_j grad_s[o, j] * grid_s[offsets[r] + j]` over the batch's
/// samples `s` and positions `j < len`, every `o < oc` and row `r`, in the module's order.
///
/// # Safety
/// [`available`] holds; every sample's grid holds `len` floats at every offset; `batch.grad`
/// holds `samples * oc * len` floats; `acc` has `offsets.len() * oc` elements.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn accumulate(batch: &Batch, acc: &mut [f32]) {
    debug_assert!(batch.grad.len() >= batch.samples * batch.oc * batch.len);
    by_tiles((batch.oc, batch.len), batch.offsets, acc, |g, x| {
        tile(batch, g, x)
    });
}

/// [`accumulate`] for bfloat16 values, summed in float32 by `vdpbf16ps`: lane `l` of a
/// 16-lane sum takes the pair of positions `32i + 2l`, `32i + 2l + 1` of each sample in order
/// (the instruction adds the pair's two exact products into it, the odd position's first),
/// the lanes then added as [`accumulate`] adds them. Twice the float32 dot products'
/// multiply-adds per instruction; a masked-off position reads as zero on both sides.
///
/// # Safety
/// [`bf16_available`] holds; otherwise as [`accumulate`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn accumulate_bf16(batch: &Batch<u16, __mmask32>, acc: &mut [f32]) {
    debug_assert!(batch.grad.len() >= batch.samples * batch.oc * batch.len);
    by_tiles((batch.oc, batch.len), batch.offsets, acc, |g, x| {
        tile_bf16(batch, g, x)
    });
}

/// `acc[r * oc + o] += ` tile sums over every output channel `o < oc` and row `r` (its grid
/// offset in `offsets`), [`TILE_OC`] by [`TILE_ROWS`] at a time: `tile(g, x)` gives the sums of
/// the gradient rows starting at `g` (rows `len` apart) against the runs at `x`.
#[inline(always)]
fn by_tiles(
    (oc, len): (usize, usize),
    offsets: &[isize],
    acc: &mut [f32],
    tile: impl Fn([usize; TILE_OC], [isize; TILE_ROWS]) -> [[f32; TILE_ROWS]; TILE_OC],
) {
    let rows = offsets.len();
    debug_assert_eq!(acc.len(), rows * oc);
    let mut o0 = 0;
    while o0 < oc {
        // A short last tile repeats a row it has: each sum depends on its own two runs only,
        // so the repeats' sums are dropped and the others are unchanged.
        let g: [usize; TILE_OC] = std::array::from_fn(|i| (o0 + i).min(oc - 1) * len);
        let mut r0 = 0;
        while r0 < rows {
            let x: [isize; TILE_ROWS] = std::array::from_fn(|t| offsets[(r0 + t).min(rows - 1)]);
            let sums = tile(g, x);
            for i in 0..TILE_OC.min(oc - o0) {
                for t in 0..TILE_ROWS.min(rows - r0) {
                    acc[(r0 + t) * oc + o0 + i] += sums[i][t];
                }
            }
            r0 += TILE_ROWS;
        }
        o0 += TILE_OC;
    }
}

/// The 4 x 4 dot products of gradient rows starting at `g` and grid runs at `x` (offsets within
/// a sample), over every sample of the batch.
#[target_feature(enable = "avx512f")]
unsafe fn tile(
    batch: &Batch,
    g: [usize; TILE_OC],
    x: [isize; TILE_ROWS],
) -> [[f32; TILE_ROWS]; TILE_OC] {
    let len = batch.len;
    let mut acc = [[_mm512_setzero_ps(); TILE_ROWS]; TILE_OC];
    let step = |acc: &mut [[__m512; TILE_ROWS]; TILE_OC],
                gs: *const f32,
                xs: *const f32,
                j: usize,
                mask: __mmask16| {
        let gv: [__m512; TILE_OC] =
            std::array::from_fn(|i| _mm512_maskz_loadu_ps(mask, gs.add(g[i] + j)));
        for t in 0..TILE_ROWS {
            let xv = _mm512_maskz_loadu_ps(mask, xs.offset(x[t] + j as isize));
            for i in 0..TILE_OC {
                acc[i][t] = _mm512_fmadd_ps(gv[i], xv, acc[i][t]);
            }
        }
    };
    for s in 0..batch.samples {
        let gs = batch.grad.as_ptr().add(s * batch.oc * len);
        let xs = batch.grid.as_ptr().add(s * batch.grid_len);
        for (group, &mask) in batch.positions.iter().enumerate() {
            step(&mut acc, gs, xs, 16 * group, mask);
        }
    }
    tile_sums(&acc)
}

/// [`tile`] for bfloat16 runs: 32 positions a step, each pair into one lane.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn tile_bf16(
    batch: &Batch<u16, __mmask32>,
    g: [usize; TILE_OC],
    x: [isize; TILE_ROWS],
) -> [[f32; TILE_ROWS]; TILE_OC] {
    let len = batch.len;
    let mut acc = [[_mm512_setzero_ps(); TILE_ROWS]; TILE_OC];
    let load = |at: *const u16, mask: __mmask32| -> __m512bh {
        std::mem::transmute(_mm512_maskz_loadu_epi16(mask, at as *const i16))
    };
    for s in 0..batch.samples {
        let gs = batch.grad.as_ptr().add(s * batch.oc * len);
        let xs = batch.grid.as_ptr().add(s * batch.grid_len);
        for (group, &mask) in batch.positions.iter().enumerate() {
            let j = 32 * group;
            let gv: [__m512bh; TILE_OC] = std::array::from_fn(|i| load(gs.add(g[i] + j), mask));
            for t in 0..TILE_ROWS {
                let xv = load(xs.offset(x[t] + j as isize), mask);
                for i in 0..TILE_OC {
                    acc[i][t] = _mm512_dpbf16_ps(acc[i][t], gv[i], xv);
                }
            }
        }
    }
    tile_sums(&acc)
}

/// A tile's running sums added lane by lane ([`lane_sums`]), sixteen vectors at a time.
#[target_feature(enable = "avx512f")]
fn tile_sums(acc: &[[__m512; TILE_ROWS]; TILE_OC]) -> [[f32; TILE_ROWS]; TILE_OC] {
    // The tile's sums sixteen at a time, the last group filled up with zeros.
    let mut sums = [0f32; TILE_SUMS.next_multiple_of(16)];
    for (k0, out) in (0..TILE_SUMS).step_by(16).zip(sums.chunks_mut(16)) {
        let group = std::array::from_fn(|k| match k0 + k {
            k if k < TILE_SUMS => acc[k / TILE_ROWS][k % TILE_ROWS],
            _ => _mm512_setzero_ps(),
        });
        out.copy_from_slice(&lane_sums(group));
    }
    std::array::from_fn(|i| std::array::from_fn(|t| sums[i * TILE_ROWS + t]))
}

/// The lane sums of 16 vectors, each added pairwise, halves first (lanes `l` and `l + 8`, then
/// `+ 4`, `+ 2`, `+ 1`), by one transposing tree: each level adds the halves of two vectors
/// into one, so 15 adds do what 16 separate reductions would in 60.
#[target_feature(enable = "avx512f")]
fn lane_sums(v: [__m512; 16]) -> [f32; 16] {
    // Each level's two shuffles put the lanes to be added of a pair of vectors side by side:
    // 256-bit halves (quarters 0-1 against 2-3), 128-bit quarters (0, 2 against 1, 3), then
    // within each quarter elements (0-1 against 2-3) and (0, 2 against 1, 3).
    let halves = |a, b| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    };
    let quarters = |a, b| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    let pairs = |a, b| {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    };
    let singles = |a, b| {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(a, b),
            _mm512_shuffle_ps::<0b11_01_11_01>(a, b),
        )
    };
    let w: [__m512; 8] = std::array::from_fn(|k| halves(v[2 * k], v[2 * k + 1]));
    let u: [__m512; 4] = std::array::from_fn(|k| quarters(w[2 * k], w[2 * k + 1]));
    let s: [__m512; 2] = std::array::from_fn(|k| pairs(u[2 * k], u[2 * k + 1]));
    let f = singles(s[0], s[1]);
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` holds 16 floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), f) };
    // The tree leaves vector k's sum in lane 4 * (k % 4) + k / 4.
    std::array::from_fn(|k| lanes[4 * (k % 4) + k / 4])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module's order for one element: 16 lane sums over every sample's runs `(g, x)`,
    /// then added pairwise, halves first.
    fn dot_model(runs: &[(&[f32], &[f32])]) -> f32 {
        let mut lanes = [0f32; 16];
        for (g, x) in runs {
            for (j, (&a, &b)) in g.iter().zip(*x).enumerate() {
                lanes[j % 16] = a.mul_add(b, lanes[j % 16]);
            }
        }
        let mut w = 16;
        while w > 1 {
            w /= 2;
            for l in 0..w {
                lanes[l] += lanes[l + w];
            }
        }
        lanes[0]
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        // Values with many significant bits, so a change of order changes the sums' bits.
        (0..n)
            .map(|i| {
                let v = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (v % 2001) as f32 / 1000.0 - 1.0 + 1.0 / 3.0
            })
            .collect()
    }

    /// Runs `accumulate` on `samples` samples of `oc` gradient rows and `rows` grid runs
    /// (run `r` at offset `3 r`), each `len` long, into an `acc` of 0.5s, and checks every
    /// element against the model.
    fn check(samples: usize, oc: usize, rows: usize, len: usize) {
        let grid_len = len + 3 * rows;
        let grad = values(samples * oc * len, 1);
        let grid = values(samples * grid_len, 2);
        let offsets: Vec<isize> = (0..rows).map(|r| (3 * r) as isize).collect();
        let batch = Batch {
            samples,
            len,
            grad: &grad,
            oc,
            grid: &grid,
            grid_len,
            offsets: &offsets,
            positions: &positions(len, |_| true),
        };
        let mut acc = vec![0.5f32; rows * oc];
        unsafe { accumulate(&batch, &mut acc) };
        for r in 0..rows {
            for o in 0..oc {
                let runs: Vec<(&[f32], &[f32])> = (0..samples)
                    .map(|s| {
                        let g = s * oc * len + o * len;
                        let x = s * grid_len + 3 * r;
                        (&grad[g..g + len], &grid[x..x + len])
                    })
                    .collect();
                let want = 0.5 + dot_model(&runs);
                assert_eq!(
                    acc[r * oc + o].to_bits(),
                    want.to_bits(),
                    "samples {samples} oc {oc} rows {rows} len {len}: element ({r}, {o})"
                );
            }
        }
    }

    #[test]
    fn every_element_is_its_dot_product_in_the_module_order() {
        if !available() {
            return;
        }
        // Output channels and rows that leave short tiles (5 = 4 + 1, 7 = 4 + 3), lengths
        // with and without a partial last group.
        for (oc, rows, len) in [
            (5, 7, 37),
            (4, 4, 32),
            (1, 1, 5),
            (9, 13, 200),
            (16, 18, 16),
        ] {
            check(1, oc, rows, len);
        }
    }

    /// [`dot_model`] for bfloat16 runs: lane `l` takes each pair `32i + 2l`, `32i + 2l + 1`,
    /// the odd position's exact product added first, each addition rounded to f32.
    fn dot_model_bf16(runs: &[(&[u16], &[u16])]) -> f32 {
        let f = |h: u16| f32::from_bits((h as u32) << 16);
        let mut lanes = [0f32; 16];
        for (g, x) in runs {
            for j in (0..g.len()).step_by(2) {
                let l = (j % 32) / 2;
                if j + 1 < g.len() {
                    lanes[l] += f(g[j + 1]) * f(x[j + 1]);
                }
                lanes[l] += f(g[j]) * f(x[j]);
            }
        }
        let mut w = 16;
        while w > 1 {
            w /= 2;
            for l in 0..w {
                lanes[l] += lanes[l + w];
            }
        }
        lanes[0]
    }

    #[test]
    fn a_bfloat16_element_is_its_pairs_dot_product_in_the_module_order() {
        if !bf16_available() {
            return;
        }
        // Magnitudes spread over 2^-12..2^12, so that an addition in another order rounds
        // differently (bf16 products of like magnitudes sum exactly in f32 in any order).
        let bf16 = |v: Vec<f32>| -> Vec<u16> {
            v.iter()
                .enumerate()
                .map(|(i, x)| {
                    let scaled = x * 2f32.powi((i * 7 % 25) as i32 - 12);
                    (scaled.to_bits() >> 16) as u16
                })
                .collect()
        };
        // Short tiles, odd lengths (a last pair of one position), a partial last group, two
        // samples, and a slack position holding an infinity in the grid.
        for (samples, oc, rows, len) in [(1, 5, 7, 37), (2, 4, 4, 64), (1, 1, 1, 5), (2, 9, 6, 71)]
        {
            let grid_len = len + 3 * rows;
            let grad = bf16(values(samples * oc * len, 1));
            let mut grid = bf16(values(samples * grid_len, 2));
            grid[len / 2] = 0x7f80;
            let slack = |j: usize| j == len / 2;
            let offsets: Vec<isize> = (0..rows).map(|r| (3 * r) as isize).collect();
            let batch = Batch {
                samples,
                len,
                grad: &grad,
                oc,
                grid: &grid,
                grid_len,
                offsets: &offsets,
                positions: &positions::<__mmask32>(len, |j| !slack(j)),
            };
            let mut acc = vec![0.5f32; rows * oc];
            unsafe { accumulate_bf16(&batch, &mut acc) };
            for r in 0..rows {
                for o in 0..oc {
                    let runs: Vec<(Vec<u16>, Vec<u16>)> = (0..samples)
                        .map(|s| {
                            let (g, x) = (s * oc * len + o * len, s * grid_len + 3 * r);
                            let keep = |v: &[u16]| -> Vec<u16> {
                                v.iter()
                                    .enumerate()
                                    .map(|(j, &b)| if slack(j) { 0 } else { b })
                                    .collect()
                            };
                            (keep(&grad[g..g + len]), keep(&grid[x..x + len]))
                        })
                        .collect();
                    let runs: Vec<(&[u16], &[u16])> =
                        runs.iter().map(|(g, x)| (&g[..], &x[..])).collect();
                    let want = 0.5 + dot_model_bf16(&runs);
                    assert_eq!(
                        acc[r * oc + o].to_bits(),
                        want.to_bits(),
                        "samples {samples} oc {oc} rows {rows} len {len}: element ({r}, {o})"
                    );
                }
            }
        }
    }

    #[test]
    fn a_batch_of_samples_is_summed_lane_by_lane_before_the_lanes_are_added() {
        if !available() {
            return;
        }
        for (samples, len) in [(3, 37), (2, 16), (5, 8)] {
            check(samples, 6, 5, len);
        }
    }

    #[test]
    fn a_position_that_is_not_an_output_position_adds_nothing_even_times_infinity() {
        if !available() {
            return;
        }
        // Positions 10 and 11 of 20 are slack (a row's padding): the gradient is zero there and
        // the input infinite; skipped, the sum is the other positions', not NaN.
        let len = 20;
        let grad: Vec<f32> = (0..len)
            .map(|j| if j == 10 || j == 11 { 0.0 } else { 1.0 })
            .collect();
        let mut grid = values(len, 5);
        grid[10] = f32::INFINITY;
        grid[11] = f32::NAN;
        let batch = Batch {
            samples: 1,
            len,
            grad: &grad,
            oc: 1,
            grid: &grid,
            grid_len: len,
            offsets: &[0],
            positions: &positions(len, |j| j != 10 && j != 11),
        };
        let mut acc = [0f32];
        unsafe { accumulate(&batch, &mut acc) };
        let (mut g, mut x) = (grad.clone(), grid.clone());
        for v in [&mut g, &mut x] {
            v[10] = 0.0;
            v[11] = 0.0;
        }
        assert_eq!(acc[0].to_bits(), dot_model(&[(&g, &x)]).to_bits());
    }

    #[test]
    fn nothing_past_a_run_s_end_is_read_into_a_sum() {
        if !available() {
            return;
        }
        // The floats past each run are NaN: a masked-off lane that read them would poison the sum.
        let len = 21;
        let mut grid = values(len, 3);
        grid.extend([f32::NAN; 16]);
        let mut grad = values(len, 4);
        grad.extend([f32::NAN; 16]);
        let batch = Batch {
            samples: 1,
            len,
            grad: &grad,
            oc: 1,
            grid: &grid,
            grid_len: len,
            offsets: &[0],
            positions: &positions(len, |_| true),
        };
        let mut acc = [0f32];
        unsafe { accumulate(&batch, &mut acc) };
        let want = dot_model(&[(&grad[..len], &grid[..len])]);
        assert_eq!(acc[0].to_bits(), want.to_bits());
    }
}
