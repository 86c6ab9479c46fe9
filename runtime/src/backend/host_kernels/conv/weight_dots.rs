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

/// One batch of samples, laid out as [`accumulate`] reads them.
pub(super) struct Batch<'a> {
    /// How many samples.
    pub samples: usize,
    /// Wide positions per sample: each dot product's length per sample.
    pub len: usize,
    /// The gradients over the wide positions: sample `s`'s row `o` at `grad[s * oc * len + o *
    /// len..]`.
    pub grad: &'a [f32],
    /// Output channels.
    pub oc: usize,
    /// The padded grids: sample `s`'s row `r` at `grid[s * grid_len + offsets[r]..]`.
    pub grid: &'a [f32],
    /// Floats of one sample's grid.
    pub grid_len: usize,
    /// Where each row `(c, tap)` of the columns starts in a sample's grid.
    pub offsets: &'a [isize],
    /// Which of the wide positions `16 g..16 g + 16` are output positions, one mask per group
    /// `g` of `len.div_ceil(16)` (see [`positions`]): the others (past a row's output size, or
    /// past `len`) are neither loaded nor summed, so an infinity or NaN of the input that only
    /// they would read stays out of every tap's sum, as on CPU.
    pub positions: &'a [__mmask16],
}

/// [`Batch::positions`] for `len` wide positions of which `is_output(j)` says which are output
/// positions.
pub(super) fn positions(len: usize, is_output: impl Fn(usize) -> bool) -> Vec<__mmask16> {
    (0..len.div_ceil(16))
        .map(|g| {
            (0..16)
                .filter(|&l| 16 * g + l < len && is_output(16 * g + l))
                .fold(0, |m, l| m | 1 << l)
        })
        .collect()
}

/// `acc[r * oc + o] += sum_s sum_j grad_s[o, j] * grid_s[offsets[r] + j]` over the batch's
/// samples `s` and positions `j < len`, every `o < oc` and row `r`, in the module's order.
///
/// # Safety
/// [`available`] holds; every sample's grid holds `len` floats at every offset; `batch.grad`
/// holds `samples * oc * len` floats; `acc` has `offsets.len() * oc` elements.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn accumulate(batch: &Batch, acc: &mut [f32]) {
    let (oc, rows, len) = (batch.oc, batch.offsets.len(), batch.len);
    debug_assert_eq!(acc.len(), rows * oc);
    debug_assert!(batch.grad.len() >= batch.samples * oc * len);
    let mut o0 = 0;
    while o0 < oc {
        // A short last tile repeats a row it has: each sum depends on its own two runs only,
        // so the repeats' sums are dropped and the others are unchanged.
        let g: [usize; TILE_OC] = std::array::from_fn(|i| (o0 + i).min(oc - 1) * len);
        let mut r0 = 0;
        while r0 < rows {
            let x: [isize; TILE_ROWS] =
                std::array::from_fn(|t| batch.offsets[(r0 + t).min(rows - 1)]);
            let sums = tile(batch, g, x);
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
