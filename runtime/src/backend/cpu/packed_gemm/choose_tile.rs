//! Which register tile `packed_gemm` runs a product on: the 16-lane one (`Wide`, 12x32) or the
//! 8-lane one (`Narrow`, 6x16). Both give the same bits, so this is a question of speed only.
//!
//! AVX-512 alone does not say the 16-lane tile is faster. On a core that executes 512-bit
//! operations at full width (the Xeon of `packed_gemm_avx512`'s module doc) it ran products
//! 1.35-1.45x faster; on Zen 4, which splits each into two 256-bit halves, the 8-lane tile was
//! as fast or faster wherever B is packed (one thread, best of 7: `[1024, 128] @ [128, 512]`
//! 1,332 -> 1,249 us, `[2048, 2048] @ [2048, 2048]` 175 -> 168 ms, `[200, 300] @ [300, 100]`
//! 148 -> 124 us), and nanoGPT, MobileNetV2 and resnet18 steps ran 2-6% faster on it. So the
//! core is asked once, by timing both tiles on one packed product ([`calibrated_wide`]).
//!
//! Three shapes do not follow the calibration:
//! - B with at most 16 columns runs the 8-lane tile: the 16-lane tile's 32-wide panel would be
//!   half zeros (`[144, 448] @ [448, 16]` 39 -> 19 us on Zen 4, where a convolution's weight
//!   gradient with 16 output channels made it; that one now runs as dot products,
//!   `host_kernels::conv::weight_dots`);
//! - a plain B read in place (few rows: `pack_b::reads_in_place`) runs the 16-lane tile: its
//!   12-row tiles read each panel fewer times, and the 8-lane tile was slower there (`[16, 144]
//!   @ [144, 448]` 22.1 vs 20.3 us, `[32, 288] @ [288, 1024]` 256 vs 188: rows 4 KiB apart);
//! - so does a transposed A read in place (`pack_a::packs_rows` false) with k of 128 or more:
//!   each k's twelve row values are adjacent, one line for twelve broadcasts where the 8-lane
//!   tile's six use half of one (`[4608, 512] @ [512, 32]` 106 against 84 GFLOP/s, `[1024,
//!   1024] @ [1024, 128]` 104 against 84, `[1152, 128] @ [128, 512]` 101 against 85). With
//!   fewer k the 8-lane tile was faster (`[512, 32] @ [32, 4608]` 83 against 72, `[256, 64] @
//!   [64, 2304]` 99 against 89: a weight gradient over few positions).

use super::pack_a::packs_rows;
use super::pack_b::reads_in_place;
use std::sync::OnceLock;
use std::time::Instant;

/// Whether the 16-lane tile runs a product of shape `(m, k, n)` whose A has strides `(rsa,
/// csa)` and B column stride `csb`, on a core with AVX-512 (see the module doc); `wide_mc` is
/// its row block.
pub(super) fn runs_wide(
    (m, k, n): (usize, usize, usize),
    (rsa, csa): (isize, isize),
    csb: isize,
    wide_mc: usize,
) -> bool {
    if n <= 16 {
        return false;
    }
    let a_transposed_in_place = rsa == 1 && csa != 1 && !packs_rows(rsa, csa) && k >= 128;
    reads_in_place(m, csb, wide_mc) || a_transposed_in_place || calibrated_wide()
}

/// The calibration's answer, measured on first use: whether the 16-lane tile ran a packed
/// product faster than the 8-lane one on this core.
fn calibrated_wide() -> bool {
    static WIDE: OnceLock<bool> = OnceLock::new();
    *WIDE.get_or_init(|| {
        let (wide, narrow) = time_both_tiles();
        let choice = wide < narrow;
        tracing::info!(
            wide_us = wide * 1e6,
            narrow_us = narrow * 1e6,
            tile = if choice { "16-lane" } else { "8-lane" },
            "GEMM register tile chosen"
        );
        choice
    })
}

/// The best of five timings of each tile on `[192, 128] @ [128, 384]` (B packed: more rows
/// than a row block; k = 128 as in a d-128 model's layers, where Zen 4 told the tiles apart
/// most: at k = 256 they tied), the tiles taking turns so that a burst of load hits both;
/// about 2 ms in all.
fn time_both_tiles() -> (f64, f64) {
    let (m, k, n) = (192, 128, 384);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.25).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let mut c = vec![0f32; m * n];
    let mut best = [f64::MAX; 2];
    for _ in 0..5 {
        for (slot, wide) in [(0, true), (1, false)] {
            let start = Instant::now();
            // SAFETY: the operands are dense row-major matrices of the shape given, C apart
            // from both; the caller asked only on a core with AVX-512.
            unsafe {
                super::sgemm_on(
                    wide,
                    (m, k, n),
                    (a.as_ptr(), k as isize, 1),
                    (b.as_ptr(), n as isize, 1),
                    0.0,
                    (c.as_mut_ptr(), n as isize, 1),
                );
            }
            best[slot] = best[slot].min(start.elapsed().as_secs_f64());
        }
    }
    (best[0], best[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_product_of_at_most_16_columns_runs_the_8_lane_tile() {
        for (m, n, csb) in [(144, 16, 1), (16, 16, 1), (1024, 8, 448), (96, 1, 1)] {
            assert!(
                !runs_wide((m, 512, n), (1, m as isize), csb, 96),
                "m {m} n {n} csb {csb}"
            );
        }
    }

    #[test]
    fn a_plain_b_read_in_place_runs_the_16_lane_tile() {
        for (m, n) in [(16, 448), (96, 4096), (12, 17)] {
            assert!(runs_wide((m, 64, n), (512, 1), 1, 96), "m {m} n {n}");
        }
    }

    #[test]
    fn a_transposed_a_read_in_place_with_k_of_128_or_more_runs_the_16_lane_tile() {
        for (m, k, n) in [(4608, 512, 32), (1024, 1024, 128), (200, 128, 17)] {
            assert!(
                runs_wide((m, k, n), (1, m as isize), 128, 96),
                "{m} {k} {n}"
            );
        }
    }

    #[test]
    fn the_calibration_runs_both_tiles_on_a_packed_product() {
        if !crate::backend::cpu::packed_gemm_avx512::has_avx512() {
            return;
        }
        let (wide, narrow) = time_both_tiles();
        assert!(wide > 0.0 && wide < 1.0 && narrow > 0.0 && narrow < 1.0);
    }
}
