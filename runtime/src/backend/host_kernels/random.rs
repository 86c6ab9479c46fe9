//! Random numbers from a counter-based generator, Philox4x32-10 (as PyTorch's CUDA generator
//! uses): element e's value is a pure function of (seed, offset, e), so results are the same
//! bits in every mode, on every thread count and backend, and reproducible.
//!
//! The key is the seed (low word, high word). Element e reads block `e / k` (counter words 0-1)
//! at stream position `offset` (counter words 2-3), lane `e % k`, where one block of four
//! 32-bit words serves k = 4 elements of f32, f16 and bf16 or k = 2 of f64. Uniform values take
//! a lane's top bits (24 for f32, 11 for f16, 8 for bf16, 53 from two words for f64), so they
//! are exact and in [0, 1). Normal values are Box-Muller on the block's pairs of uniforms
//! (computed in f64, then rounded), the cosine branch for the pair's first element, the sine
//! branch for its second.

use super::elem::write_f64;
use super::{for_each_row, View};
use deferfuse_fusion::ir::{DType, RandomDist};

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// One Philox4x32 block: ten rounds of `counter` under `key` (Random123's `philox4x32`).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 as u64 * c[0] as u64;
        let p1 = M1 as u64 * c[2] as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// A uniform value in [0, 1) of `dtype` from one word (the top bits the dtype can hold).
fn uniform32(dtype: DType, w: u32) -> f64 {
    match dtype {
        DType::F16 => (w >> 21) as f64 * (1.0 / 2048.0),
        DType::BF16 => (w >> 24) as f64 * (1.0 / 256.0),
        _ => (w >> 8) as f64 * (1.0 / 16_777_216.0),
    }
}

/// A uniform f64 in [0, 1) from two words (their top 53 bits).
fn uniform64(hi: u32, lo: u32) -> f64 {
    (((hi as u64) << 32 | lo as u64) >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// The two standard normal values Box-Muller makes of uniforms `u1`, `u2` in [0, 1).
fn box_muller(u1: f64, u2: f64) -> [f64; 2] {
    // 1 - u1 is in (0, 1]: the logarithm stays finite.
    let r = (-2.0 * (1.0 - u1).ln()).sqrt();
    let t = 2.0 * std::f64::consts::PI * u2;
    [r * t.cos(), r * t.sin()]
}

/// The values of one block for `dtype`: 4 for f32, f16 and bf16, 2 for f64.
fn block_values(dist: RandomDist, dtype: DType, w: [u32; 4]) -> [f64; 4] {
    match (dist, dtype) {
        (RandomDist::Uniform, DType::F64) => {
            [uniform64(w[0], w[1]), uniform64(w[2], w[3]), 0.0, 0.0]
        }
        (RandomDist::Normal, DType::F64) => {
            let [a, b] = box_muller(uniform64(w[0], w[1]), uniform64(w[2], w[3]));
            [a, b, 0.0, 0.0]
        }
        (RandomDist::Uniform, d) => w.map(|x| uniform32(d, x)),
        (RandomDist::Normal, _) => {
            let u = w.map(|x| uniform32(DType::F32, x));
            let [a, b] = box_muller(u[0], u[1]);
            let [c, d] = box_muller(u[2], u[3]);
            [a, b, c, d]
        }
    }
}

/// Fills `out` (a float dtype) in row-major element order.
pub(super) fn run(dist: RandomDist, seed: u64, offset: u64, out: &View) {
    let dtype = out.dtype;
    let key = [seed as u32, (seed >> 32) as u32];
    // Elements one block serves (see `block_values`).
    let per: u64 = if dtype == DType::F64 { 2 } else { 4 };
    let last = out.sizes.len() - 1;
    let n = out.sizes[last] as isize;
    let mut e: u64 = 0;
    let mut cached: Option<(u64, [f64; 4])> = None;
    for_each_row(&out.sizes, last, &[out], |_, o| {
        for j in 0..n {
            let (block, lane) = (e / per, (e % per) as usize);
            let values = match cached {
                Some((b, v)) if b == block => v,
                _ => {
                    let ctr = [
                        block as u32,
                        (block >> 32) as u32,
                        offset as u32,
                        (offset >> 32) as u32,
                    ];
                    let v = block_values(dist, dtype, philox4x32_10(ctr, key));
                    cached = Some((block, v));
                    v
                }
            };
            // SAFETY: the output view lies inside its buffer.
            unsafe { write_f64(dtype, out.base, o[0] + j * out.strides[last], values[lane]) };
            e += 1;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_random123_known_answer() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
    }

    #[test]
    fn uniform_values_stay_below_one() {
        for d in [DType::F32, DType::F16, DType::BF16] {
            assert!(uniform32(d, u32::MAX) < 1.0);
        }
        assert!(uniform64(u32::MAX, u32::MAX) < 1.0);
    }
}
